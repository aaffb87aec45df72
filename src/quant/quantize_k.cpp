// Q2_K and Q4_K quantisers (formats.md §2.2, §2.3, §2.6).
//
// Both formats store, per 256-weight block, unsigned codes L in 0..nmax for
// sub-blocks of `len` weights and reconstruct w = (d*sc_j)*L - (dmin*m_j):
//   Q2_K: 16 sub-blocks of 16, L in 0..3,  4-bit sc/m codes (0..15)
//   Q4_K:  8 sub-blocks of 32, L in 0..15, 6-bit sc/m codes (0..63)
//
// Per block:
//  1. Per sub-block, a weighted least-squares fit x ≈ scale*L - min (scale > 0,
//     min >= 0), searched over candidate step sizes (fit_scale_min).
//     Weights: without importance (ggml's "reference" choice) Q2_K uses |x|,
//     Q4_K uses rms(sub-block) + |x|; with importance imp (one per element),
//     w = imp * sqrt(sigma2 + x^2), sigma2 = mean x^2 of the block (Q2_K) or
//     twice that (Q4_K).
//  2. The sub-block scales and mins become codes:
//     without importance, relative to the block maxima: d = max_scale/code_max,
//     sc_j = round(code_max * scale_j / max_scale) (same for mins with dmin);
//     with importance, a weighted fit of the codes (fit_codes) with the sum of
//     the sub-block's weights as the weight of each scale/min.
//  3. d and dmin are rounded to binary16 and L is recomputed from the stored
//     values: L = round((x + dmin*m_j) / (d*sc_j)) clamped to 0..nmax.
#include <cmath>
#include <cstring>

#include "core/assert.h"
#include "core/float_conv.h"
#include "quant/block_decode.h"
#include "quant/quant.h"
#include "quant/quantizers.h"

namespace dsv4::quant::detail {

namespace {

// Candidate inverse steps iscale_k = (nmax + rmin + rdelta*k) / (hi - lo), k = 0..nstep.
struct ScanParams {
  float rmin;
  float rdelta;
  int nstep;
};
// Without importance (ggml's reference ranges for these two types).
constexpr ScanParams k_scan_q2_k_ref = {-0.5f, 0.1f, 15};
constexpr ScanParams k_scan_q4_k_ref = {-1.0f, 0.1f, 20};
// With importance: a finer, wider scan.
constexpr ScanParams k_scan_weighted = {-0.9f, 0.05f, 36};

// Weighted squared error Σ w (scale*L + offset - x)^2.
float fit_error(int n, const float* x, const float* w, const uint8_t* L, float scale, float offset) {
  float e = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float diff = scale * static_cast<float>(L[i]) + offset - x[i];
    e += w[i] * diff * diff;
  }
  return e;
}

// Fits x[i] ≈ scale*L[i] - min, L[i] in 0..nmax, scale > 0, min >= 0, minimising
// Σ w[i] (scale*L[i] - min - x[i])^2. Writes L and min; returns scale (0 when x is
// constant and <= 0: then min = -x alone reconstructs it).
//
// lo = min(min x, 0) and hi = max x bound the range. The starting point maps
// [lo, hi] onto 0..nmax. Each candidate step gives codes L = round((x - lo)*iscale_k);
// for fixed codes the best (scale, offset) is the closed-form weighted
// least-squares solution
//   D = Σw Σwl² - (Σwl)²,  scale = (Σw Σwlx - Σwx Σwl)/D,  offset = (Σwl² Σwx - Σwl Σwlx)/D,
// with offset clamped to <= 0 (then scale = Σwlx/Σwl²). The lowest error wins.
float fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float& min_out, const ScanParams& p) {
  float lo = x[0], hi = x[0];
  float sw = 0.0f, swx = 0.0f;
  for (int i = 0; i < n; ++i) {
    lo = std::fmin(lo, x[i]);
    hi = std::fmax(hi, x[i]);
    sw += w[i];
    swx += w[i] * x[i];
  }
  if (lo > 0.0f) lo = 0.0f;
  if (!(hi > lo)) {
    std::memset(L, 0, static_cast<size_t>(n));
    min_out = -lo;
    return 0.0f;
  }
  const float range = hi - lo;
  float best_scale = range / static_cast<float>(nmax);
  float best_offset = lo;
  {
    const float iscale = static_cast<float>(nmax) / range;
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(round_clamp(iscale * (x[i] - lo), 0, nmax));
  }
  float best_err = fit_error(n, x, w, L, best_scale, best_offset);

  uint8_t aux[32];
  DSV4_ASSERT(n <= 32);
  for (int k = 0; k <= p.nstep; ++k) {
    const float iscale = (static_cast<float>(nmax) + p.rmin + p.rdelta * static_cast<float>(k)) / range;
    float sl = 0.0f, sl2 = 0.0f, slx = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int l = round_clamp(iscale * (x[i] - lo), 0, nmax);
      aux[i] = static_cast<uint8_t>(l);
      const float fl = static_cast<float>(l);
      sl += w[i] * fl;
      sl2 += w[i] * fl * fl;
      slx += w[i] * fl * x[i];
    }
    const float D = sw * sl2 - sl * sl;
    if (!(D > 0.0f)) continue;
    float scale = (sw * slx - swx * sl) / D;
    float offset = (sl2 * swx - sl * slx) / D;
    if (offset > 0.0f) {
      offset = 0.0f;
      scale = slx / sl2;
    }
    if (!(scale > 0.0f) || !std::isfinite(scale) || !std::isfinite(offset)) continue;
    const float err = fit_error(n, x, w, aux, scale, offset);
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_offset = offset;
      std::memcpy(L, aux, static_cast<size_t>(n));
    }
  }
  min_out = -best_offset;
  return best_scale;
}

// Weighted fit of non-negative values v[j] ≈ d * L[j], L[j] in 0..nmax; returns d >= 0.
// Scans nine step sizes d_k = vmax/(nmax + 0.1k), k = -4..4, keeps the lowest
// Σ w (v - d L)^2, then alternates d = Σwvl/Σwl² and L = round(v/d) (each step
// can only lower the error) until the codes stop changing.
float fit_codes(int n, int nmax, const float* v, const float* w, uint8_t* L) {
  float vmax = 0.0f;
  for (int j = 0; j < n; ++j) vmax = std::fmax(vmax, v[j]);
  if (!(vmax > 0.0f)) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  auto error_at = [&](float id) {
    float e = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float diff = v[j] - static_cast<float>(round_clamp(id * v[j], 0, nmax)) / id;
      e += w[j] * diff * diff;
    }
    return e;
  };
  float best_id = static_cast<float>(nmax) / vmax;
  float best_err = error_at(best_id);
  for (int k = -4; k <= 4; ++k) {
    if (k == 0) continue;
    const float id = (static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / vmax;
    const float e = error_at(id);
    if (e < best_err) {
      best_err = e;
      best_id = id;
    }
  }
  for (int j = 0; j < n; ++j) L[j] = static_cast<uint8_t>(round_clamp(best_id * v[j], 0, nmax));
  float d = 1.0f / best_id;
  for (int iter = 0; iter < 8; ++iter) {
    float swl2 = 0.0f, swvl = 0.0f;
    for (int j = 0; j < n; ++j) {
      const float fl = static_cast<float>(L[j]);
      swl2 += w[j] * fl * fl;
      swvl += w[j] * v[j] * fl;
    }
    if (!(swl2 > 0.0f) || !(swvl > 0.0f)) break;  // weights all zero where codes are non-zero
    d = swvl / swl2;
    bool changed = false;
    for (int j = 0; j < n; ++j) {
      const auto l = static_cast<uint8_t>(round_clamp(v[j] / d, 0, nmax));
      changed |= l != L[j];
      L[j] = l;
    }
    if (!changed) break;
  }
  return d;
}

// Result of steps 1-3 for one block of either type.
struct KBlock {
  float d, dmin;  // binary16-rounded super-scales
  uint16_t d16, dmin16;
  uint8_t sc[16], m[16];  // per sub-block codes
  uint8_t L[k_qk_k];      // per-weight codes
};

// kLen: sub-block length; kNmax: largest L; kCodeMax: largest sc/m code.
template <int kLen, int kNmax, int kCodeMax>
void fit_k_block(const float* x, const float* imp, float sigma_mult, const ScanParams& ref_scan, bool q4_weights,
                 KBlock& out) {
  constexpr int kSub = k_qk_k / kLen;
  float scales[kSub], mins[kSub], sw[kSub];
  float w[kLen];

  float sumx2 = 0.0f;
  for (int i = 0; i < k_qk_k; ++i) sumx2 += x[i] * x[i];
  const float sigma2 = sigma_mult * sumx2 / static_cast<float>(k_qk_k);

  for (int j = 0; j < kSub; ++j) {
    const float* xs = x + kLen * j;
    if (imp) {
      for (int l = 0; l < kLen; ++l) w[l] = imp[kLen * j + l] * std::sqrt(sigma2 + xs[l] * xs[l]);
    } else if (q4_weights) {
      float s2 = 0.0f;
      for (int l = 0; l < kLen; ++l) s2 += xs[l] * xs[l];
      const float rms = std::sqrt(s2 / static_cast<float>(kLen));
      for (int l = 0; l < kLen; ++l) w[l] = rms + std::fabs(xs[l]);
    } else {
      for (int l = 0; l < kLen; ++l) w[l] = std::fabs(xs[l]);
    }
    sw[j] = 0.0f;
    for (int l = 0; l < kLen; ++l) sw[j] += w[l];
    scales[j] = fit_scale_min(kLen, kNmax, xs, w, out.L + kLen * j, mins[j], imp ? k_scan_weighted : ref_scan);
  }

  float d, dmin;
  if (imp) {
    d = fit_codes(kSub, kCodeMax, scales, sw, out.sc);
    dmin = fit_codes(kSub, kCodeMax, mins, sw, out.m);
  } else {
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < kSub; ++j) {
      max_scale = std::fmax(max_scale, scales[j]);
      max_min = std::fmax(max_min, mins[j]);
    }
    const float is = max_scale > 0.0f ? static_cast<float>(kCodeMax) / max_scale : 0.0f;
    const float im = max_min > 0.0f ? static_cast<float>(kCodeMax) / max_min : 0.0f;
    for (int j = 0; j < kSub; ++j) {
      out.sc[j] = static_cast<uint8_t>(round_clamp(is * scales[j], 0, kCodeMax));
      out.m[j] = static_cast<uint8_t>(round_clamp(im * mins[j], 0, kCodeMax));
    }
    d = max_scale / static_cast<float>(kCodeMax);
    dmin = max_min / static_cast<float>(kCodeMax);
  }
  out.d16 = f32_to_f16(d);
  out.dmin16 = f32_to_f16(dmin);
  out.d = f16_to_f32(out.d16);
  out.dmin = f16_to_f32(out.dmin16);

  // Step 3: codes against the stored (rounded) scales.
  for (int j = 0; j < kSub; ++j) {
    uint8_t* L = out.L + kLen * j;
    const float dl = out.d * static_cast<float>(out.sc[j]);
    if (!(dl > 0.0f)) {
      std::memset(L, 0, kLen);  // the sub-block reconstructs to -dmin*m whatever L is
      continue;
    }
    const float ml = out.dmin * static_cast<float>(out.m[j]);
    for (int l = 0; l < kLen; ++l) L[l] = static_cast<uint8_t>(round_clamp((x[kLen * j + l] + ml) / dl, 0, kNmax));
  }
}

}  // namespace

void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n, const float* importance) {
  KBlock kb;
  for (int64_t b = 0; b < n / k_qk_k; ++b) {
    fit_k_block<16, 3, 15>(x + b * k_qk_k, importance ? importance + b * k_qk_k : nullptr, 1.0f, k_scan_q2_k_ref, false,
                           kb);
    BlockQ2_K& o = y[b];
    for (int j = 0; j < 16; ++j) o.scales[j] = static_cast<uint8_t>(kb.sc[j] | (kb.m[j] << 4));
    // Byte 32h + l: bits 2s..2s+1 hold element 128h + 32s + l (formats.md §2.2).
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* L = kb.L + 128 * h + l;
        o.qs[32 * h + l] = static_cast<uint8_t>(L[0] | (L[32] << 2) | (L[64] << 4) | (L[96] << 6));
      }
    o.d = kb.d16;
    o.dmin = kb.dmin16;
  }
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n, const float* importance) {
  KBlock kb;
  for (int64_t b = 0; b < n / k_qk_k; ++b) {
    fit_k_block<32, 15, 63>(x + b * k_qk_k, importance ? importance + b * k_qk_k : nullptr, 2.0f, k_scan_q4_k_ref, true,
                            kb);
    BlockQ4_K& o = y[b];
    o.d = kb.d16;
    o.dmin = kb.dmin16;
    // 6-bit packing (inverse of formats.md §2.3): sub-blocks 0..3 in the low 6 bits of
    // bytes 0..3 (scale) and 4..7 (min); sub-blocks 4..7 put their low nibbles in bytes
    // 8..11 (scale low, min high) and their top 2 bits in bits 6..7 of bytes j-4 / j.
    for (int j = 0; j < 4; ++j) {
      o.scales[j] = kb.sc[j];
      o.scales[j + 4] = kb.m[j];
    }
    for (int j = 4; j < 8; ++j) {
      o.scales[j + 4] = static_cast<uint8_t>((kb.sc[j] & 0x0F) | ((kb.m[j] & 0x0F) << 4));
      o.scales[j - 4] = static_cast<uint8_t>(o.scales[j - 4] | ((kb.sc[j] >> 4) << 6));
      o.scales[j] = static_cast<uint8_t>(o.scales[j] | ((kb.m[j] >> 4) << 6));
    }
    // Byte 32c + l: low nibble element 64c + l, high nibble element 64c + 32 + l.
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l)
        o.qs[32 * c + l] = static_cast<uint8_t>(kb.L[64 * c + l] | (kb.L[64 * c + 32 + l] << 4));
  }
}

}  // namespace dsv4::quant::detail
