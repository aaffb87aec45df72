// Why the runtime refused or failed a request, independent of any wire
// protocol: server/ maps a kind to an HTTP status and each dialect's error
// body (server/api_error.h), `dsv4 run` prints the message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace dsv4::runtime {

enum class RuntimeErrorKind {
  INVALID_REQUEST,  // the request cannot be run as given (a message that does not render, ...)
  CONTEXT_LENGTH,   // the prompt does not fit the session's context
  INTERNAL,         // the engine failed (out of memory, a backend error, ...)
};

struct RuntimeError {
  RuntimeErrorKind kind = RuntimeErrorKind::INTERNAL;
  std::string message;
  std::string param;  // the request field it is about ("messages", "prompt"), when known
};

inline RuntimeError runtime_error(RuntimeErrorKind kind, const Error& e, std::string param = "") {
  return RuntimeError{kind, e.message, std::move(param)};
}

// "This model's maximum context length is N tokens. However, your messages
// resulted in M tokens. ..."; `tokens` 0: tokenising stopped past the context
// ("more than N tokens"). `field` is "prompt" (a raw completion) or "messages".
RuntimeError context_length_error(uint32_t ctx, const std::string& field, size_t tokens);

}  // namespace dsv4::runtime
