#include "run_interrupt.h"

#include <unistd.h>

#include <csignal>

namespace dsv4::tools {

namespace {

volatile std::sig_atomic_t g_pending = 0;
volatile std::sig_atomic_t g_generating = 0;

void on_sigint(int) {
  if (g_generating && g_pending) {
    // Only async-signal-safe calls here: write(2) and _exit(2).
    static const char msg[] = "\ndsv4 run: second Ctrl-C, exiting\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
    ::_exit(130);
  }
  g_pending = 1;
}

}  // namespace

void interrupt_install() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: interrupted poll()/read() return EINTR
  ::sigaction(SIGINT, &sa, nullptr);
}

bool interrupt_pending() { return g_pending != 0; }
void interrupt_clear() { g_pending = 0; }
void interrupt_set_generating(bool generating) { g_generating = generating ? 1 : 0; }

}  // namespace dsv4::tools
