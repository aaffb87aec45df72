#include "server/api_error.h"

namespace dsv4::server {

using ordered_json = nlohmann::ordered_json;

int ApiError::status() const {
  if (http_status != 0) return http_status;
  switch (kind) {
    case ApiErrorKind::INVALID_REQUEST: return 400;
    case ApiErrorKind::CONTEXT_LENGTH: return 400;
    case ApiErrorKind::AUTHENTICATION: return 401;
    case ApiErrorKind::PERMISSION: return 403;
    case ApiErrorKind::NOT_FOUND: return 404;
    case ApiErrorKind::REQUEST_TIMEOUT: return 408;
    case ApiErrorKind::PAYLOAD_TOO_LARGE: return 413;
    case ApiErrorKind::UNSUPPORTED_MEDIA: return 415;
    case ApiErrorKind::RATE_LIMITED: return 429;
    case ApiErrorKind::INVALID_OUTPUT: return 422;
    case ApiErrorKind::OVERLOADED: return 503;
    case ApiErrorKind::INTERNAL: return 500;
  }
  DSV4_UNREACHABLE();
}

ApiError invalid_request(std::string message, std::string param) {
  return ApiError{ApiErrorKind::INVALID_REQUEST, std::move(message), std::move(param), ""};
}

ApiError invalid_request(const Error& e) { return invalid_request(e.message); }

ApiError api_error(const runtime::RuntimeError& e) {
  switch (e.kind) {
    case runtime::RuntimeErrorKind::INVALID_REQUEST:
      return ApiError{ApiErrorKind::INVALID_REQUEST, e.message, e.param, ""};
    case runtime::RuntimeErrorKind::CONTEXT_LENGTH:
      return ApiError{ApiErrorKind::CONTEXT_LENGTH, e.message, e.param, ""};
    case runtime::RuntimeErrorKind::INTERNAL: break;
  }
  return ApiError{ApiErrorKind::INTERNAL, e.message, e.param, ""};
}

ApiError internal_error(std::string message) { return ApiError{ApiErrorKind::INTERNAL, std::move(message), "", ""}; }

namespace {

const char* openai_type(ApiErrorKind k) {
  switch (k) {
    case ApiErrorKind::INVALID_REQUEST:
    case ApiErrorKind::CONTEXT_LENGTH:
    case ApiErrorKind::AUTHENTICATION:
    case ApiErrorKind::PERMISSION:
    case ApiErrorKind::NOT_FOUND:
    case ApiErrorKind::REQUEST_TIMEOUT:
    case ApiErrorKind::PAYLOAD_TOO_LARGE:
    case ApiErrorKind::UNSUPPORTED_MEDIA:
    case ApiErrorKind::INVALID_OUTPUT: return "invalid_request_error";
    case ApiErrorKind::RATE_LIMITED: return "rate_limit_error";
    case ApiErrorKind::OVERLOADED:
    case ApiErrorKind::INTERNAL: return "server_error";
  }
  DSV4_UNREACHABLE();
}

const char* openai_code(ApiErrorKind k) {
  switch (k) {
    case ApiErrorKind::INVALID_REQUEST:
    case ApiErrorKind::INTERNAL: return nullptr;
    case ApiErrorKind::CONTEXT_LENGTH: return "context_length_exceeded";
    case ApiErrorKind::AUTHENTICATION: return "invalid_api_key";
    case ApiErrorKind::PERMISSION: return "permission_denied";
    case ApiErrorKind::NOT_FOUND: return "not_found";
    case ApiErrorKind::REQUEST_TIMEOUT: return "request_timeout";
    case ApiErrorKind::PAYLOAD_TOO_LARGE: return "request_too_large";
    case ApiErrorKind::UNSUPPORTED_MEDIA: return "unsupported_media_type";
    case ApiErrorKind::RATE_LIMITED: return "rate_limit_exceeded";
    case ApiErrorKind::INVALID_OUTPUT: return "invalid_json_output";
    case ApiErrorKind::OVERLOADED: return "overloaded";
  }
  DSV4_UNREACHABLE();
}

const char* anthropic_type(ApiErrorKind k) {
  switch (k) {
    case ApiErrorKind::INVALID_REQUEST:
    case ApiErrorKind::CONTEXT_LENGTH:
    case ApiErrorKind::REQUEST_TIMEOUT:
    case ApiErrorKind::UNSUPPORTED_MEDIA:
    case ApiErrorKind::INVALID_OUTPUT: return "invalid_request_error";
    case ApiErrorKind::AUTHENTICATION: return "authentication_error";
    case ApiErrorKind::PERMISSION: return "permission_error";
    case ApiErrorKind::NOT_FOUND: return "not_found_error";
    case ApiErrorKind::RATE_LIMITED: return "rate_limit_error";
    case ApiErrorKind::PAYLOAD_TOO_LARGE: return "request_too_large";
    case ApiErrorKind::OVERLOADED: return "overloaded_error";
    case ApiErrorKind::INTERNAL: return "api_error";
  }
  DSV4_UNREACHABLE();
}

}  // namespace

ordered_json error_json(const ApiError& e, ErrorShape shape) {
  switch (shape) {
    case ErrorShape::OPENAI: {
      ordered_json err = ordered_json::object();
      err["message"] = e.message;
      err["type"] = openai_type(e.kind);
      err["param"] = e.param.empty() ? ordered_json(nullptr) : ordered_json(e.param);
      if (!e.code.empty())
        err["code"] = e.code;
      else if (const char* c = openai_code(e.kind))
        err["code"] = c;
      else
        err["code"] = nullptr;
      return ordered_json{{"error", std::move(err)}};
    }
    case ErrorShape::ANTHROPIC:
      return ordered_json{{"type", "error"},
                          {"error", ordered_json{{"type", anthropic_type(e.kind)}, {"message", e.message}}}};
  }
  DSV4_UNREACHABLE();
}

}  // namespace dsv4::server
