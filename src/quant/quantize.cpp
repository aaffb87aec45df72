// quantize_row: type dispatch, the float conversions (F32/F16/BF16, round to
// nearest even via core/float_conv.h), the Q8_0 quantiser (formats.md §2.1) and
// the MXFP4 one (for synthetic models and tests: published MXFP4 files are
// repacked losslessly from the checkpoint's own FP4 codes).
// The K-quant and IQ2_XXS searches live in quantize_k.cpp / quantize_iq2_xxs.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/assert.h"
#include "core/float_conv.h"
#include "quant/quant.h"
#include "quant/quantizers.h"

namespace dsv4::quant {

namespace detail {

// Q8_0: amax = max|x|, d = amax/127 (stored as binary16), qs = round_half_away(x * (1/d)),
// with the reciprocal of the unrounded d (ggml's reference); qs = 0 when d = 0.
void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / k_qk8_0; ++b) {
    const float* xb = x + b * k_qk8_0;
    float amax = 0.0f;
    for (int i = 0; i < k_qk8_0; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    for (int i = 0; i < k_qk8_0; ++i) {
      // |x*id| <= 127 up to rounding; the clamp only guards against that last ulp.
      const float q = std::round(xb[i] * id);
      y[b].qs[i] = static_cast<int8_t>(std::fmin(std::fmax(q, -127.0f), 127.0f));
    }
  }
}

// MXFP4: per 32 values the smallest power-of-two scale 2^E with max|x| / 2^E <= 6 (the largest E2M1
// magnitude): E = ceil(log2(max|x| / 6)), e = E + 127 clamped to [1, 254] (127 for an all-zero block); each
// value is the E2M1 magnitude nearest |x| / 2^E (ties to the even code; beyond 6: 6; NaN: 0) with x's sign.
void quantize_row_mxfp4(const float* x, BlockMXFP4* y, int64_t n) {
  constexpr float k_mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int64_t b = 0; b < n / k_qk_mxfp4; ++b) {
    const float* xb = x + b * k_qk_mxfp4;
    float amax = 0.0f;
    for (int i = 0; i < k_qk_mxfp4; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
    int e = 127;
    if (amax > 0.0f && std::isfinite(amax)) {
      int ex = 0;
      const float m = std::frexp(amax / 6.0f, &ex);  // amax / 6 = m * 2^ex, m in [0.5, 1)
      e = std::clamp((m == 0.5f ? ex - 1 : ex) + 127, 1, 254);
    }
    const float inv = std::ldexp(1.0f, 127 - e);  // 1 / 2^(e - 127), a power of two
    uint8_t code[k_qk_mxfp4];
    for (int i = 0; i < k_qk_mxfp4; ++i) {
      const float v = std::fabs(xb[i]) * inv;
      int best = 0;
      if (v >= 6.0f) {
        best = 7;
      } else if (v > 0.0f) {  // NaN compares false: code 0
        for (int c = 1; c < 8; ++c) {
          const float d = std::fabs(v - k_mag[c]), db = std::fabs(v - k_mag[best]);
          if (d < db || (d == db && c % 2 == 0)) best = c;
        }
      }
      code[i] = static_cast<uint8_t>(best | (best != 0 && std::signbit(xb[i]) ? 8 : 0));
    }
    y[b].e = static_cast<uint8_t>(e);
    for (int j = 0; j < k_qk_mxfp4 / 2; ++j)
      y[b].qs[j] = static_cast<uint8_t>(code[j] | (code[j + k_qk_mxfp4 / 2] << 4));
  }
}

}  // namespace detail

bool can_quantize(GgmlType t) { return is_weight_type(t); }

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n, const float* importance) {
  DSV4_ASSERT(can_quantize(t), "quantize_row: cannot produce %s", ggml_type_name(t));
  DSV4_ASSERT(n >= 0);
  if (t == GgmlType::F32) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    DSV4_ASSERT(reinterpret_cast<uintptr_t>(dst) % 2 == 0, "%s row must be 2-byte aligned", ggml_type_name(t));
    auto* h = static_cast<uint16_t*>(dst);
    if (t == GgmlType::F16)
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
    else
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
    return;
  }
  if (t == GgmlType::Q8_0) {
    // Q8_0 has no search, so `importance` does not apply.
    DSV4_ASSERT(n % k_qk8_0 == 0, "Q8_0 row length %lld", static_cast<long long>(n));
    detail::quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
    return;
  }
  if (t == GgmlType::MXFP4) {
    // No search (a power-of-two scale per 32 values): `importance` does not apply.
    DSV4_ASSERT(n % k_qk_mxfp4 == 0, "MXFP4 row length %lld", static_cast<long long>(n));
    detail::quantize_row_mxfp4(src, static_cast<BlockMXFP4*>(dst), n);
    return;
  }
  DSV4_ASSERT(n % k_qk_k == 0, "%s row length %lld", ggml_type_name(t), static_cast<long long>(n));
  if (t == GgmlType::Q2_K) {
    detail::quantize_row_q2_k(src, static_cast<BlockQ2_K*>(dst), n, importance);
    return;
  }
  if (t == GgmlType::Q4_K) {
    detail::quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), n, importance);
    return;
  }
  if (t == GgmlType::IQ2_XXS) {
    detail::quantize_row_iq2_xxs(src, static_cast<BlockIQ2_XXS*>(dst), n, importance);
    return;
  }
  DSV4_UNREACHABLE();  // can_quantize covers exactly the branches above
}

}  // namespace dsv4::quant
