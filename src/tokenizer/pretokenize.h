// The DeepSeek V3/V4 pre-tokenizer (formats.md §3.3): cuts text into the
// pieces that BPE then merges independently.
//
// Normative definition (HF `tokenizers`, Oniguruma regex, three `Split`s with
// behaviour "isolated" applied in sequence, each to every piece the previous
// one produced):
//
//   R1  \p{N}{1,3}
//   R2  [一-龥぀-ゟ゠-ヿ]+                  (U+4E00–U+9FA5, U+3040–U+30FF)
//   R3  A1 [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+
//      |A2 [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//      |A3  ?[\p{P}\p{S}]+[\r\n]*
//      |A4 \s*[\r\n]+
//      |A5 \s+(?!\S)
//      |A6 \s+
//
// "Isolated" split of a piece: find the leftmost match, then the next one
// after it, ...; every match is a piece and every non-empty stretch between
// matches is a piece too. None of the three patterns can match the empty
// string, so pieces are never empty.
//
// This is a hand-written scanner that reproduces those regexes exactly (the
// derivation is in pretokenize.cpp). Character classes come from ICU:
// \p{L} \p{M} \p{N} \p{P} \p{S} are the general-category groups, and \s is
// Oniguruma's Unicode \s: U+0009–U+000D, U+0085 and categories Zs, Zl, Zp.
//
// Input need not be valid UTF-8: a byte that does not start a well-formed
// sequence is treated as one character of category Cn (unassigned), so any
// byte string is covered and nothing is lost. (HF cannot see such input.)
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace dsv4 {

// Appends the pieces of `text` to `*pieces`, in order. The pieces are views
// into `text`, non-empty, and their concatenation is exactly `text`.
void pretokenize(std::string_view text, std::vector<std::string_view>* pieces);

// Convenience form returning a fresh vector.
std::vector<std::string_view> pretokenize(std::string_view text);

// Character-class bits the scanner uses (exposed for tests).
enum PretokClass : uint16_t {
  PRETOK_CLASS_L = 1u << 0,            // \p{L}
  PRETOK_CLASS_M = 1u << 1,            // \p{M}
  PRETOK_CLASS_N = 1u << 2,            // \p{N}
  PRETOK_CLASS_P = 1u << 3,            // \p{P}
  PRETOK_CLASS_S = 1u << 4,            // \p{S}
  PRETOK_CLASS_WS = 1u << 5,           // \s
  PRETOK_CLASS_CRLF = 1u << 6,         // \r or \n
  PRETOK_CLASS_SPACE = 1u << 7,        // U+0020 only (the " ?" of A3)
  PRETOK_CLASS_ASCII_PUNCT = 1u << 8,  // the 32 characters of A1's first class
  PRETOK_CLASS_ASCII_ALPHA = 1u << 9,  // [A-Za-z]
  PRETOK_CLASS_CJK = 1u << 10,         // R2's class
};

// Class bits of code point `cp` (cp <= 0x10FFFF).
uint16_t pretok_class(uint32_t cp);

}  // namespace dsv4
