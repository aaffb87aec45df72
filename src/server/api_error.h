// The errors the server answers with, and their JSON body in each dialect.
//
// OpenAI (chat, completions, responses, models):
//   {"error": {"message": "...", "type": "invalid_request_error", "param": null|"x", "code": null|"..."}}
// Anthropic (/v1/messages, /v1/messages/count_tokens):
//   {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
//
// kind → HTTP status, OpenAI type/code, Anthropic type:
//   INVALID_REQUEST   400  invalid_request_error / -                       invalid_request_error
//   CONTEXT_LENGTH    400  invalid_request_error / context_length_exceeded invalid_request_error
//   AUTHENTICATION    401  invalid_request_error / invalid_api_key         authentication_error
//   PERMISSION        403  invalid_request_error / permission_denied       permission_error
//   NOT_FOUND         404  invalid_request_error / model_not_found|not_found not_found_error
//   REQUEST_TIMEOUT   408  invalid_request_error / request_timeout         invalid_request_error
//   PAYLOAD_TOO_LARGE 413  invalid_request_error / request_too_large       request_too_large
//   UNSUPPORTED_MEDIA 415  invalid_request_error / unsupported_media_type  invalid_request_error
//   RATE_LIMITED      429  rate_limit_error / rate_limit_exceeded           rate_limit_error
//   INVALID_OUTPUT    422  invalid_request_error / invalid_json_output     invalid_request_error
//   OVERLOADED        503  server_error / overloaded                      overloaded_error
//   INTERNAL          500  server_error / -                               api_error
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/runtime_error.h"

namespace dsv4::server {

enum class ErrorShape { OPENAI, ANTHROPIC };

enum class ApiErrorKind {
  INVALID_REQUEST,
  CONTEXT_LENGTH,
  AUTHENTICATION,
  PERMISSION,
  NOT_FOUND,
  REQUEST_TIMEOUT,
  PAYLOAD_TOO_LARGE,
  UNSUPPORTED_MEDIA,
  RATE_LIMITED,
  INVALID_OUTPUT,
  OVERLOADED,
  INTERNAL,
};

struct ApiError {
  ApiErrorKind kind = ApiErrorKind::INVALID_REQUEST;
  std::string message;
  std::string param;    // the offending request field, when known
  std::string code;     // OpenAI `code` override ("" = the kind's default)
  int http_status = 0;  // overrides the kind's status (the transport's 417, 431, 501, 505)

  int status() const;
};

ApiError invalid_request(std::string message, std::string param = "");
// A parse error of the typed layers (chat messages, JSON) as a 400.
ApiError invalid_request(const Error& e);
ApiError internal_error(std::string message);
// A runtime error in API terms: INVALID_REQUEST 400, CONTEXT_LENGTH 400
// (context_length_exceeded), INTERNAL 500; the param is kept.
ApiError api_error(const runtime::RuntimeError& e);

nlohmann::ordered_json error_json(const ApiError& e, ErrorShape shape);

}  // namespace dsv4::server
