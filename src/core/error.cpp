#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace dsv4 {

std::string vstrfmt(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  char buf[512];
  int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  std::string out;
  if (n < 0) {
    out = fmt;
  } else if (static_cast<size_t>(n) < sizeof buf) {
    out.assign(buf, static_cast<size_t>(n));
  } else {
    out.resize(static_cast<size_t>(n));
    std::vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  }
  va_end(ap2);
  return out;
}

std::string strfmt(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vstrfmt(fmt, ap);
  va_end(ap);
  return s;
}

Error make_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  Error e{vstrfmt(fmt, ap)};
  va_end(ap);
  return e;
}

void assert_fail(const char* file, int line, const char* cond, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string msg = vstrfmt(fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "dsv4: assertion failed at %s:%d: %s: %s\n", file, line, cond, msg.c_str());
  std::fflush(stderr);
  std::abort();
}

void assert_fail(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "dsv4: assertion failed at %s:%d: %s\n", file, line, cond);
  std::fflush(stderr);
  std::abort();
}

}  // namespace dsv4
