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
//   NOT_FOUND         404  invalid_request_error / model_not_found|not_found not_found_error
//   PAYLOAD_TOO_LARGE 413  invalid_request_error / request_too_large       request_too_large
//   INVALID_OUTPUT    422  invalid_request_error / invalid_json_output     invalid_request_error
//   OVERLOADED        503  server_error / overloaded                      overloaded_error
//   INTERNAL          500  server_error / -                               api_error
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4::server {

enum class ErrorShape { OPENAI, ANTHROPIC };

enum class ApiErrorKind {
  INVALID_REQUEST,
  CONTEXT_LENGTH,
  AUTHENTICATION,
  NOT_FOUND,
  PAYLOAD_TOO_LARGE,
  INVALID_OUTPUT,
  OVERLOADED,
  INTERNAL,
};

struct ApiError {
  ApiErrorKind kind = ApiErrorKind::INVALID_REQUEST;
  std::string message;
  std::string param;  // the offending request field, when known
  std::string code;   // OpenAI `code` override ("" = the kind's default)

  int status() const;
};

ApiError invalid_request(std::string message, std::string param = "");
// A parse error of the typed layers (chat messages, JSON) as a 400.
ApiError invalid_request(const Error& e);
ApiError internal_error(std::string message);

nlohmann::ordered_json error_json(const ApiError& e, ErrorShape shape);

}  // namespace dsv4::server
