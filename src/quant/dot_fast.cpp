// AVX2 kernels of vec_dot_q for IQ2_XXS, Q2_K and Q4_K weights against Q8_K
// activations and MXFP4 weights against Q8_0F activations, and AVX-512 ones for
// IQ2_XXS, Q2_K and MXFP4 (dot_fast.h: bit-identical to the reference in dot.cpp).
//
// Per weight block (256 elements; MXFP4: 32) the reference forms exact integer
// sums and then one float update of the running sum (MXFP4: of running sum
// b mod 8, which the kernel keeps as the 8 lanes of one register); these
// kernels form the same integers with 32 int8 lanes:
//   _mm256_maddubs_epi16(u, s): u8 x s8 products summed in pairs into int16
//     (saturating; every use below stays far inside int16:
//      IQ2_XXS |y| <= 128 times grid magnitude <= 43: pair <= 11,008;
//      Q2_K quant <= 3: pair <= 768; Q4_K nibble <= 15: pair <= 3,840;
//      MXFP4 |twice the E2M1 value| <= 12: pair <= 3,072),
//   _mm256_madd_epi16(p, c): int16 pairs times int16 scale into int32,
// and fold the int32 lanes at the end of the block (integer addition is
// associative, so the order does not matter). The float part is the
// reference's expression, evaluated in the reference's order; this file is
// built with -ffp-contract=off and the AVX2 target does not include FMA.
#include "quant/dot_fast.h"

#include <algorithm>
#include <cstring>

#include "core/assert.h"
#include "core/float_conv.h"
#include "quant/block_decode.h"
#include "quant/iq2_tables.h"
#include "quant/quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DSV4_DOT_FAST_X86 1
#endif

namespace dsv4::quant {

namespace {

#ifdef DSV4_DOT_FAST_X86

#define DSV4_AVX2 __attribute__((target("avx2")))

DSV4_AVX2 inline int32_t hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The sums of a's and of b's eight lanes with one fold: hadd gives [a01, a23, b01, b23 | a45, a67, b45,
// b67], a second hadd pairs those again, and the two 128-bit halves are added.
DSV4_AVX2 inline void hsum_i32_pair(__m256i a, __m256i b, int32_t& sa, int32_t& sb) {
  __m256i h = _mm256_hadd_epi32(a, b);
  h = _mm256_hadd_epi32(h, h);
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  sa = _mm_cvtsi128_si32(s);
  sb = _mm_extract_epi32(s, 1);
}

DSV4_AVX2 inline uint64_t load_u64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// IQ2_XXS: group ib's 32 weights are ±grid bytes (4 grid entries of 8 magnitudes, 4 sign patterns);
// sg * y = |y| * (sg * sign(y)), so maddubs gets the unsigned |y| (128 for -128) and the signed sg. The
// group's scale 2 ls + 1 multiplies the int16 pair sums in the madd that widens them (|pair| <= 11,008,
// times <= 31, two per int32 lane), and two accumulators (even and odd groups) keep the adds independent.
DSV4_AVX2 inline __m256i iq2_xxs_group(const BlockIQ2_XXS& w, const int8_t* yq, int ib, const uint64_t* grid,
                                       const int8_t* masks) {
  uint32_t wa, wb;
  detail::iq2_xxs_group_words(w, ib, wa, wb);
  const __m256i g =
      _mm256_set_epi64x(static_cast<int64_t>(grid[wa >> 24]), static_cast<int64_t>(grid[(wa >> 16) & 0xFF]),
                        static_cast<int64_t>(grid[(wa >> 8) & 0xFF]), static_cast<int64_t>(grid[wa & 0xFF]));
  const __m256i m = _mm256_set_epi64x(static_cast<int64_t>(load_u64(masks + 8 * ((wb >> 21) & 127))),
                                      static_cast<int64_t>(load_u64(masks + 8 * ((wb >> 14) & 127))),
                                      static_cast<int64_t>(load_u64(masks + 8 * ((wb >> 7) & 127))),
                                      static_cast<int64_t>(load_u64(masks + 8 * (wb & 127))));
  const __m256i sg = _mm256_sub_epi8(_mm256_xor_si256(g, m), m);  // g or -g
  const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(yq + 32 * ib));
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(yv), _mm256_sign_epi8(sg, yv));
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(static_cast<int16_t>(2 * (wb >> 28) + 1)));
}

DSV4_AVX2 float dot_iq2_xxs_avx2(const BlockIQ2_XXS* w, const BlockQ8_K* a, int64_t nb) {
  const uint64_t* grid = iq2xxs_grid();
  const int8_t* masks = detail::iq2xxs_sign_mask();  // 8 bytes (0 or -1) per sign index
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K& y = a[b];
    __m256i acc0 = _mm256_setzero_si256(), acc1 = _mm256_setzero_si256();
    for (int ib = 0; ib < k_qk_k / 32; ib += 2) {
      acc0 = _mm256_add_epi32(acc0, iq2_xxs_group(w[b], y.qs, ib, grid, masks));
      acc1 = _mm256_add_epi32(acc1, iq2_xxs_group(w[b], y.qs, ib + 1, grid, masks));
    }
    const int32_t bsum = hsum_i32(_mm256_add_epi32(acc0, acc1));
    sum += f16_to_f32(w[b].d) * y.d * static_cast<float>(bsum);
  }
  return 0.125f * sum;
}

// Q2_K: 2-bit quants of 16-weight groups with 4-bit scales (low nibble) and mins (high nibble). The 16
// scales, masked once per block and held in both 128-bit lanes, are spread over the int16 lanes of each
// 32-byte chunk by one byte shuffle (bytes 0-15 of chunk (h, s) belong to group 8 h + 2 s, bytes 16-31 to
// the next: k_q2k_scale_idx). The block's two integer sums are folded together at the end.
struct Q2kScaleIdx {
  alignas(32) int8_t v[8][32];  // chunk c = 4 h + s: byte i -> scale byte 2 c + (i >= 16) for even i, else zero
};
constexpr Q2kScaleIdx make_q2k_scale_idx() {
  Q2kScaleIdx t{};
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 32; ++i) t.v[c][i] = static_cast<int8_t>(i % 2 == 1 ? -1 : 2 * c + (i >= 16 ? 1 : 0));
  return t;
}
constexpr Q2kScaleIdx k_q2k_scale_idx = make_q2k_scale_idx();

// A Q2_K block's parts that both kernels share: its 16 scales (low nibbles, bytes of a 128-bit register) and
// the int32 lanes of sum_g m_g bsums[g]; then, from the lanes of sum_g sc_g sum q y, the block's float term.
struct Q2kBlockStart {
  __m128i scales;
  __m256i min_part;
};
DSV4_AVX2 inline Q2kBlockStart q2k_block_start(const BlockQ2_K& x, const BlockQ8_K& y) {
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
  const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), low4));
  const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
  return {_mm_and_si128(sc, low4), _mm256_madd_epi16(mins, bsums)};
}
DSV4_AVX2 inline float q2k_block_term(const BlockQ2_K& x, const BlockQ8_K& y, __m256i acc, __m256i min_part) {
  int32_t isum, isum_min;
  hsum_i32_pair(acc, min_part, isum, isum_min);
  const float dall = y.d * f16_to_f32(x.d);
  const float dmin = y.d * f16_to_f32(x.dmin);
  return dall * static_cast<float>(isum) - dmin * static_cast<float>(isum_min);
}

DSV4_AVX2 float dot_q2_k_avx2(const BlockQ2_K* w, const BlockQ8_K* a, int64_t nb) {
  const __m256i three = _mm256_set1_epi8(3);
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ2_K& x = w[b];
    const BlockQ8_K& y = a[b];
    const Q2kBlockStart st = q2k_block_start(x, y);
    const __m256i scales = _mm256_broadcastsi128_si256(st.scales);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * h));
      for (int s = 0; s < 4; ++s) {
        const __m256i q2 = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s)), three);
        const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 128 * h + 32 * s));
        const __m256i p16 = _mm256_maddubs_epi16(q2, yv);
        const __m256i scale = _mm256_shuffle_epi8(
            scales, _mm256_load_si256(reinterpret_cast<const __m256i*>(k_q2k_scale_idx.v[4 * h + s])));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, scale));
      }
    }
    sum += q2k_block_term(x, y, acc, st.min_part);
  }
  return sum;
}

// Q4_K: 4-bit quants, chunk c's 32 bytes carry sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles).
// The block's eight 6-bit scales and mins are unpacked at once (four bytes per 32-bit word, the bit
// moves of detail::q4_k_scale_min) into one 16-byte register [scales 0-7 | mins 0-7], held in both
// 128-bit lanes; a byte shuffle spreads a sub-block's scale over the int16 lanes of its madd
// (k_q4k_idx.scale) and each min over the two 16-element sums of its sub-block (k_q4k_idx.min).
struct Q4kIdx {
  alignas(32) int8_t scale[8][32];  // sub-block j: byte i -> byte j for even i, else zero
  alignas(32) int8_t min[32];       // int16 lane l (bytes 2l, 2l + 1) -> min byte 8 + l / 2
};
constexpr Q4kIdx make_q4k_idx() {
  Q4kIdx t{};
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 32; ++i) t.scale[j][i] = static_cast<int8_t>(i % 2 == 1 ? -1 : j);
  // In-lane shuffles: lanes 0-7 (sums 0-7, mins 0-3) in the low 128 bits, lanes 8-15 in the high.
  for (int i = 0; i < 32; ++i) t.min[i] = static_cast<int8_t>(i % 2 == 1 ? -1 : 8 + (i / 2) / 2);
  return t;
}
constexpr Q4kIdx k_q4k_idx = make_q4k_idx();

DSV4_AVX2 float dot_q4_k_avx2(const BlockQ4_K* w, const BlockQ8_K* a, int64_t nb) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i min_idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(k_q4k_idx.min));
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K& x = w[b];
    const BlockQ8_K& y = a[b];
    uint32_t u[3];
    std::memcpy(u, x.scales, 12);
    const uint32_t sc_lo = u[0] & 0x3F3F3F3Fu, m_lo = u[1] & 0x3F3F3F3Fu;
    const uint32_t sc_hi = (u[2] & 0x0F0F0F0Fu) | ((u[0] >> 6) & 0x03030303u) << 4;
    const uint32_t m_hi = ((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 6) & 0x03030303u) << 4;
    const __m256i sm =
        _mm256_broadcastsi128_si256(_mm_set_epi32(static_cast<int32_t>(m_hi), static_cast<int32_t>(m_lo),
                                                  static_cast<int32_t>(sc_hi), static_cast<int32_t>(sc_lo)));
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
    const __m256i min_part = _mm256_madd_epi16(bsums, _mm256_shuffle_epi8(sm, min_idx));
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * c));
      const __m256i lo = _mm256_and_si256(q, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      const __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * c)));
      const __m256i phi =
          _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs + 64 * c + 32)));
      const __m256i sc0 =
          _mm256_shuffle_epi8(sm, _mm256_load_si256(reinterpret_cast<const __m256i*>(k_q4k_idx.scale[2 * c])));
      const __m256i sc1 =
          _mm256_shuffle_epi8(sm, _mm256_load_si256(reinterpret_cast<const __m256i*>(k_q4k_idx.scale[2 * c + 1])));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, sc0));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(phi, sc1));
    }
    int32_t isum, isum_min;
    hsum_i32_pair(acc, min_part, isum, isum_min);
    const float dall = y.d * f16_to_f32(x.d);
    const float dmin = y.d * f16_to_f32(x.dmin);
    sum += dall * static_cast<float>(isum) - dmin * static_cast<float>(isum_min);
  }
  return sum;
}

// MXFP4: block b's 16 code bytes hold elements j (low nibble) and j + 16 (high nibble); one 256-bit
// register of codes in element order, looked up in the x2 table (twice the E2M1 value, an int8) with
// one in-lane byte shuffle, then signed times the Q8_0F block's 32 int8 as in IQ2_XXS: 8 int32 partial
// sums per block.
DSV4_AVX2 inline __m256i mxfp4_block_partials(const BlockMXFP4& w, const BlockQ8_0F& a, __m256i table) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
  const __m256i codes = _mm256_and_si256(_mm256_setr_m128i(q, _mm_srli_epi16(q, 4)), _mm256_set1_epi8(0x0F));
  const __m256i x2 = _mm256_shuffle_epi8(table, codes);
  const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
  const __m256i p16 = _mm256_maddubs_epi16(_mm256_abs_epi8(yv), _mm256_sign_epi8(x2, yv));
  return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

// The float part of 8 blocks b..b+7 (lane i: block b + i, the reference's running sum i), given their
// exponents e and integer sums: lanes + ((0.5 * 2^(e - 127)) * d) * isum (mxfp4_scale: e = 0 is 2^-127), the
// activation scales built in registers (scalar stores read back as one vector would stall store forwarding).
DSV4_AVX2 inline __m256 mxfp4_add_terms(__m256 lanes, __m256i e, const BlockQ8_0F* a, __m256i isum) {
  const __m256i bits = _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000),
                                          _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
  const __m256 hs = _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_castsi256_ps(bits));
  const __m256 dx = _mm256_setr_ps(a[0].d, a[1].d, a[2].d, a[3].d, a[4].d, a[5].d, a[6].d, a[7].d);
  return _mm256_add_ps(lanes, _mm256_mul_ps(_mm256_mul_ps(hs, dx), _mm256_cvtepi32_ps(isum)));
}

// Blocks b..nb-1 (fewer than 8) one at a time into their lanes, then the reference's fold.
DSV4_AVX2 inline float mxfp4_tail(__m256 lanes, const BlockMXFP4* w, const BlockQ8_0F* a, int64_t b, int64_t nb) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(detail::k_mxfp4_x2)));
  alignas(32) float lane[8];
  _mm256_store_ps(lane, lanes);
  for (; b < nb; ++b) {
    const int32_t isum = hsum_i32(mxfp4_block_partials(w[b], a[b], table));
    lane[b % 8] += (0.5f * detail::mxfp4_scale(w[b].e)) * a[b].d * static_cast<float>(isum);
  }
  return detail::fold_lanes<8>(lane);
}

// The blocks' integer sums 8 at a time (a tree of horizontal adds folds 8 blocks' partials into one
// register), their float terms as one vector (block b + i in lane i: the reference's lanes) added to the
// 8 running sums; a tail of fewer than 8 blocks goes lane by lane, then the reference's fold.
DSV4_AVX2 float dot_mxfp4_avx2(const BlockMXFP4* w, const BlockQ8_0F* a, int64_t nb) {
  const __m256i table =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(detail::k_mxfp4_x2)));
  __m256 lanes = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    __m256i p[8];
    for (int i = 0; i < 8; ++i) p[i] = mxfp4_block_partials(w[b + i], a[b + i], table);
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    // h0 = [blocks 0-3 over lanes 0-3 | blocks 0-3 over lanes 4-7], h1 the same for blocks 4-7.
    const __m256i isum =
        _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20), _mm256_permute2x128_si256(h0, h1, 0x31));
    const __m256i e =
        _mm256_setr_epi32(w[b].e, w[b + 1].e, w[b + 2].e, w[b + 3].e, w[b + 4].e, w[b + 5].e, w[b + 6].e, w[b + 7].e);
    lanes = mxfp4_add_terms(lanes, e, a + b, isum);
  }
  return mxfp4_tail(lanes, w, a, b, nb);
}

#define DSV4_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,avx512vnni")))
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 on the AVX-512 intrinsics' undefined sources
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// IQ2_XXS with AVX-512 (BW, VBMI, VNNI): a block's 32 grid entries looked up in registers instead of one load
// per entry. Each entry's eight magnitudes {8, 25, 43} are 2-bit codes c_j (0, 1, 2) packed in 16 bits, so the
// 256-entry table is 8 registers that vpermi2w reads 64 entries at a time (bits 6 and 7 of the index pick the
// quarter); the sign indices of the block (four 7-bit fields of each group's second word) come out of one
// vpmultishiftqb and become sign bytes by a 128-byte vpermi2b. Per 64 weights (groups 2c and 2c + 1): each
// entry's code goes into its own qword, vpmultishiftqb puts c_j + 4 c_{j+1} + 16 c_{j+2} into byte j and a
// 64-entry vpermb (n -> magnitude of n & 3) gives the magnitudes; the weight's sign (its sign byte's bit j)
// xor y's sign is a mask that negates the magnitude, so maddubs takes |y| (128 for -128) unsigned and the
// signed magnitude, and vpdpwssd multiplies the pair sums by the group's scale 2 ls + 1 into int32 lanes.
// Bounds as above: |pair| <= 11,008; a lane adds four chunks' pairs of pairs times <= 31 (< 2^21).

struct Iq2Avx512Tables {
  alignas(64) uint16_t code[256];         // entry i: sum_j c_j << 2 j, c_j the code of byte j of grid[i]
  alignas(64) int8_t mag[64];             // n -> the magnitude of code n & 3 (code 3 does not occur)
  alignas(64) uint8_t signs[128];         // iq2xxs_signs()
  alignas(64) uint8_t grid_idx[64];       // byte 2 k = the qs byte of entry k = 4 g + t (8 g + t), odd bytes unused
  alignas(64) uint16_t code_idx[4][32];   // chunk c: word 4 q = 8 c + q (entry 2 c + q / 4, q % 4)
  alignas(64) uint8_t sign_rep[4][64];    // chunk c: byte 8 q + j = 8 (2 c + q / 4) + q % 4
  alignas(64) uint16_t scale_idx[4][32];  // chunk c: word i = 4 (2 c + i / 16)
};

const Iq2Avx512Tables& iq2_avx512_tables() {
  static const Iq2Avx512Tables t = [] {
    Iq2Avx512Tables r{};
    const uint64_t* grid = iq2xxs_grid();
    for (int i = 0; i < 256; ++i) {
      uint16_t c = 0;
      for (int j = 0; j < 8; ++j) {
        const auto m = static_cast<uint8_t>(grid[i] >> (8 * j));
        const uint16_t cj = m == 8 ? 0 : m == 25 ? 1 : 2;
        DSV4_ASSERT(m == 8 || m == 25 || m == 43, "IQ2_XXS grid byte %u", m);
        c = static_cast<uint16_t>(c | cj << (2 * j));
      }
      r.code[i] = c;
    }
    for (int n = 0; n < 64; ++n) r.mag[n] = static_cast<int8_t>((n & 3) == 0 ? 8 : (n & 3) == 1 ? 25 : 43);
    std::memcpy(r.signs, iq2xxs_signs(), 128);
    for (int k = 0; k < 32; ++k) r.grid_idx[2 * k] = static_cast<uint8_t>(8 * (k / 4) + k % 4);
    for (int c = 0; c < 4; ++c) {
      for (int q = 0; q < 8; ++q) {
        r.code_idx[c][4 * q] = static_cast<uint16_t>(8 * c + q);
        for (int j = 0; j < 8; ++j) r.sign_rep[c][8 * q + j] = static_cast<uint8_t>(8 * (2 * c + q / 4) + q % 4);
      }
      for (int i = 0; i < 32; ++i) r.scale_idx[c][i] = static_cast<uint16_t>(4 * (2 * c + i / 16));
    }
    return r;
  }();
  return t;
}

DSV4_AVX512 inline __m512i ld(const void* p) { return _mm512_loadu_si512(p); }

DSV4_AVX512 float dot_iq2_xxs_avx512(const BlockIQ2_XXS* w, const BlockQ8_K* a, int64_t nb) {
  const Iq2Avx512Tables& T = iq2_avx512_tables();
  const __m512i c0 = ld(T.code), c1 = ld(T.code + 32), c2 = ld(T.code + 64), c3 = ld(T.code + 96);
  const __m512i c4 = ld(T.code + 128), c5 = ld(T.code + 160), c6 = ld(T.code + 192), c7 = ld(T.code + 224);
  const __m512i mag = ld(T.mag), s0 = ld(T.signs), s1 = ld(T.signs + 64);
  const __m512i grid_idx = ld(T.grid_idx);
  // Per qword, byte by byte: the bit offsets 32 + 7 t of the sign indices (t = 0..3, twice), 2 j (byte j of a
  // code's magnitudes), and 1 << j (weight j's bit of its sign byte).
  const __m512i sign_ctl = _mm512_set1_epi64(0x352E2720352E2720), code_ctl = _mm512_set1_epi64(0x0E0C0A0806040200);
  const __m512i bit_sel = _mm512_set1_epi64(static_cast<int64_t>(0x8040201008040201ull));
  const __m512i b6 = _mm512_set1_epi16(64), b7 = _mm512_set1_epi16(128);
  const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi64(1);
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K& y = a[b];
    const __m512i qs = ld(reinterpret_cast<const uint8_t*>(&w[b]) + 2);  // qword g: group g's two words
    // The 32 entries' codes (word k = entry k = 4 g + t).
    const __m512i gi = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, grid_idx, qs);
    const __mmask32 k6 = _mm512_test_epi16_mask(gi, b6), k7 = _mm512_test_epi16_mask(gi, b7);
    const __m512i lo =
        _mm512_mask_blend_epi16(k6, _mm512_permutex2var_epi16(c0, gi, c1), _mm512_permutex2var_epi16(c2, gi, c3));
    const __m512i hi =
        _mm512_mask_blend_epi16(k6, _mm512_permutex2var_epi16(c4, gi, c5), _mm512_permutex2var_epi16(c6, gi, c7));
    const __m512i codes = _mm512_mask_blend_epi16(k7, lo, hi);
    // Sign bytes (byte 8 g + t, t < 4) and scales 2 ls + 1 (qword g).
    const __m512i sbytes = _mm512_permutex2var_epi8(s0, _mm512_multishift_epi64_epi8(sign_ctl, qs), s1);
    const __m512i scales = _mm512_or_si512(_mm512_slli_epi64(_mm512_srli_epi64(qs, 60), 1), one);
    __m512i acc = zero;
    for (int c = 0; c < 4; ++c) {
      const __m512i code = _mm512_maskz_permutexvar_epi16(0x11111111u, ld(T.code_idx[c]), codes);
      const __m512i g8 = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(code_ctl, code), mag);
      const __mmask64 neg_w = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(ld(T.sign_rep[c]), sbytes), bit_sel);
      const __m512i yv = ld(y.qs + 64 * c);
      const __mmask64 neg = _kxor_mask64(neg_w, _mm512_movepi8_mask(yv));
      const __m512i sg = _mm512_mask_sub_epi8(g8, neg, zero, g8);
      const __m512i p16 = _mm512_maddubs_epi16(_mm512_abs_epi8(yv), sg);
      acc = _mm512_dpwssd_epi32(acc, p16, _mm512_permutexvar_epi16(ld(T.scale_idx[c]), scales));
    }
    const int32_t bsum = _mm512_reduce_add_epi32(acc);
    sum += f16_to_f32(w[b].d) * y.d * static_cast<float>(bsum);
  }
  return 0.125f * sum;
}

// Q2_K with AVX-512 (BW, VNNI): the AVX2 kernel's steps on 64 weights at a time, planes s and s + 1 of a
// 32-byte half h side by side (the half broadcast to both 256-bit lanes, shifted by 2 s and 2 s + 2 per lane),
// the scale shuffle per 128-bit lane and vpdpwssd adding the scaled pair sums into the accumulator.
DSV4_AVX512 float dot_q2_k_avx512(const BlockQ2_K* w, const BlockQ8_K* a, int64_t nb) {
  const __m512i three = _mm512_set1_epi8(3);
  // Shift counts per int16 lane: 2 s in the lower 256 bits, 2 s + 2 in the upper, for s = 0 and s = 2.
  const __m512i shift[2] = {_mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1),
                            _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1)};
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ2_K& x = w[b];
    const BlockQ8_K& y = a[b];
    const Q2kBlockStart st = q2k_block_start(x, y);
    const __m512i scales = _mm512_broadcast_i32x4(st.scales);
    __m512i acc = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs + 32 * h)));
      for (int s = 0; s < 4; s += 2) {
        const __m512i q2 = _mm512_and_si512(_mm512_srlv_epi16(q, shift[s / 2]), three);
        const __m512i yv = _mm512_loadu_si512(y.qs + 128 * h + 32 * s);
        const __m512i p16 = _mm512_maddubs_epi16(q2, yv);
        const __m512i idx = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_load_si256(reinterpret_cast<const __m256i*>(k_q2k_scale_idx.v[4 * h + s]))),
            _mm256_load_si256(reinterpret_cast<const __m256i*>(k_q2k_scale_idx.v[4 * h + s + 1])), 1);
        acc = _mm512_dpwssd_epi32(acc, p16, _mm512_shuffle_epi8(scales, idx));
      }
    }
    const __m256i acc256 = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    sum += q2k_block_term(x, y, acc256, st.min_part);
  }
  return sum;
}

// MXFP4 with AVX-512 (BW, VBMI, VNNI): 8 blocks (136 weight bytes, read as 64 + 64 + 8 with the last load
// masked: no byte past the row) per step. One vpermi2b per pair of blocks puts their 32 codes each in element
// order (byte k: block 2 p + k / 32, qs byte k % 16, the high nibble where k % 32 >= 16) and one more gathers
// the 8 exponents; the x2 lookup is an in-lane byte shuffle, signed by y's sign as in IQ2_XXS, and vpdpbusd
// adds |y| x signed x2 in fours into int32 lanes (each product <= 128 x 12, a block's sum <= 49,152: no
// overflow). Three rounds of adjacent-lane pair sums fold the 4 x 16 lanes into the 8 blocks' sums.
struct Mxfp4Avx512Tables {
  alignas(64) uint8_t pair[4][64];  // pair p: the codes' byte positions (p >= 2: relative to byte 64)
  alignas(64) uint8_t exps[64];     // byte i < 8: block i's exponent byte, 17 i
};

// Lane l of the result: lanes 2 l and 2 l + 1 of a and b side by side (a's 16, then b's), added. Block i's
// lanes stay together in every round: 8 lanes of a vector per block -> 4 -> 2 -> 1.
DSV4_AVX512 inline __m512i pair_sums(__m512i a, __m512i b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

const Mxfp4Avx512Tables& mxfp4_avx512_tables() {
  static const Mxfp4Avx512Tables t = [] {
    Mxfp4Avx512Tables r{};
    for (int p = 0; p < 4; ++p)
      for (int k = 0; k < 64; ++k)
        r.pair[p][k] = static_cast<uint8_t>(34 * p + 17 * (k / 32) + 1 + k % 16 - (p >= 2 ? 64 : 0));
    for (int i = 0; i < 8; ++i) r.exps[i] = static_cast<uint8_t>(17 * i);
    return r;
  }();
  return t;
}

DSV4_AVX512 float dot_mxfp4_avx512(const BlockMXFP4* w, const BlockQ8_0F* a, int64_t nb) {
  static_assert(sizeof(BlockMXFP4) == 17 && sizeof(BlockQ8_0F) == 36, "the block layouts the tables assume");
  const Mxfp4Avx512Tables& T = mxfp4_avx512_tables();
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(detail::k_mxfp4_x2)));
  const __m512i low4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
  const __m512i pair[4] = {ld(T.pair[0]), ld(T.pair[1]), ld(T.pair[2]), ld(T.pair[3])};
  const __m512i exps = ld(T.exps);
  constexpr __mmask64 k_high = 0xFFFF0000FFFF0000ull;  // bytes k with k % 32 >= 16
  __m256 lanes = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const auto* wb = reinterpret_cast<const uint8_t*>(w + b);
    const __m512i r0 = ld(wb), r1 = ld(wb + 64), r2 = _mm512_maskz_loadu_epi8(0xFF, wb + 128);
    __m512i s[4];
    for (int p = 0; p < 4; ++p) {
      const __m512i q = p < 2 ? _mm512_permutex2var_epi8(r0, pair[p], r1) : _mm512_permutex2var_epi8(r1, pair[p], r2);
      const __m512i codes = _mm512_and_si512(_mm512_mask_blend_epi8(k_high, q, _mm512_srli_epi16(q, 4)), low4);
      const __m512i x2 = _mm512_shuffle_epi8(table, codes);
      const __m512i yv = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b + 2 * p].qs))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b + 2 * p + 1].qs)), 1);
      const __m512i sx = _mm512_mask_sub_epi8(x2, _mm512_movepi8_mask(yv), zero, x2);
      s[p] = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(yv), sx);
    }
    // Lane i of u (i < 8): block b + i's integer sum.
    const __m512i t = pair_sums(pair_sums(s[0], s[1]), pair_sums(s[2], s[3]));
    const __m512i u = pair_sums(t, t);
    const __m256i e = _mm256_cvtepu8_epi32(_mm512_castsi512_si128(_mm512_permutex2var_epi8(r0, exps, r1)));
    lanes = mxfp4_add_terms(lanes, e, a + b, _mm512_castsi512_si256(u));
  }
  return mxfp4_tail(lanes, w, a, b, nb);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

DotIsa cpu_isa() {
  static const DotIsa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni"))
      return DotIsa::AVX512;
    return __builtin_cpu_supports("avx2") ? DotIsa::AVX2 : DotIsa::SCALAR;
  }();
  return isa;
}

#else
DotIsa cpu_isa() { return DotIsa::SCALAR; }
#endif

DotIsa g_cap = DotIsa::AVX512;

DotIsa isa() { return std::min(cpu_isa(), g_cap); }

}  // namespace

float vec_dot_q_fast(GgmlType t, const void* w, const void* act, int64_t n) {
#ifdef DSV4_DOT_FAST_X86
  const DotIsa use = isa();
  if (use >= DotIsa::AVX512 && t == GgmlType::MXFP4 && n % k_qk_mxfp4 == 0)
    return dot_mxfp4_avx512(static_cast<const BlockMXFP4*>(w), static_cast<const BlockQ8_0F*>(act), n / k_qk_mxfp4);
  if (use >= DotIsa::AVX2 && t == GgmlType::MXFP4 && n % k_qk_mxfp4 == 0)
    return dot_mxfp4_avx2(static_cast<const BlockMXFP4*>(w), static_cast<const BlockQ8_0F*>(act), n / k_qk_mxfp4);
  if (use >= DotIsa::AVX2 && n % k_qk_k == 0) {
    const auto* y = static_cast<const BlockQ8_K*>(act);
    const int64_t nb = n / k_qk_k;
    if (t == GgmlType::IQ2_XXS && use >= DotIsa::AVX512)
      return dot_iq2_xxs_avx512(static_cast<const BlockIQ2_XXS*>(w), y, nb);
    if (t == GgmlType::IQ2_XXS) return dot_iq2_xxs_avx2(static_cast<const BlockIQ2_XXS*>(w), y, nb);
    if (t == GgmlType::Q2_K && use >= DotIsa::AVX512) return dot_q2_k_avx512(static_cast<const BlockQ2_K*>(w), y, nb);
    if (t == GgmlType::Q2_K) return dot_q2_k_avx2(static_cast<const BlockQ2_K*>(w), y, nb);
    if (t == GgmlType::Q4_K) return dot_q4_k_avx2(static_cast<const BlockQ4_K*>(w), y, nb);
  }
#endif
  return vec_dot_q(t, w, act, n);
}

const char* dot_fast_isa() {
  switch (isa()) {
    case DotIsa::AVX512: return "avx512+avx2";
    case DotIsa::AVX2: return "avx2";
    case DotIsa::SCALAR: break;
  }
  return "scalar";
}

void set_dot_fast_isa(DotIsa cap) { g_cap = cap; }

}  // namespace dsv4::quant
