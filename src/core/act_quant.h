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

}  // namespace dsv4
