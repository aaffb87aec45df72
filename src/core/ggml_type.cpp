#include "core/ggml_type.h"

#include <cctype>

#include "core/assert.h"
#include "core/kv_rows.h"

namespace dsv4 {

namespace {
constexpr GgmlTypeInfo k_types[] = {
    {GgmlType::F32, "F32", 1, 4, true},
    {GgmlType::F16, "F16", 1, 2, true},
    {GgmlType::Q4_0, "Q4_0", 32, 18, false},
    {GgmlType::Q4_1, "Q4_1", 32, 20, false},
    {GgmlType::Q5_0, "Q5_0", 32, 22, false},
    {GgmlType::Q5_1, "Q5_1", 32, 24, false},
    {GgmlType::Q8_0, "Q8_0", 32, 34, true},
    {GgmlType::Q8_1, "Q8_1", 32, 36, false},
    {GgmlType::Q2_K, "Q2_K", 256, 84, true},
    {GgmlType::Q3_K, "Q3_K", 256, 110, false},
    {GgmlType::Q4_K, "Q4_K", 256, 144, true},
    {GgmlType::Q5_K, "Q5_K", 256, 176, false},
    {GgmlType::Q6_K, "Q6_K", 256, 210, false},
    {GgmlType::Q8_K, "Q8_K", 256, 292, false},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66, true},
    {GgmlType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98, false},
    {GgmlType::IQ1_S, "IQ1_S", 256, 50, false},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18, false},
    {GgmlType::IQ3_S, "IQ3_S", 256, 110, false},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82, false},
    {GgmlType::IQ4_XS, "IQ4_XS", 256, 136, false},
    {GgmlType::I8, "I8", 1, 1, false},
    {GgmlType::I16, "I16", 1, 2, false},
    {GgmlType::I32, "I32", 1, 4, true},
    {GgmlType::I64, "I64", 1, 8, false},
    {GgmlType::F64, "F64", 1, 8, false},
    {GgmlType::IQ1_M, "IQ1_M", 256, 56, false},
    {GgmlType::BF16, "BF16", 1, 2, true},
    {GgmlType::TQ1_0, "TQ1_0", 256, 54, false},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66, false},
    {GgmlType::MXFP4, "MXFP4", 32, 17, true},
};
// Internal KV row formats (kv_rows.h). KV_FP8's size depends on the row
// width, not on a block: block_bytes 0 marks it (ggml_row_bytes knows it).
constexpr GgmlTypeInfo k_internal_types[] = {
    {GgmlType::KV_FP8, "KV_FP8", 64, 0, true},
    {GgmlType::KV_FP4, "KV_FP4", 32, 17, true},
};
}  // namespace

uint64_t ggml_type_bytes(GgmlType t, uint64_t n_elems) {
  DSV4_ASSERT(t != GgmlType::KV_FP8, "KV_FP8 is sized per row (ggml_row_bytes)");
  const auto& i = ggml_type_info(t);
  return n_elems / i.block_elems * i.block_bytes;
}

uint64_t ggml_row_bytes(GgmlType t, uint64_t ne0) {
  if (t == GgmlType::KV_FP8) return kv_fp8_row_bytes(static_cast<int64_t>(ne0));
  return ggml_type_bytes(t, ne0);
}

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id) {
  for (const auto& t : k_types)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const GgmlTypeInfo& ggml_type_info(GgmlType type) {
  for (const auto& t : k_types)
    if (t.type == type) return t;
  for (const auto& t : k_internal_types)
    if (t.type == type) return t;
  DSV4_UNREACHABLE();
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  for (const auto& t : k_types) {
    std::string_view n = t.name;
    if (n.size() != name.size()) continue;
    bool eq = true;
    for (size_t i = 0; i < n.size() && eq; ++i)
      eq = std::toupper(static_cast<unsigned char>(n[i])) == std::toupper(static_cast<unsigned char>(name[i]));
    if (eq) return t.type;
  }
  return std::nullopt;
}

}  // namespace dsv4
