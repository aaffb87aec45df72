// Ctrl-C in `dsv4 run`: SIGINT stops the reply being generated (the
// generation loop polls interrupt_pending() between tokens and prefill
// batches), not the program. At the interactive prompt it clears the line.
// A second Ctrl-C while a reply is still stopping (e.g. inside a long prefill
// batch) ends the program with status 130.
#pragma once

namespace dsv4::tools {

// Installs the SIGINT handler (without SA_RESTART, so a blocking poll/read
// returns EINTR and the caller notices).
void interrupt_install();
// A Ctrl-C arrived since the last interrupt_clear().
bool interrupt_pending();
void interrupt_clear();
// Marks the span in which a second Ctrl-C ends the program.
void interrupt_set_generating(bool generating);

}  // namespace dsv4::tools
