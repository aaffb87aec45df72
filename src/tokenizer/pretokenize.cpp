// Hand-written equivalent of the three DeepSeek pre-tokenizer regexes
// (pretokenize.h). Oniguruma is a backtracking engine: a search tries start
// positions left to right; at each start it tries the alternatives in order,
// and quantifiers are greedy, giving back one character at a time when the
// rest of the pattern fails. The scanner below computes, for each start
// position, the match that this procedure finds (or "no match").
//
// Sequencing of R1 and R2. R1 cuts every run of \p{N} characters into matches
// of 3,3,...,rest from the left, and everything else into gap pieces. R2 then
// runs on each piece: an R1 match holds only \p{N} characters, and R2's
// class (U+4E00–U+9FA5 are all Lo; U+3040–U+30FF hold Lo/Lm/Mn/Sk/Pd/Po and
// unassigned code points) has no \p{N} character, so R1 matches pass through
// unchanged and R1 gaps are cut into maximal R2-class runs and the stretches
// between them. So after R1 and R2 the text is partitioned into segments:
// N-chunks of at most 3 characters, maximal R2-class runs, and maximal runs
// of the remaining characters. R3 runs on each segment on its own, which
// matters: its lookahead (?!\S) and its runs stop at the segment end.
//
// R3 at start position i, segment end b (c(k) = character k):
//
//  A1 [ascii-punct][A-Za-z]+ : c(i) is one of the 32 ASCII punctuation
//     characters and c(i+1) an ASCII letter; greedy + takes the whole letter
//     run and nothing follows in the alternative, so no backtracking.
//  A2 [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ : the greedy ? first takes c(i) if
//     it is allowed; then the + needs at least one L/M character at i+1 and
//     takes the whole L/M run. If that fails, ? gives c(i) back and + needs
//     c(i) itself to be L/M (then takes the L/M run from i). Both successes
//     end at the end of the L/M run, so: match = [i, end of the L/M run
//     starting at i+1) in the first case, [i, end of the L/M run at i) in the
//     second. (A mark c(i) is allowed by ? and is also L/M: both cases give
//     the same span.)
//  A3 " ?[\p{P}\p{S}]+[\r\n]*" : if c(i) is U+0020 and c(i+1) is P/S, the
//     optional space is taken; otherwise (giving the space back leaves a
//     space, which is not P/S) c(i) itself must be P/S. Then the P/S run and
//     the CR/LF run after it; CR/LF are neither P nor S, so the two greedy
//     runs do not interact.
//  Let W = [i, j) be the maximal run of \s characters starting at i.
//  A4 \s*[\r\n]+ : \s* takes W, gives back one character at a time until
//     [\r\n]+ can start, i.e. at the last CR/LF p in W (c(j) is not \s, so
//     not CR/LF); [\r\n]+ then takes c(p) and stops, since p is the last
//     CR/LF of W. Match [i, p+1) if W holds a CR/LF, else A4 fails.
//  A5 \s+(?!\S) : \s+ takes W; (?!\S) holds at j only if j is the segment
//     end (c(j) is \S otherwise). Else give one back: at j-1 the next
//     character is \s, so the lookahead holds if W has >= 2 characters.
//     Match [i, b) if j == b, [i, j-1) if |W| >= 2, else fail.
//  A6 \s+ : W (reached only when |W| == 1 and j < b).
//
// A character where no alternative matches (e.g. ZWJ U+200D not followed by
// a letter, a \p{N} character, a control character) becomes part of a gap
// piece, together with the following characters up to the next match start.
#include "tokenizer/pretokenize.h"

#include <unicode/uchar.h>

#include <memory>

#include "core/utf8.h"

namespace dsv4 {
namespace {

uint16_t compute_class(uint32_t cp) {
  uint16_t c = 0;
  const uint32_t gc = U_GET_GC_MASK(static_cast<UChar32>(cp));
  if (gc & U_GC_L_MASK) c |= PRETOK_CLASS_L;
  if (gc & U_GC_M_MASK) c |= PRETOK_CLASS_M;
  if (gc & U_GC_N_MASK) c |= PRETOK_CLASS_N;
  if (gc & U_GC_P_MASK) c |= PRETOK_CLASS_P;
  if (gc & U_GC_S_MASK) c |= PRETOK_CLASS_S;
  // Oniguruma's Unicode \s: 0009-000D, 0085, Zs, Zl, Zp (equal to the
  // White_Space property).
  if ((cp >= 0x09 && cp <= 0x0d) || cp == 0x85 || (gc & (U_GC_ZS_MASK | U_GC_ZL_MASK | U_GC_ZP_MASK)))
    c |= PRETOK_CLASS_WS;
  if (cp == '\r' || cp == '\n') c |= PRETOK_CLASS_CRLF;
  if (cp == ' ') c |= PRETOK_CLASS_SPACE;
  // !"#$%&'()*+,-./ :;<=>?@ [\]^_` {|}~
  if ((cp >= 0x21 && cp <= 0x2f) || (cp >= 0x3a && cp <= 0x40) || (cp >= 0x5b && cp <= 0x60) ||
      (cp >= 0x7b && cp <= 0x7e))
    c |= PRETOK_CLASS_ASCII_PUNCT;
  if ((cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z')) c |= PRETOK_CLASS_ASCII_ALPHA;
  if ((cp >= 0x4e00 && cp <= 0x9fa5) || (cp >= 0x3040 && cp <= 0x30ff)) c |= PRETOK_CLASS_CJK;
  return c;
}

// Classes of the whole BMP, computed once (128 KiB); other planes ask ICU.
const uint16_t* bmp_classes() {
  static const std::unique_ptr<uint16_t[]> table = [] {
    auto t = std::make_unique<uint16_t[]>(0x10000);
    for (uint32_t cp = 0; cp < 0x10000; ++cp) t[cp] = compute_class(cp);
    return t;
  }();
  return table.get();
}

constexpr uint16_t k_lm = PRETOK_CLASS_L | PRETOK_CLASS_M;
constexpr uint16_t k_ps = PRETOK_CLASS_P | PRETOK_CLASS_S;

// The text as characters: cls[k] is the class of character k, off[k] its
// byte offset (off has one extra entry, the text size).
struct CharView {
  std::vector<uint16_t> cls;
  std::vector<size_t> off;
};

void decode_chars(std::string_view text, CharView* v) {
  const uint16_t* bmp = bmp_classes();
  v->cls.clear();
  v->off.clear();
  v->cls.reserve(text.size());
  v->off.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    v->off.push_back(pos);
    const auto b0 = static_cast<uint8_t>(text[pos]);
    if (b0 < 0x80) {
      v->cls.push_back(bmp[b0]);
      ++pos;
      continue;
    }
    if (utf8_sequence_length(text.substr(pos)) == 0) {
      v->cls.push_back(0);  // ill-formed byte: one character of category Cn
      ++pos;
      continue;
    }
    const uint32_t cp = utf8_decode(text, &pos);
    v->cls.push_back(cp < 0x10000 ? bmp[cp] : compute_class(cp));
  }
  v->off.push_back(text.size());
}

// Length in characters of the R3 match starting at character i of the
// segment ending at b (i < b), or 0 if no alternative matches there.
size_t match_r3(const uint16_t* cls, size_t i, size_t b) {
  const uint16_t c0 = cls[i];
  const bool has_next = i + 1 < b;
  const uint16_t c1 = has_next ? cls[i + 1] : 0;

  // A1
  if ((c0 & PRETOK_CLASS_ASCII_PUNCT) && (c1 & PRETOK_CLASS_ASCII_ALPHA)) {
    size_t j = i + 2;
    while (j < b && (cls[j] & PRETOK_CLASS_ASCII_ALPHA)) ++j;
    return j - i;
  }
  // A2
  const bool optional_ok = !(c0 & (PRETOK_CLASS_CRLF | PRETOK_CLASS_L | PRETOK_CLASS_P | PRETOK_CLASS_S));
  if ((optional_ok && (c1 & k_lm)) || (c0 & k_lm)) {
    size_t j = i + 1;
    while (j < b && (cls[j] & k_lm)) ++j;
    return j - i;
  }
  // A3
  size_t k = i;
  if ((c0 & PRETOK_CLASS_SPACE) && (c1 & k_ps)) k = i + 1;
  if (cls[k] & k_ps) {
    size_t j = k + 1;
    while (j < b && (cls[j] & k_ps)) ++j;
    while (j < b && (cls[j] & PRETOK_CLASS_CRLF)) ++j;
    return j - i;
  }
  if (!(c0 & PRETOK_CLASS_WS)) return 0;
  // W = [i, j); last_crlf = one past the last CR/LF in W (0 if none).
  size_t j = i;
  size_t last_crlf = 0;
  while (j < b && (cls[j] & PRETOK_CLASS_WS)) {
    if (cls[j] & PRETOK_CLASS_CRLF) last_crlf = j + 1;
    ++j;
  }
  if (last_crlf != 0) return last_crlf - i;  // A4
  if (j == b) return j - i;                  // A5, lookahead at the end
  if (j - i >= 2) return j - i - 1;          // A5, one character given back
  return 1;                                  // A6
}

}  // namespace

uint16_t pretok_class(uint32_t cp) { return cp < 0x10000 ? bmp_classes()[cp] : compute_class(cp); }

void pretokenize(std::string_view text, std::vector<std::string_view>* pieces) {
  CharView v;
  decode_chars(text, &v);
  const uint16_t* cls = v.cls.data();
  const size_t n = v.cls.size();
  auto emit = [&](size_t a, size_t e) { pieces->push_back(text.substr(v.off[a], v.off[e] - v.off[a])); };

  // R3 (isolated) over segment [a, b).
  auto split_r3 = [&](size_t a, size_t b) {
    size_t gap = a;
    size_t i = a;
    while (i < b) {
      const size_t len = match_r3(cls, i, b);
      if (len == 0) {
        ++i;
        continue;
      }
      if (gap < i) emit(gap, i);
      emit(i, i + len);
      i += len;
      gap = i;
    }
    if (gap < b) emit(gap, b);
  };

  // R1 then R2: partition into segments (see the file comment).
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    if (cls[i] & PRETOK_CLASS_N) {
      while (j < n && j < i + 3 && (cls[j] & PRETOK_CLASS_N)) ++j;
    } else if (cls[i] & PRETOK_CLASS_CJK) {
      while (j < n && (cls[j] & PRETOK_CLASS_CJK) && !(cls[j] & PRETOK_CLASS_N)) ++j;
    } else {
      while (j < n && !(cls[j] & (PRETOK_CLASS_N | PRETOK_CLASS_CJK))) ++j;
    }
    split_r3(i, j);
    i = j;
  }
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  pretokenize(text, &pieces);
  return pieces;
}

}  // namespace dsv4
