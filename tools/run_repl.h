// The interactive chat of `dsv4 run` (no prompt given, stdin a terminal):
// multi-turn with history, GNU readline line editing (arrows, Home/End,
// Ctrl-A/E/K/U/W, history with up/down and Ctrl-R, Tab completes /commands
// and file names after /save and /load), and the commands
//
//   /think  /think-max  /nothink   switch the thinking level for the next replies
//   /reset                         forget the conversation (keeps the system prompt)
//   /save FILE  /load FILE         conversation + session state (conversation_file.h)
//   /help                          the command list
//   /exit  /quit  (or Ctrl-D)      leave
//
// A line ending in a backslash continues on the next line; a line starting
// with "//" sends the rest with one leading "/" as an ordinary message.
// Ctrl-C stops the reply being generated, or clears the line at the prompt.
#pragma once

#include "run_chat.h"

namespace dsv4::tools {

// Runs until /exit or end of input; returns the process exit status.
int run_repl(ChatSession& chat, const RunSettings& settings);

// The /help text (also printed by `dsv4 run --help`'s footer).
const char* repl_help_text();

}  // namespace dsv4::tools
