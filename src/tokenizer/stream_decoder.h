// Turning token bytes into display text.
//
// A token's bytes (Tokenizer::token_bytes) may end in the middle of a UTF-8
// character, and a model can emit byte sequences that are not UTF-8 at all.
// StreamDecoder takes ids one at a time and returns only well-formed UTF-8:
// an incomplete character at the end is held back until the next token
// completes it; bytes that can no longer become a character are replaced by
// U+FFFD. Replacement follows the Unicode "maximal subpart" practice (one
// U+FFFD per maximal prefix of a well-formed sequence, or per lone byte),
// which is what Rust's String::from_utf8_lossy and so HF's decoder do.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace dsv4 {

// `bytes` as well-formed UTF-8, ill-formed parts replaced by U+FFFD (also a
// truncated character at the end).
std::string utf8_lossy(std::string_view bytes);

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}

  // Text completed by token `id` (possibly empty). Ids outside the
  // vocabulary contribute nothing.
  std::string push(int32_t id);
  // Everything still held back, with a truncated character replaced by
  // U+FFFD; the decoder is then empty and can be reused.
  std::string flush();
  // Bytes held back (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace dsv4
