// Error handling for input, file and user errors (design.md §6).
//
// `expected<T>` is a small C++20 stand-in for C++23 std::expected<T, Error>:
// a function that can fail on bad input returns either a value or an Error
// carrying an actionable message. Programmer invariants use DSV4_ASSERT
// (core/assert.h) instead; exceptions never cross a layer boundary.
#pragma once

#include <cstdarg>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/assert.h"

namespace dsv4 {

// printf-style formatting into a std::string.
[[gnu::format(printf, 1, 2)]] std::string strfmt(const char* fmt, ...);
std::string vstrfmt(const char* fmt, va_list ap);

struct Error {
  std::string message;

  // Prepends context: "reading x.gguf: " + message.
  Error with_context(const std::string& context) const { return Error{context + ": " + message}; }
};

[[gnu::format(printf, 1, 2)]] Error make_error(const char* fmt, ...);

template <class E>
class unexpected {
 public:
  explicit unexpected(E e) : error_(std::move(e)) {}
  E& error() & { return error_; }
  E&& error() && { return std::move(error_); }

 private:
  E error_;
};

template <class T, class E = Error>
class [[nodiscard]] expected {
 public:
  expected() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  expected(const T& v) : v_(std::in_place_index<0>, v) {}        // NOLINT(implicit)
  expected(T&& v) : v_(std::in_place_index<0>, std::move(v)) {}  // NOLINT(implicit)
  template <class G>
  expected(unexpected<G> u) : v_(std::in_place_index<1>, E(std::move(u).error())) {}             // NOLINT
  expected(const Error& e) requires std::is_same_v<E, Error> : v_(std::in_place_index<1>, e) {}  // NOLINT(implicit)
  expected(Error&& e) requires std::is_same_v<E, Error> : v_(std::in_place_index<1>, std::move(e)) {
  }  // NOLINT(implicit)

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }

  T& value() & {
    DSV4_ASSERT(has_value(), "expected::value() on error: %s", std::get<1>(v_).message.c_str());
    return std::get<0>(v_);
  }
  const T& value() const& {
    DSV4_ASSERT(has_value(), "expected::value() on error: %s", std::get<1>(v_).message.c_str());
    return std::get<0>(v_);
  }
  T&& value() && {
    DSV4_ASSERT(has_value(), "expected::value() on error: %s", std::get<1>(v_).message.c_str());
    return std::get<0>(std::move(v_));
  }
  const E& error() const {
    DSV4_ASSERT(!has_value(), "expected::error() on a value");
    return std::get<1>(v_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, E> v_;
};

// expected<void>: success or an Error.
template <class E>
class [[nodiscard]] expected<void, E> {
 public:
  expected() = default;
  template <class G>
  expected(unexpected<G> u) : err_(E(std::move(u).error())), ok_(false) {}                   // NOLINT
  expected(const Error& e) requires std::is_same_v<E, Error> : err_(e), ok_(false) {}        // NOLINT(implicit)
  expected(Error&& e) requires std::is_same_v<E, Error> : err_(std::move(e)), ok_(false) {}  // NOLINT(implicit)

  bool has_value() const { return ok_; }
  explicit operator bool() const { return ok_; }
  void value() const { DSV4_ASSERT(ok_, "expected<void>::value() on error: %s", err_.message.c_str()); }
  const E& error() const {
    DSV4_ASSERT(!ok_, "expected::error() on a value");
    return err_;
  }

 private:
  E err_{};
  bool ok_ = true;
};

using Status = expected<void>;

}  // namespace dsv4

#define DSV4_CONCAT_INNER(a, b) a##b
#define DSV4_CONCAT(a, b) DSV4_CONCAT_INNER(a, b)

// DSV4_TRY(status_expr): return the error if the Status/expected failed.
#define DSV4_TRY(expr)                                        \
  do {                                                        \
    auto&& dsv4_try_r_ = (expr);                              \
    if (!dsv4_try_r_.has_value()) return dsv4_try_r_.error(); \
  } while (0)

// DSV4_TRY_ASSIGN(lhs, expected_expr): lhs = value or return the error.
#define DSV4_TRY_ASSIGN(lhs, expr) DSV4_TRY_ASSIGN_IMPL(DSV4_CONCAT(dsv4_try_v_, __LINE__), lhs, expr)
#define DSV4_TRY_ASSIGN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                         \
  if (!tmp.has_value()) return tmp.error();  \
  lhs = std::move(tmp).value()
