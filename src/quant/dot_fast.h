// SIMD versions of vec_dot_q (quant.h) for the weight types of the routed
// experts, used where the host computes experts itself (backend/host_experts).
//
// vec_dot_q_fast(t, w, a, n) returns exactly vec_dot_q(t, w, a, n), bit for
// bit: each block's integer inner products are exact in any order (the SIMD
// lanes sum int8 x int8 products in int16/int32 without overflow, see the
// bounds in dot_fast.cpp), and the per-block float scaling and the running sum
// over blocks are the reference's expressions in the reference's order
// (compiled without contraction into FMAs).
//
// IQ2_XXS, Q2_K, Q4_K and MXFP4 take the AVX2 kernels when the CPU has AVX2, and
// IQ2_XXS, Q2_K and MXFP4 AVX-512 ones when it has AVX-512 BW, VL, VBMI and VNNI
// (checked once at run time); other types, other CPUs and non-x86 builds take vec_dot_q.
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace dsv4::quant {

float vec_dot_q_fast(GgmlType t, const void* w, const void* act, int64_t n);

// The kernels' instruction sets, narrowest first.
enum class DotIsa { SCALAR, AVX2, AVX512 };

// The kernels vec_dot_q_fast takes on this CPU: "avx512+avx2", "avx2" or "scalar".
const char* dot_fast_isa();

// Test hook: vec_dot_q_fast takes no kernel wider than `cap` (SCALAR: the
// reference), to time or compare them on one machine. Not thread-safe against
// concurrent dots.
void set_dot_fast_isa(DotIsa cap);

}  // namespace dsv4::quant
