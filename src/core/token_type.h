// tokenizer.ggml.token_type values (llama.cpp convention), shared by the
// tokenizer and the synthetic-vocabulary writer.
#pragma once

#include <cstdint>

namespace dsv4 {

enum class TokenType : int32_t {
  UNDEFINED = 0,
  NORMAL = 1,
  UNKNOWN = 2,
  CONTROL = 3,
  USER_DEFINED = 4,
  UNUSED = 5,
  BYTE = 6,
};

}  // namespace dsv4
