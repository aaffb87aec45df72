// Quantisation of a linear layer's input activations (`fast` numerics; model-spec.md §9.1), and the
// FP8 block rounding it shares with the KV simulation (§9.2).
//
// Per row, consecutive blocks of B values (a row's last block may be shorter), each with its own
// power-of-two scale s:
//   FP8_128 (B = 128; DeepSeek's act_quant with ue8m0 scales): amax = max(max_i |x_i|, 1e-4),
//     s = 2^ceil(log2(amax / 448)), x_i <- e4m3(clamp(x_i / s, -448, 448)) * s (round to nearest even).
//   INT8_32 (B = 32; the int8 blocks ds4 and llama.cpp use, with a scale of three mantissa bits): amax as
//     above, s = the smallest M 2^k >= fl(amax / 127) with M in [8, 16) an integer (so s / 2^floor(log2 s)
//     is one of 1, 9/8, ..., 15/8), x_i <- clamp(rint(x_i * fl(1 / s)), -127, 127) * s (ties to even).
// Either way a block's results are integers times one power of two (e4m3: multiples of 2^-9 s below
// 448 s, four significant bits; int8: q M 2^k with |q M| <= 127 * 16, eleven bits), every one exactly an
// f16 after scaling the block into f16's range: a kernel may multiply them with one f16 product instead of
// a split, or with one int8 product of the codes q (act_int8_codes_scale recovers them from the values).
// Multiplication by s is exact. NaN stays NaN; an infinite input makes its block NaN.
// Why three mantissa bits and not a power of two: the power of two wastes up to one bit of the codes' range
// (on average |q| <= 127 / 1.44); on the golden fixture (test_golden) the mean KL of `fast` against
// `reference` fell from 0.0089 (power of two) to 0.0062, below reference's own distance to transformers.
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

// pow2_ceil(fl(amax / 127)) = 2^e without the division, for a kernel: amax (>= 1e-4, finite) = m 2^E with
// m in [1, 2) gives e = E - 6 when m <= 127 / 64, else E - 5. Exact: fl(amax / 127) <= g for a float g
// holds exactly when amax <= 127 g, since above 127 g amax is at least one of its ulps (>= 2^6 ulps of g)
// higher, so amax / 127 is more than half an ulp of g above g and cannot round down to it.
// (test_act_quant checks it against pow2_ceil(amax / 127) over every mantissa.)
DSV4_HD int act_int8_exp(float amax) {
  uint32_t u;
  __builtin_memcpy(&u, &amax, sizeof u);
  const int E = static_cast<int>(u >> 23) - 127;
  return (u & 0x7fffffu) <= 0x7e0000u ? E - 6 : E - 5;  // 0x7e0000: the mantissa bits of 127 / 64
}

// An INT8_32 block scale s = M 2^k (M in [8, 16]; 16 only from act_int8_scale_up) and fl(1 / s).
struct Int8Scale {
  int M, k;
  DSV4_HD float value() const { return static_cast<float>(M) * pow2f(k); }
  DSV4_HD float inverse() const {
#ifdef __CUDA_ARCH__
    return __frcp_rn(static_cast<float>(M)) * pow2f(-k);  // correctly rounded, as the host's 1 / M
#else
    return (1.0f / static_cast<float>(M)) * pow2f(-k);
#endif
  }
  // 2^i for i in [-126, 127], exactly.
  DSV4_HD static float pow2f(int i) {
    const uint32_t b = static_cast<uint32_t>(i + 127) << 23;
    float f;
    __builtin_memcpy(&f, &b, sizeof f);
    return f;
  }
};

// INT8_32's scale for a block's amax (>= 1e-4, finite) without a division: fl(amax / 127) lies in
// (2^(e-1), 2^e] (act_int8_exp), so s = M 2^(e-4) with M the smallest of 9 .. 16 where amax <= 127 M 2^(e-4)
// (the comparison act_int8_exp's argument makes exact; 127 M 2^(e-4) is an exact float). Returned with M in
// [8, 16): 16 2^(e-4) as 8 2^(e-3). e is in [-20, 122], so 2^k and 2^-k are normal floats.
// (test_act_quant checks it over every mantissa against the smallest grid value >= fl(amax / 127).)
DSV4_HD Int8Scale act_int8_scale(float amax) {
  const int e = act_int8_exp(amax);
  const float a = amax * Int8Scale::pow2f(4 - e);  // in (1016, 2032], exact
  int M = 9;
  for (int m = 9; m < 16; ++m) M += a > 127.0f * static_cast<float>(m);
  return M == 16 ? Int8Scale{8, e - 3} : Int8Scale{M, e - 4};
}

// A consumer's view of one block of a quantiser's output y (not its input x): the codes q_i with y_i = q_i s
// come back from amax_y = max |y_i| alone, up to one grid step. Let s_p < s be the grid value below s and s_pp
// the one below that (s_p / s >= 8 / 9, and s_pp is at least s / 16 below s_p). amax / 127 > s_p, so the
// largest code |q_max| = rint(amax / s) is more than 127 s_p / s - 1/2 and amax_y / 127 > s_pp:
// act_int8_scale(max(amax_y, 1e-4)) is s or s_p (the 1e-4 floor: a block below it was quantised at the
// floor's scale). Any s' with every y_i / s' an integer of magnitude <= 127 represents the block as exactly
// as s, so a kernel takes that candidate, checks that rint(y_i fl(1 / s')) s' == y_i for every i, and else
// takes act_int8_scale_up of it (which is s).
DSV4_HD Int8Scale act_int8_scale_up(Int8Scale s) { return s.M == 15 ? Int8Scale{8, s.k + 1} : Int8Scale{s.M + 1, s.k}; }

}  // namespace dsv4
