#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

namespace dsv4 {
namespace {
std::atomic<LogLevel> g_level{LogLevel::INFO};
std::mutex g_mutex;

// One message is one line: control characters (CR, LF, ESC, ...) that a
// formatted argument may carry (request paths, model names, error texts
// quoting client input) are written as \xNN, so no input can forge a log
// line or send terminal escapes.
std::string escape_controls(const char* s, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      static constexpr char k_hex[] = "0123456789abcdef";
      out += "\\x";
      out += k_hex[c >> 4];
      out += k_hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void vlog(LogLevel level, const char* tag, const char* fmt, va_list ap) {
  if (level < g_level.load(std::memory_order_relaxed)) return;
  char small[512];
  va_list copy;
  va_copy(copy, ap);
  const int n = std::vsnprintf(small, sizeof small, fmt, copy);
  va_end(copy);
  if (n < 0) return;
  std::string text;
  if (static_cast<size_t>(n) < sizeof small) {
    text = escape_controls(small, static_cast<size_t>(n));
  } else {
    std::vector<char> big(static_cast<size_t>(n) + 1);
    std::vsnprintf(big.data(), big.size(), fmt, ap);
    text = escape_controls(big.data(), static_cast<size_t>(n));
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "dsv4: %s%s\n", tag, text.c_str());
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
