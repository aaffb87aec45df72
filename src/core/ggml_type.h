// The ggml tensor element types as stored in GGUF files (formats.md §2.0):
// id, name and block geometry. Every type ggml defines is listed so that any
// GGUF can be sized and inspected; `supported` marks the ones dsv4 computes with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dsv4 {

enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  // dsv4-internal row formats of the compact KV state (src/core/kv_rows.h).
  // Never valid in a file: ggml_type_info(uint32_t) and ggml_type_from_name do not know them.
  KV_FP8 = 0x10000,  // main KV rows: FP8 e4m3 non-RoPE dims (64-blocks, e8m0 scales) + bf16 RoPE tail
  KV_FP4 = 0x10001,  // indexer rows: FP4 e2m1 (32-blocks, e8m0 scales)
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;
  uint32_t block_elems;  // elements per block (1 for plain scalars)
  uint32_t block_bytes;  // bytes per block
  bool supported;        // dsv4 can dequantize / compute with it
};

// nullopt for an id ggml does not define (or that was removed from ggml).
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);
const GgmlTypeInfo& ggml_type_info(GgmlType t);
inline const char* ggml_type_name(GgmlType t) { return ggml_type_info(t).name; }
std::optional<GgmlType> ggml_type_from_name(std::string_view name);  // case-insensitive

// Bytes of `n_elems` elements (n_elems must be a multiple of block_elems).
// KV_FP8 has no fixed block size: use ggml_row_bytes.
uint64_t ggml_type_bytes(GgmlType t, uint64_t n_elems);
// Bytes of one row of `ne0` elements.
uint64_t ggml_row_bytes(GgmlType t, uint64_t ne0);

}  // namespace dsv4
