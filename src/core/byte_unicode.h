// GPT-2 byte-level alphabet (formats.md §3.1): bytes 0x21-0x7E, 0xA1-0xAC and
// 0xAE-0xFF map to the same code point; the other 68 bytes, in increasing
// order, map to U+0100, U+0101, ... (so ' ' is U+0120 'Ġ', '\n' is U+010A 'Ċ').
#pragma once

#include <cstdint>

namespace dsv4 {

inline uint32_t byte_to_unicode(uint8_t b) {
  if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae)) return b;
  // Count the "unprintable" bytes below b: 0x00-0x20 (33), 0x7F-0xA0 (34), 0xAD (1).
  uint32_t n;
  if (b <= 0x20)
    n = b;
  else if (b <= 0xa0)
    n = 33 + (b - 0x7f);
  else
    n = 33 + 34;  // 0xAD
  return 0x100 + n;
}

// Inverse; returns -1 for code points outside the alphabet.
inline int unicode_to_byte(uint32_t cp) {
  if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff))
    return static_cast<int>(cp);
  if (cp < 0x100 || cp > 0x100 + 67) return -1;
  uint32_t n = cp - 0x100;
  if (n <= 0x20) return static_cast<int>(n);
  if (n < 33 + 34) return static_cast<int>(0x7f + (n - 33));
  return 0xad;
}

}  // namespace dsv4
