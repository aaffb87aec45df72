#include "core/utf8.h"

namespace dsv4 {

size_t utf8_sequence_length(std::string_view s) {
  if (s.empty()) return 0;
  auto b = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  uint8_t c = b(0);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t min_cp;
  uint32_t cp;
  if ((c & 0xe0) == 0xc0) {
    n = 2;
    min_cp = 0x80;
    cp = c & 0x1f;
  } else if ((c & 0xf0) == 0xe0) {
    n = 3;
    min_cp = 0x800;
    cp = c & 0x0f;
  } else if ((c & 0xf8) == 0xf0) {
    n = 4;
    min_cp = 0x10000;
    cp = c & 0x07;
  } else
    return 0;
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i) & 0x3f);
  }
  if (cp < min_cp || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t n = utf8_sequence_length(s.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t utf8_incomplete_suffix(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    uint8_t c = static_cast<uint8_t>(s[n - back]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 1;
    if (need <= back) return 0;
    // Check the bytes we have are a valid prefix (continuations only).
    for (size_t i = n - back + 1; i < n; ++i)
      if ((static_cast<uint8_t>(s[i]) & 0xc0) != 0x80) return 0;
    return back;
  }
  return 0;
}

uint32_t utf8_decode(std::string_view s, size_t* pos) {
  size_t n = utf8_sequence_length(s.substr(*pos));
  if (n == 0) {
    ++*pos;
    return 0xfffd;
  }
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[*pos + i])); };
  uint32_t cp;
  switch (n) {
    case 1: cp = b(0); break;
    case 2: cp = ((b(0) & 0x1f) << 6) | (b(1) & 0x3f); break;
    case 3: cp = ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f); break;
    default: cp = ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f); break;
  }
  *pos += n;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

}  // namespace dsv4
