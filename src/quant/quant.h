// Quantised block formats (formats.md §2): layouts, dequantisation, reference
// dot products and quantisers for the weight types dsv4 computes with.
//
// Weight types: F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS, MXFP4 (and I32 for
// the hash-routing table, which is never dotted).
//
// Two dot-product families:
//  * vec_dot_f32(type, w, x, n): weight row (any weight type) against an f32
//    activation row, f32 accumulation of dequantised weights. This is the exact
//    reference the CPU backend and the CUDA kernels are tested against.
//  * vec_dot_q(type, w, a, n): weight row against a quantised activation row in
//    the activation format act_type(type) (Q8_0 with an f32 scale for Q8_0 and
//    MXFP4 weights; Q8_K for Q2_K/Q4_K/IQ2_XXS; f32 for float weights), integer
//    inner products as ds4's CPU path computes them (MXFP4: as its CUDA decode
//    path does, Q8_1 there; ds4's CPU has no MXFP4 integer dot).
// All lengths `n` are element counts and must be multiples of the block size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/ggml_type.h"

namespace dsv4::quant {

constexpr int k_qk8_0 = 32;
constexpr int k_qk_k = 256;
constexpr int k_qk_mxfp4 = 32;

#pragma pack(push, 1)
struct BlockQ8_0 {  // 34 bytes
  uint16_t d;       // binary16 scale
  int8_t qs[k_qk8_0];
};
struct BlockQ2_K {         // 84 bytes
  uint8_t scales[16];      // low nibble scale code, high nibble min code, per 16-element sub-block
  uint8_t qs[k_qk_k / 4];  // 2-bit quants (see formats.md §2.2 for placement)
  uint16_t d;              // binary16 super-scale for scales
  uint16_t dmin;           // binary16 super-scale for mins
};
struct BlockQ4_K {  // 144 bytes
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // 8 six-bit scales + 8 six-bit mins, packed
  uint8_t qs[k_qk_k / 2];
};
struct BlockIQ2_XXS {  // 66 bytes
  uint16_t d;
  uint16_t qs[k_qk_k / 8];  // 8 groups x (two LE u32: 4 grid indices | 4x7-bit sign indices + 4-bit scale)
};
struct BlockMXFP4 {            // 17 bytes (GGUF type 39; ds4-variants-mtp-dspark.md §1.1)
  uint8_t e;                   // E8M0 scale 2^(e - 127) (e = 0: 2^-127; e = 255: +inf, as ds4 reads it)
  uint8_t qs[k_qk_mxfp4 / 2];  // E2M1 codes: low nibble of qs[j] = element j, high nibble = element j + 16
};
// Activation blocks (never stored in files).
struct BlockQ8_0F {  // Q8_0 activation with an f32 scale (ds4 CPU convention), 36 bytes
  float d;
  int8_t qs[k_qk8_0];
};
struct BlockQ8_K {  // 292 bytes
  float d;
  int8_t qs[k_qk_k];
  int16_t bsums[k_qk_k / 16];  // sum of qs over each 16-element group
};
#pragma pack(pop)

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockIQ2_XXS) == 66);
static_assert(sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ8_0F) == 36);
static_assert(sizeof(BlockQ8_K) == 292);

// True for the types this module can dequantise and dot.
bool is_weight_type(GgmlType t);
// True for the types quantize_row can produce.
bool can_quantize(GgmlType t);

// dst[0..n) = dequantised src (n elements of type t).
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

// Quantises n floats to type t. `importance` (n weights >= 0, may be null)
// steers the error-weighted searches of Q2_K, Q4_K and IQ2_XXS (Q8_0 and the
// float types ignore it); IQ2_XXS without importance weights element i by
// sqrt(mean(x^2) + x_i^2) (an importance of 1). F32/F16/BF16 convert directly
// (round to nearest even).
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n, const float* importance = nullptr);

// Exact reference: sum_i dequant(w)[i] * x[i], f32 accumulation in a fixed
// order: product i is added to lane (i mod 16), then the 16 lanes are folded
// pairwise (lane j += lane j+8, then +4, +2, +1). Weights are bit-identical to
// dequantize_row's output.
float vec_dot_f32(GgmlType t, const void* w, const float* x, int64_t n);

// Activation format for the quantised dot of weight type t.
GgmlType act_type(GgmlType t);  // Q8_0, MXFP4 -> Q8_0 (stored as BlockQ8_0F), K/IQ types -> Q8_K, floats -> F32
size_t act_row_bytes(GgmlType t, int64_t n);
void quantize_act(GgmlType t, const float* x, void* act, int64_t n);
float vec_dot_q(GgmlType t, const void* w, const void* act, int64_t n);

// Activation quantisers (exposed for tests and backends).
void quantize_row_q8_0f(const float* x, BlockQ8_0F* y, int64_t n);
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n);

// IQ2_XXS tables, generated at compile time from the compact code list (formats.md §2.4).
const uint64_t* iq2xxs_grid();   // [256], byte j of entry i = magnitude of weight j
const uint8_t* iq2xxs_signs();   // [128], bit j set = weight j negative (bit 7 = parity)
const uint16_t* iq2xxs_kgrid();  // [256], eight 2-bit codes per entry

}  // namespace dsv4::quant
