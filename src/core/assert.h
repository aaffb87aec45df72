// Programmer-invariant checks. A failed DSV4_ASSERT is a bug in dsv4, never a
// reaction to bad input: it prints file:line and the message, then aborts.
#pragma once

namespace dsv4 {
[[noreturn, gnu::format(printf, 4, 5)]] void assert_fail(const char* file, int line, const char* cond, const char* fmt,
                                                         ...);
[[noreturn]] void assert_fail(const char* file, int line, const char* cond);
}  // namespace dsv4

#define DSV4_ASSERT(cond, ...)                                                                                   \
  do {                                                                                                           \
    if (__builtin_expect(!(cond), 0)) ::dsv4::assert_fail(__FILE__, __LINE__, #cond __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

#define DSV4_UNREACHABLE() ::dsv4::assert_fail(__FILE__, __LINE__, "unreachable")
