// dequantize_row: any weight type -> f32, one block at a time through the
// shared decoders (block_decode.h), so the values are bit-identical to the ones
// vec_dot_f32 multiplies.
#include <cstring>

#include "core/assert.h"
#include "quant/block_decode.h"
#include "quant/iq2_tables.h"
#include "quant/quant.h"

namespace dsv4::quant {

bool is_weight_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16 || t == GgmlType::Q8_0 ||
         t == GgmlType::Q2_K || t == GgmlType::Q4_K || t == GgmlType::IQ2_XXS || t == GgmlType::MXFP4;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  DSV4_ASSERT(is_weight_type(t), "dequantize_row: %s is not a weight type", ggml_type_name(t));
  DSV4_ASSERT(n >= 0);
  if (t == GgmlType::F32) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (t == GgmlType::F16 || t == GgmlType::BF16) {
    DSV4_ASSERT(reinterpret_cast<uintptr_t>(src) % 2 == 0, "%s row must be 2-byte aligned", ggml_type_name(t));
    const auto* s = static_cast<const uint16_t*>(src);
    if (t == GgmlType::F16)
      detail::decode_f16(s, dst, n);
    else
      detail::decode_bf16(s, dst, n);
    return;
  }
  if (t == GgmlType::Q8_0) {
    DSV4_ASSERT(n % k_qk8_0 == 0, "Q8_0 row length %lld", static_cast<long long>(n));
    const auto* b = static_cast<const BlockQ8_0*>(src);
    for (int64_t i = 0; i < n / k_qk8_0; ++i) detail::decode_q8_0(b[i], dst + i * k_qk8_0);
    return;
  }
  if (t == GgmlType::MXFP4) {
    DSV4_ASSERT(n % k_qk_mxfp4 == 0, "MXFP4 row length %lld", static_cast<long long>(n));
    const auto* b = static_cast<const BlockMXFP4*>(src);
    for (int64_t i = 0; i < n / k_qk_mxfp4; ++i) detail::decode_mxfp4(b[i], dst + i * k_qk_mxfp4);
    return;
  }
  DSV4_ASSERT(n % k_qk_k == 0, "%s row length %lld", ggml_type_name(t), static_cast<long long>(n));
  const int64_t nb = n / k_qk_k;
  if (t == GgmlType::Q2_K) {
    const auto* b = static_cast<const BlockQ2_K*>(src);
    for (int64_t i = 0; i < nb; ++i) detail::decode_q2_k(b[i], dst + i * k_qk_k);
    return;
  }
  if (t == GgmlType::Q4_K) {
    const auto* b = static_cast<const BlockQ4_K*>(src);
    for (int64_t i = 0; i < nb; ++i) detail::decode_q4_k(b[i], dst + i * k_qk_k);
    return;
  }
  if (t == GgmlType::IQ2_XXS) {
    const auto* b = static_cast<const BlockIQ2_XXS*>(src);
    const float* grid = detail::iq2xxs_grid_f32();
    const float* signs = detail::iq2xxs_sign_f32();
    for (int64_t i = 0; i < nb; ++i) detail::decode_iq2_xxs(b[i], grid, signs, dst + i * k_qk_k);
    return;
  }
  DSV4_UNREACHABLE();  // is_weight_type covers exactly the branches above
}

}  // namespace dsv4::quant
