// Quantisation of a linear layer's input activations (`fast` numerics; model-spec.md §9.1), and the
// FP8 block rounding it shares with the KV simulation (§9.2).
//
// Per row, consecutive blocks of B values (a row's last block may be shorter), each with its own
// power-of-two scale s:
//   FP8_128 (B = 128; DeepSeek's act_quant with ue8m0 scales): amax = max(max_i |x_i|, 1e-4),
//     s = 2^ceil(log2(amax / 448)), x_i <- e4m3(clamp(x_i / s, -448, 448)) * s (round to nearest even).
//   INT8_32 (B = 32; the int8 blocks ds4 and llama.cpp use, with a power-of-two scale): amax as above,
//     s = 2^ceil(log2(amax / 127)), x_i <- clamp(rint(x_i / s), -127, 127) * s (ties to even).
// Either way a block's results are integers times one power of two (e4m3: multiples of 2^-9 s below
// 448 s, four significant bits; int8: |q| <= 127), every one exactly an f16 after scaling the block
// into f16's range: a kernel may multiply them with one f16 (or int8) product instead of a split.
// Division by s and multiplication by it are exact. NaN stays NaN; an infinite input makes its block NaN.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/hd.h"

namespace dsv4 {

enum class ActQuant { NONE, FP8_128, INT8_32 };

const char* act_quant_name(ActQuant q);  // "none", "fp8-128", "int8-32"
expected<ActQuant> act_quant_from_name(std::string_view s);
int act_quant_block(ActQuant q);  // B (0 for NONE)

// FP8 block rounding of x[0, n) as one block: amax = max(|x_i|, 1e-4), s = 2^ceil(log2(amax / 448)),
// x_i <- e4m3(clamp(x_i / s, -448, 448)) * s.
void fp8_block_round(float* x, int64_t n);

// One row of d values, in place (the blocks described above).
void act_quant_row(float* x, int64_t d, ActQuant q);

// INT8_32's scale exponent e (s = 2^e = pow2_ceil(amax / 127), the float division rounded first) without the
// division, for a kernel: amax (the block's, >= 1e-4, finite) = m 2^E with m in [1, 2) gives e = E - 6 when
// m <= 127 / 64, else E - 5. Exact: fl(amax / 127) <= 2^j holds exactly when amax <= 127 2^j, since the
// quotient rounds down to 2^j only from within half an ulp of 2^j above it, and a float amax above 127 2^j
// is at least one of its ulps (2^(j - 17)) above it, more than 127 times that half ulp (2^(j - 24)).
// (test_core checks it against pow2_ceil(amax / 127) over every mantissa.)
DSV4_HD int act_int8_exp(float amax) {
  uint32_t u;
  __builtin_memcpy(&u, &amax, sizeof u);
  const int E = static_cast<int>(u >> 23) - 127;
  return (u & 0x7fffffu) <= 0x7e0000u ? E - 6 : E - 5;  // 0x7e0000: the mantissa bits of 127 / 64
}

}  // namespace dsv4
