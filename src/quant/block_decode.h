// Internal to the quant layer: per-block decoders shared by dequantize_row and
// vec_dot_f32, the f32 lane accumulator of vec_dot_f32, and a small rounding
// helper for the quantisers. Not part of the quant.h contract.
//
// Every decoder writes the block's elements in natural order into a small f32
// buffer, with exactly the float operations of formats.md §2.1-§2.4, so that
// dequantize_row and vec_dot_f32 see bit-identical weights.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/float_conv.h"
#include "quant/quant.h"

namespace dsv4::quant::detail {

static_assert(std::endian::native == std::endian::little, "block layouts are read as little-endian words");

// ---- rounding helpers -------------------------------------------------------

// Round to nearest (ties to even, the default FP environment) and clamp to
// [lo, hi] in the float domain first, so inf/nan/huge values never reach the
// int conversion (nan goes to lo).
inline int round_clamp(float v, int lo, int hi) {
  float r = std::nearbyint(v);
  r = std::fmax(r, static_cast<float>(lo));  // fmax(nan, lo) == lo
  r = std::fmin(r, static_cast<float>(hi));
  return static_cast<int>(r);
}

// ---- f32 lane accumulator ---------------------------------------------------
// The f32 dot products sum element i into lane (i mod k_lanes) (i counted from
// the start of the row), then fold the lanes pairwise (8+8, 4+4, 2+2, 1+1).
// Fixed lane count = fixed, reproducible summation order that the compiler can
// still keep in vector registers (no reassociation needed).
constexpr int k_lanes = 16;

// The lanes' sum, folded by halves: lane j += lane j + N/2, then j + N/4, ... (N a power of two). For N = 8
// this is ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)), the order of a 256-bit register's horizontal sum.
template <int N>
inline float fold_lanes(const float* v) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two");
  float t[N];
  for (int j = 0; j < N; ++j) t[j] = v[j];
  for (int w = N / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) t[j] += t[j + w];
  return t[0];
}

struct LaneAcc {
  float v[k_lanes] = {};

  // n must be a multiple of k_lanes.
  void add(const float* __restrict a, const float* __restrict b, int64_t n) {
    for (int64_t i = 0; i < n; i += k_lanes)
      for (int j = 0; j < k_lanes; ++j) v[j] += a[i + j] * b[i + j];
  }
  float total() const { return fold_lanes<k_lanes>(v); }
};

// ---- Q4_K packed 6-bit scales (formats.md §2.3) -----------------------------
inline void q4_k_scale_min(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---- IQ2_XXS group words (formats.md §2.4) ----------------------------------
// Group ib of a block: word a = four grid indices (one byte each), word b =
// four 7-bit sign indices (bits 7t..7t+6) and the 4-bit scale ls (bits 28..31).
// (Assembled from bytes rather than memcpy'd into the outputs: the same one load per word in an optimised
// build, and no addressable locals for AddressSanitizer to poison per group.)
inline uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
inline void iq2_xxs_group_words(const BlockIQ2_XXS& b, int ib, uint32_t& wa, uint32_t& wb) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(&b) + 2 + 8 * ib;  // qs starts after the 2-byte d
  wa = le32(p);
  wb = le32(p + 4);
}

// ---- MXFP4 (E2M1 codes, E8M0 scale; ds4-variants-mtp-dspark.md §1.1) ------
// Code c: bit 3 the sign, bits 0-2 the magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6};
// twice the signed value is an integer (k_mxfp4_x2), so w = (0.5 * x2[c]) * scale
// is exact in f32 (every product is a small integer times a power of two).
inline constexpr int8_t k_mxfp4_x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
// 2^(e - 127): the exponent field e (e = 0: the subnormal 2^-127; e = 255: +inf).
inline float mxfp4_scale(uint8_t e) { return f32_from_bits(e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23); }

// ---- decoders: one block -> natural-order f32 ------------------------------

// binary16 -> f32, bit-identical to core's f16_to_f32 for all 65536 inputs (the
// unit test checks every one) but branch-free, so that a loop over it vectorises:
//   normal:    exponent rebased by +112 (127 - 15), mantissa shifted up 13 bits;
//   inf/nan:   exponent rebased by +224 to reach 255, mantissa (payload) kept;
//   subnormal: m*2^-24 computed exactly as (2^-14 + m*2^-24) - 2^-14, so no
//              subnormal f32 arithmetic is involved.
inline float f16_to_f32_branchless(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t e = em & 0x7c00u;
  const uint32_t o = (em << 13) + (112u << 23);
  const uint32_t sub = f32_bits(f32_from_bits(o + (1u << 23)) - 0x1p-14f);
  // Select with masks rather than ?: so the compiler keeps the loop branch-free.
  const uint32_t is_sub = 0u - static_cast<uint32_t>(e == 0);
  const uint32_t is_inf = 0u - static_cast<uint32_t>(e == 0x7c00u);
  const uint32_t r = (sub & is_sub) | ((o + (is_inf & (112u << 23))) & ~is_sub);
  return f32_from_bits(r | sign);
}

// F16 / BF16 runs (block size 1): dst[i] = value of src[i]. src must be 2-byte aligned.
inline void decode_f16(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32_branchless(src[i]);
}
inline void decode_bf16(const uint16_t* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

// Q8_0: w[i] = fp16(d) * qs[i].  out[32]
inline void decode_q8_0(const BlockQ8_0& b, float* __restrict out) {
  const float d = f16_to_f32(b.d);
  for (int i = 0; i < k_qk8_0; ++i) out[i] = d * static_cast<float>(b.qs[i]);
}

// Q2_K: w[16g + i] = (fp16(d)*sc_g) * q - (fp16(dmin)*m_g).  out[256]
inline void decode_q2_k(const BlockQ2_K& b, float* __restrict out) {
  const float d = f16_to_f32(b.d);
  const float dmin = f16_to_f32(b.dmin);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* q = b.qs + 32 * h;
    for (int s = 0; s < 4; ++s) {
      float* o = out + 128 * h + 32 * s;
      const int g = 8 * h + 2 * s;  // sub-blocks g (l < 16) and g+1 (l >= 16)
      for (int k = 0; k < 2; ++k) {
        const float dl = d * static_cast<float>(b.scales[g + k] & 0x0F);
        const float ml = dmin * static_cast<float>(b.scales[g + k] >> 4);
        for (int l = 16 * k; l < 16 * k + 16; ++l) o[l] = dl * static_cast<float>((q[l] >> (2 * s)) & 3) - ml;
      }
    }
  }
}

// Q4_K: w = (fp16(d)*sc_j) * q - (fp16(dmin)*m_j), 8 sub-blocks of 32.  out[256]
inline void decode_q4_k(const BlockQ4_K& b, float* __restrict out) {
  const float d = f16_to_f32(b.d);
  const float dmin = f16_to_f32(b.dmin);
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    q4_k_scale_min(b.scales, 2 * c, sc0, m0);
    q4_k_scale_min(b.scales, 2 * c + 1, sc1, m1);
    const float d0 = d * static_cast<float>(sc0), mm0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), mm1 = dmin * static_cast<float>(m1);
    const uint8_t* q = b.qs + 32 * c;
    float* o = out + 64 * c;
    for (int l = 0; l < 32; ++l) o[l] = d0 * static_cast<float>(q[l] & 0x0F) - mm0;
    for (int l = 0; l < 32; ++l) o[32 + l] = d1 * static_cast<float>(q[l] >> 4) - mm1;
  }
}

// MXFP4: w[j] = (0.5 * x2[low nibble of qs[j]]) * scale, w[j + 16] the same with the high nibble.  out[32]
inline void decode_mxfp4(const BlockMXFP4& b, float* __restrict out) {
  const float s = mxfp4_scale(b.e);
  for (int j = 0; j < k_qk_mxfp4 / 2; ++j) {
    out[j] = (0.5f * static_cast<float>(k_mxfp4_x2[b.qs[j] & 0x0F])) * s;
    out[j + k_qk_mxfp4 / 2] = (0.5f * static_cast<float>(k_mxfp4_x2[b.qs[j] >> 4])) * s;
  }
}

// IQ2_XXS: db = fp16(d)*(0.5+ls)*0.25; w = (db * grid[k_t][j]) * (±1 from signs[s_t] bit j).  out[256]
// grid_f32 / sign_f32 are the lane tables of iq2_tables.h (multiplying by ±1 is exact).
inline void decode_iq2_xxs(const BlockIQ2_XXS& b, const float* grid_f32, const float* sign_f32, float* __restrict out) {
  const float d = f16_to_f32(b.d);
  for (int ib = 0; ib < k_qk_k / 32; ++ib) {
    uint32_t wa, wb;
    iq2_xxs_group_words(b, ib, wa, wb);
    const float db = d * (0.5f + static_cast<float>(wb >> 28)) * 0.25f;
    for (int t = 0; t < 4; ++t) {
      const float* g = grid_f32 + 8 * ((wa >> (8 * t)) & 0xFF);
      const float* s = sign_f32 + 8 * ((wb >> (7 * t)) & 127);
      float* o = out + 32 * ib + 8 * t;
      for (int j = 0; j < 8; ++j) o[j] = db * g[j] * s[j];
    }
  }
}

}  // namespace dsv4::quant::detail
