// Reference dot products (formats.md §2.1-§2.5) and the activation quantisers.
//
//  * vec_dot_f32(t, w, x, n) = Σ_i dequant(w)[i] * x[i]. Weights are decoded one
//    block at a time into a small f32 buffer (the same decoders dequantize_row
//    uses) and multiplied into 16 f32 lanes: element i goes to lane i mod 16,
//    lanes are folded pairwise at the end (block_decode.h, LaneAcc).
//  * vec_dot_q(t, w, a, n): integer inner products against quantised
//    activations, as ds4's CPU path computes them:
//      Q8_0  x Q8_0F: Σ_b (fp16(d_w)*dx) * Σ_i qs_w*qx
//      Q2_K  x Q8_K : Σ_b (y.d*fp16(d))*Σ_g sc_g*Σ_{i∈g} q*y.qs - (y.d*fp16(dmin))*Σ_g m_g*bsums[g]
//      Q4_K  x Q8_K : same with 8 sub-blocks of 32 (mins use bsums[2j] + bsums[2j+1])
//      IQ2_XXS x Q8_K: 0.125 * Σ_b (fp16(d)*y.d) * Σ_ib (2*ls+1) * Σ grid*sign*y.qs
//      MXFP4 x Q8_0F: Σ_b ((0.5*2^(e-127))*dx) * Σ_i x2[code_i]*qx_i (x2: twice the E2M1 value, an integer),
//                     the blocks' terms summed in 8 lanes (block b in lane b mod 8), folded as
//                     ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))
//    Float weight types take f32 activations and fall back to vec_dot_f32.
#include <cmath>
#include <cstring>

#include "core/assert.h"
#include "quant/block_decode.h"
#include "quant/iq2_tables.h"
#include "quant/quant.h"

namespace dsv4::quant {

namespace {

using detail::k_lanes;
using detail::LaneAcc;

// acc += Σ a[i]*b[i] for i in [0, n), lane (i mod 16) relative to a 16-aligned start.
void lane_dot_any(LaneAcc& acc, const float* a, const float* b, int64_t n) {
  const int64_t main = n - n % k_lanes;
  acc.add(a, b, main);
  for (int64_t i = main; i < n; ++i) acc.v[i % k_lanes] += a[i] * b[i];
}

// F16/BF16: convert k_chunk elements at a time, then multiply.
template <bool kIsF16>
float dot_half(const uint16_t* w, const float* x, int64_t n) {
  constexpr int64_t k_chunk = 256;  // multiple of k_lanes, so lane = i mod 16 over the whole row
  float buf[k_chunk];
  LaneAcc acc;
  for (int64_t i = 0; i < n; i += k_chunk) {
    const int64_t len = n - i < k_chunk ? n - i : k_chunk;
    if constexpr (kIsF16)
      detail::decode_f16(w + i, buf, len);
    else
      detail::decode_bf16(w + i, buf, len);
    lane_dot_any(acc, buf, x + i, len);
  }
  return acc.total();
}

// Q8_0 weights x Q8_0F activations.
float dot_q8_0_q8_0f(const BlockQ8_0* w, const BlockQ8_0F* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int i = 0; i < k_qk8_0; ++i) isum += static_cast<int32_t>(w[b].qs[i]) * a[b].qs[i];
    sum += f16_to_f32(w[b].d) * a[b].d * static_cast<float>(isum);
  }
  return sum;
}

// MXFP4 weights x Q8_0F activations (block j: element j is the low nibble of qs[j], element j + 16 the high).
// Block b's term goes to running sum b mod 8, so that a SIMD kernel adds 8 blocks' terms with one vector add
// and no dependent chain of scalar adds (a block is only 17 bytes); the lanes are folded by halves
// (detail::fold_lanes).
float dot_mxfp4_q8_0f(const BlockMXFP4* w, const BlockQ8_0F* a, int64_t nb) {
  float lane[8] = {};
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;  // |isum| <= 32 * 12 * 128
    for (int j = 0; j < k_qk_mxfp4 / 2; ++j) {
      isum += detail::k_mxfp4_x2[w[b].qs[j] & 0x0F] * static_cast<int32_t>(a[b].qs[j]);
      isum += detail::k_mxfp4_x2[w[b].qs[j] >> 4] * static_cast<int32_t>(a[b].qs[j + k_qk_mxfp4 / 2]);
    }
    lane[b % 8] += (0.5f * detail::mxfp4_scale(w[b].e)) * a[b].d * static_cast<float>(isum);
  }
  return detail::fold_lanes<8>(lane);
}

float dot_q2_k_q8_k(const BlockQ2_K* w, const BlockQ8_K* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ2_K& x = w[b];
    const BlockQ8_K& y = a[b];
    int32_t isum_min = 0;  // Σ_g m_g * bsums[g]
    for (int g = 0; g < 16; ++g) isum_min += (x.scales[g] >> 4) * static_cast<int32_t>(y.bsums[g]);
    int32_t isum = 0;  // Σ_g sc_g * Σ_{i∈g} q_i * y.qs[i]
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = x.qs + 32 * h;
      for (int s = 0; s < 4; ++s) {
        const int8_t* yq = y.qs + 128 * h + 32 * s;
        const int g = 8 * h + 2 * s;
        for (int k = 0; k < 2; ++k) {
          int32_t part = 0;
          for (int l = 16 * k; l < 16 * k + 16; ++l) part += ((q[l] >> (2 * s)) & 3) * static_cast<int32_t>(yq[l]);
          isum += (x.scales[g + k] & 0x0F) * part;
        }
      }
    }
    const float dall = y.d * f16_to_f32(x.d);
    const float dmin = y.d * f16_to_f32(x.dmin);
    sum += dall * static_cast<float>(isum) - dmin * static_cast<float>(isum_min);
  }
  return sum;
}

float dot_q4_k_q8_k(const BlockQ4_K* w, const BlockQ8_K* a, int64_t nb) {
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ4_K& x = w[b];
    const BlockQ8_K& y = a[b];
    int32_t isum = 0, isum_min = 0;
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = x.qs + 32 * c;
      const int8_t* yq = y.qs + 64 * c;
      int32_t lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        lo += (q[l] & 0x0F) * static_cast<int32_t>(yq[l]);
        hi += (q[l] >> 4) * static_cast<int32_t>(yq[32 + l]);
      }
      int sc0, m0, sc1, m1;
      detail::q4_k_scale_min(x.scales, 2 * c, sc0, m0);
      detail::q4_k_scale_min(x.scales, 2 * c + 1, sc1, m1);
      isum += sc0 * lo + sc1 * hi;
      isum_min += m0 * (y.bsums[4 * c] + y.bsums[4 * c + 1]) + m1 * (y.bsums[4 * c + 2] + y.bsums[4 * c + 3]);
    }
    const float dall = y.d * f16_to_f32(x.d);
    const float dmin = y.d * f16_to_f32(x.dmin);
    sum += dall * static_cast<float>(isum) - dmin * static_cast<float>(isum_min);
  }
  return sum;
}

float dot_iq2_xxs_q8_k(const BlockIQ2_XXS* w, const BlockQ8_K* a, int64_t nb) {
  const uint64_t* grid = iq2xxs_grid();
  const int8_t* signs = detail::iq2xxs_sign_mask();
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8_K& y = a[b];
    int32_t bsum = 0;  // Σ_ib (2 ls + 1) * Σ grid * sign * y.qs; |bsum| <= 8 * 31 * 32 * 43 * 128
    for (int ib = 0; ib < k_qk_k / 32; ++ib) {
      uint32_t wa, wb;
      detail::iq2_xxs_group_words(w[b], ib, wa, wb);
      int8_t sg[32];  // signed grid values of the group: ±{8, 25, 43}
      for (int t = 0; t < 4; ++t) {
        int8_t g[8];  // byte j = magnitude of weight j (<= 43, so it fits an int8)
        std::memcpy(g, &grid[(wa >> (8 * t)) & 0xFF], 8);
        const int8_t* m = signs + 8 * ((wb >> (7 * t)) & 127);                                  // 0 or -1 per weight
        for (int j = 0; j < 8; ++j) sg[8 * t + j] = static_cast<int8_t>((g[j] ^ m[j]) - m[j]);  // g or -g
      }
      const int8_t* yq = y.qs + 32 * ib;
      int32_t gsum = 0;
      for (int i = 0; i < 32; ++i) gsum += sg[i] * yq[i];  // |product| <= 43*128
      bsum += (2 * static_cast<int32_t>(wb >> 28) + 1) * gsum;
    }
    sum += f16_to_f32(w[b].d) * y.d * static_cast<float>(bsum);
  }
  return 0.125f * sum;
}

}  // namespace

float vec_dot_f32(GgmlType t, const void* w, const float* x, int64_t n) {
  DSV4_ASSERT(is_weight_type(t), "vec_dot_f32: %s is not a weight type", ggml_type_name(t));
  DSV4_ASSERT(n >= 0);
  if (t == GgmlType::F32) {
    DSV4_ASSERT(reinterpret_cast<uintptr_t>(w) % alignof(float) == 0, "F32 row must be 4-byte aligned");
    LaneAcc acc;
    lane_dot_any(acc, static_cast<const float*>(w), x, n);
    return acc.total();
  }
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    DSV4_ASSERT(reinterpret_cast<uintptr_t>(w) % 2 == 0, "%s row must be 2-byte aligned", ggml_type_name(t));
    const auto* h = static_cast<const uint16_t*>(w);
    return t == GgmlType::F16 ? dot_half<true>(h, x, n) : dot_half<false>(h, x, n);
  }
  LaneAcc acc;
  if (t == GgmlType::Q8_0) {
    DSV4_ASSERT(n % k_qk8_0 == 0, "Q8_0 row length %lld", static_cast<long long>(n));
    const auto* b = static_cast<const BlockQ8_0*>(w);
    float buf[k_qk8_0];
    for (int64_t i = 0; i < n / k_qk8_0; ++i) {
      detail::decode_q8_0(b[i], buf);
      acc.add(buf, x + i * k_qk8_0, k_qk8_0);
    }
    return acc.total();
  }
  if (t == GgmlType::MXFP4) {
    DSV4_ASSERT(n % k_qk_mxfp4 == 0, "MXFP4 row length %lld", static_cast<long long>(n));
    const auto* b = static_cast<const BlockMXFP4*>(w);
    float buf[k_qk_mxfp4];
    for (int64_t i = 0; i < n / k_qk_mxfp4; ++i) {
      detail::decode_mxfp4(b[i], buf);
      acc.add(buf, x + i * k_qk_mxfp4, k_qk_mxfp4);
    }
    return acc.total();
  }
  DSV4_ASSERT(n % k_qk_k == 0, "%s row length %lld", ggml_type_name(t), static_cast<long long>(n));
  const int64_t nb = n / k_qk_k;
  float buf[k_qk_k];
  if (t == GgmlType::Q2_K) {
    const auto* b = static_cast<const BlockQ2_K*>(w);
    for (int64_t i = 0; i < nb; ++i) {
      detail::decode_q2_k(b[i], buf);
      acc.add(buf, x + i * k_qk_k, k_qk_k);
    }
    return acc.total();
  }
  if (t == GgmlType::Q4_K) {
    const auto* b = static_cast<const BlockQ4_K*>(w);
    for (int64_t i = 0; i < nb; ++i) {
      detail::decode_q4_k(b[i], buf);
      acc.add(buf, x + i * k_qk_k, k_qk_k);
    }
    return acc.total();
  }
  if (t == GgmlType::IQ2_XXS) {
    const auto* b = static_cast<const BlockIQ2_XXS*>(w);
    const float* grid = detail::iq2xxs_grid_f32();
    const float* signs = detail::iq2xxs_sign_f32();
    for (int64_t i = 0; i < nb; ++i) {
      detail::decode_iq2_xxs(b[i], grid, signs, buf);
      acc.add(buf, x + i * k_qk_k, k_qk_k);
    }
    return acc.total();
  }
  DSV4_UNREACHABLE();  // is_weight_type covers exactly the branches above
}

GgmlType act_type(GgmlType t) {
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) return GgmlType::F32;
  if (t == GgmlType::Q8_0 || t == GgmlType::MXFP4) return GgmlType::Q8_0;
  if (t == GgmlType::Q2_K || t == GgmlType::Q4_K || t == GgmlType::IQ2_XXS) return GgmlType::Q8_K;
  DSV4_ASSERT(false, "act_type: %s is not a weight type", ggml_type_name(t));
  DSV4_UNREACHABLE();
}

size_t act_row_bytes(GgmlType t, int64_t n) {
  DSV4_ASSERT(n >= 0);
  const GgmlType a = act_type(t);
  if (a == GgmlType::F32) return static_cast<size_t>(n) * sizeof(float);
  if (a == GgmlType::Q8_0) {
    DSV4_ASSERT(n % k_qk8_0 == 0, "Q8_0 activation length %lld", static_cast<long long>(n));
    return static_cast<size_t>(n / k_qk8_0) * sizeof(BlockQ8_0F);
  }
  DSV4_ASSERT(n % k_qk_k == 0, "Q8_K activation length %lld", static_cast<long long>(n));
  return static_cast<size_t>(n / k_qk_k) * sizeof(BlockQ8_K);
}

void quantize_act(GgmlType t, const float* x, void* act, int64_t n) {
  const GgmlType a = act_type(t);
  if (a == GgmlType::F32) {
    if (n > 0) std::memcpy(act, x, static_cast<size_t>(n) * sizeof(float));
  } else if (a == GgmlType::Q8_0) {
    quantize_row_q8_0f(x, static_cast<BlockQ8_0F*>(act), n);
  } else {
    quantize_row_q8_k(x, static_cast<BlockQ8_K*>(act), n);
  }
}

float vec_dot_q(GgmlType t, const void* w, const void* act, int64_t n) {
  const GgmlType a = act_type(t);  // asserts t is a weight type
  if (a == GgmlType::F32) return vec_dot_f32(t, w, static_cast<const float*>(act), n);
  if (t == GgmlType::Q8_0) {
    DSV4_ASSERT(n % k_qk8_0 == 0, "Q8_0 row length %lld", static_cast<long long>(n));
    return dot_q8_0_q8_0f(static_cast<const BlockQ8_0*>(w), static_cast<const BlockQ8_0F*>(act), n / k_qk8_0);
  }
  if (t == GgmlType::MXFP4) {
    DSV4_ASSERT(n % k_qk_mxfp4 == 0, "MXFP4 row length %lld", static_cast<long long>(n));
    return dot_mxfp4_q8_0f(static_cast<const BlockMXFP4*>(w), static_cast<const BlockQ8_0F*>(act), n / k_qk_mxfp4);
  }
  DSV4_ASSERT(n % k_qk_k == 0, "%s row length %lld", ggml_type_name(t), static_cast<long long>(n));
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const int64_t nb = n / k_qk_k;
  if (t == GgmlType::Q2_K) return dot_q2_k_q8_k(static_cast<const BlockQ2_K*>(w), y, nb);
  if (t == GgmlType::Q4_K) return dot_q4_k_q8_k(static_cast<const BlockQ4_K*>(w), y, nb);
  if (t == GgmlType::IQ2_XXS) return dot_iq2_xxs_q8_k(static_cast<const BlockIQ2_XXS*>(w), y, nb);
  DSV4_UNREACHABLE();  // act_type accepted only weight types
}

// Q8_0F (formats.md §2.1): per 32 values dx = amax/127 (f32), qx = rint(x/dx) clamped to [-128, 127].
void quantize_row_q8_0f(const float* x, BlockQ8_0F* y, int64_t n) {
  DSV4_ASSERT(n >= 0 && n % k_qk8_0 == 0, "Q8_0 activation length %lld", static_cast<long long>(n));
  for (int64_t b = 0; b < n / k_qk8_0; ++b) {
    const float* xb = x + b * k_qk8_0;
    float amax = 0.0f;
    for (int i = 0; i < k_qk8_0; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float dx = amax / 127.0f;
    y[b].d = dx;
    for (int i = 0; i < k_qk8_0; ++i)
      y[b].qs[i] = dx != 0.0f ? static_cast<int8_t>(detail::round_clamp(xb[i] / dx, -128, 127)) : int8_t{0};
  }
}

// Q8_K (formats.md §2.5): max = the element of largest |x| (sign kept), iscale = -127/max,
// qs = rint(iscale*x) clamped to [-128, 127], d = 1/iscale, bsums = Σ qs per 16.
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  DSV4_ASSERT(n >= 0 && n % k_qk_k == 0, "Q8_K activation length %lld", static_cast<long long>(n));
  for (int64_t b = 0; b < n / k_qk_k; ++b) {
    const float* xb = x + b * k_qk_k;
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < k_qk_k; ++i) {
      const float ax = std::fabs(xb[i]);
      if (ax > amax) {
        amax = ax;
        max = xb[i];
      }
    }
    BlockQ8_K& o = y[b];
    if (amax == 0.0f) {
      o.d = 0.0f;
      std::memset(o.qs, 0, sizeof o.qs);
      std::memset(o.bsums, 0, sizeof o.bsums);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int i = 0; i < k_qk_k; ++i) o.qs[i] = static_cast<int8_t>(detail::round_clamp(iscale * xb[i], -128, 127));
    for (int g = 0; g < k_qk_k / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += o.qs[16 * g + i];
      o.bsums[g] = static_cast<int16_t>(s);
    }
    o.d = 1.0f / iscale;
  }
}

}  // namespace dsv4::quant
