#include "tokenizer/stream_decoder.h"

namespace dsv4 {
namespace {

constexpr std::string_view k_replacement = "\xEF\xBF\xBD";  // U+FFFD

enum class Utf8Step { VALID, INVALID, TRUNCATED };

// Classifies the bytes at s[pos] (Unicode Table 3-7, well-formed byte
// sequences). *len: VALID: the character's length; INVALID: the length of
// the maximal subpart to replace by one U+FFFD (>= 1); TRUNCATED: the bytes
// present, a proper prefix of a well-formed sequence that reaches the end.
Utf8Step utf8_step(std::string_view s, size_t pos, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return Utf8Step::VALID;
  }
  size_t need;
  uint8_t lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    need = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    need = 3;
    if (b0 == 0xe0) lo = 0xa0;  // no overlongs
    if (b0 == 0xed) hi = 0x9f;  // no surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    need = 4;
    if (b0 == 0xf0) lo = 0x90;  // no overlongs
    if (b0 == 0xf4) hi = 0x8f;  // nothing above U+10FFFF
  } else {
    *len = 1;  // 80..C1, F5..FF never start a character
    return Utf8Step::INVALID;
  }
  for (size_t k = 1; k < need; ++k) {
    if (pos + k >= s.size()) {
      *len = k;
      return Utf8Step::TRUNCATED;
    }
    const auto b = static_cast<uint8_t>(s[pos + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf)) {
      *len = k;
      return Utf8Step::INVALID;
    }
  }
  *len = need;
  return Utf8Step::VALID;
}

// Appends the well-formed text of s to *out; returns how many bytes were
// consumed. With hold_truncated, a truncated character at the end is left
// unconsumed; otherwise it becomes U+FFFD.
size_t append_lossy(std::string_view s, bool hold_truncated, std::string* out) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t len = 0;
    const Utf8Step step = utf8_step(s, pos, &len);
    switch (step) {
      case Utf8Step::VALID: out->append(s.substr(pos, len)); break;
      case Utf8Step::INVALID: out->append(k_replacement); break;
      case Utf8Step::TRUNCATED:
        if (hold_truncated) return pos;
        out->append(k_replacement);
        break;
    }
    pos += len;
  }
  return pos;
}

}  // namespace

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  append_lossy(bytes, false, &out);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);
  std::string out;
  const size_t used = append_lossy(pending_, true, &out);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4
