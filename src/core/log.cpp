#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>

namespace dsv4 {
namespace {
std::atomic<LogLevel> g_level{LogLevel::INFO};
std::mutex g_mutex;

void vlog(LogLevel level, const char* tag, const char* fmt, va_list ap) {
  if (level < g_level.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "dsv4: %s", tag);
  std::vfprintf(stderr, fmt, ap);
  std::fputc('\n', stderr);
}
}  // namespace

void log_set_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(); }

#define DSV4_LOG_FN(name, level, tag) \
  void name(const char* fmt, ...) {   \
    va_list ap;                       \
    va_start(ap, fmt);                \
    vlog(level, tag, fmt, ap);        \
    va_end(ap);                       \
  }
DSV4_LOG_FN(log_debug, LogLevel::DEBUG, "debug: ")
DSV4_LOG_FN(log_info, LogLevel::INFO, "")
DSV4_LOG_FN(log_warn, LogLevel::WARN, "warning: ")
DSV4_LOG_FN(log_error, LogLevel::ERROR, "error: ")
#undef DSV4_LOG_FN

}  // namespace dsv4
