// UTF-8 helpers shared by the GGUF reader, tokenizer and streaming output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4 {

// True if `s` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool utf8_valid(std::string_view s);

// Length of the well-formed UTF-8 sequence starting at s[0], or 0 if it is
// malformed or truncated.
size_t utf8_sequence_length(std::string_view s);

// Number of trailing bytes of `s` that form an incomplete (but so far valid)
// UTF-8 sequence; a streaming writer holds these back until more bytes come.
size_t utf8_incomplete_suffix(std::string_view s);

// Decodes one code point at s[*pos], advancing *pos; malformed input yields
// U+FFFD and advances one byte.
uint32_t utf8_decode(std::string_view s, size_t* pos);

// Appends the UTF-8 encoding of `cp` to `out`.
void utf8_append(std::string& out, uint32_t cp);

}  // namespace dsv4
