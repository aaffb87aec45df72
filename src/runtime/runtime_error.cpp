#include "runtime/runtime_error.h"

namespace dsv4::runtime {

RuntimeError context_length_error(uint32_t ctx, const std::string& field, size_t tokens) {
  const std::string counted = tokens > 0 ? strfmt("%zu tokens", tokens) : strfmt("more than %u tokens", ctx);
  const char* what = field == "prompt" ? "prompt" : "messages";
  return RuntimeError{RuntimeErrorKind::CONTEXT_LENGTH,
                      strfmt("This model's maximum context length is %u tokens. However, your %s resulted in %s. "
                             "Please reduce the length of the %s.",
                             ctx, what, counted.c_str(), what),
                      field};
}

}  // namespace dsv4::runtime
