// Quantisation of a linear layer's input activations (`fast` numerics; model-spec.md §9.1), and the
// FP8 block rounding it shares with the KV simulation (§9.2).
//
// Per row, consecutive blocks of B values (a row's last block may be shorter), each with its own
// power-of-two scale s:
//   FP8_128 (B = 128; DeepSeek's act_quant with ue8m0 scales): amax = max(max_i |x_i|, 1e-4),
//     s = 2^ceil(log2(amax / 448)), x_i <- e4m3(clamp(x_i / s, -448, 448)) * s (round to nearest even).
//   INT8_32 (B = 32; the int8 blocks ds4 and llama.cpp use, with a scale of three mantissa bits): amax as
//     above; on the grid G = {M 2^k: M in 8 .. 15} (s / 2^floor(log2 s) one of 1, 9/8, ..., 15/8) s0 = the
//     smallest grid value >= fl(amax / 127) and s_p the one below it; s = s_p when the block's largest value
//     would round to a multiple of s0 within s_p's range (rint(amax fl(1 / s0)) s0 <= 127 s_p: it then
//     saturates at 127 s_p, at most s0 / 2 from amax), else s0; x_i <- clamp(rint(x_i * fl(1 / s)), -127,
//     127) * s (ties to even). The rule puts the block's largest output in (127 s', 127 s] for s' the grid
//     value below the scale s it takes, so that a consumer recovers s from it alone (act_int8_scale of it).
// Either way a block's results are integers times one power of two (e4m3: multiples of 2^-9 s below
// 448 s, four significant bits; int8: q M 2^k with |q M| <= 127 * 15, eleven bits), every one exactly an
// f16 after scaling the block into f16's range: a kernel may multiply them with one f16 product instead of
// a split, or with one int8 product of the codes q (act_int8_scale recovers s from the values).
// Multiplication by s is exact. NaN stays NaN; an infinite input makes its block NaN.
// Why three mantissa bits and not a power of two: the power of two wastes up to one bit of the codes' range
// (on average |q| <= 127 / 1.44); on the golden fixture (test_golden) the mean KL of `fast` against
// `reference` fell from 0.0089 (power of two) to 0.0063, below reference's own distance to transformers.
#pragma once

#include <cmath>
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

// A scale of the INT8_32 grid, s = M 2^k (M in [8, 16)), and fl(1 / s).
struct Int8Scale {
  int M, k;
  DSV4_HD float value() const { return static_cast<float>(M) * pow2f(k); }
  DSV4_HD float inverse() const { return recip_mantissa(M) * pow2f(-k); }
  // fl(1 / M) for M in [8, 16): the correctly rounded quotient (the host's 1.0f / M, the device's
  // __frcp_rn(M)) picked from eight constants by M's low three bits. A select tree, not a division: the
  // device's correctly rounded reciprocal carries a branch to its slow path, which kept a warp quantising
  // 32 blocks in registers (the q norm's fused quantiser) from interleaving them.
  DSV4_HD static float recip_mantissa(int M) {
    const bool b0 = (M & 1) != 0, b1 = (M & 2) != 0;
    const float r8 = b0 ? 1.0f / 9.0f : 1.0f / 8.0f, r10 = b0 ? 1.0f / 11.0f : 1.0f / 10.0f;
    const float r12 = b0 ? 1.0f / 13.0f : 1.0f / 12.0f, r14 = b0 ? 1.0f / 15.0f : 1.0f / 14.0f;
    const float lo = b1 ? r10 : r8, hi = b1 ? r14 : r12;
    return (M & 4) != 0 ? hi : lo;
  }
  DSV4_HD Int8Scale below() const { return M == 8 ? Int8Scale{15, k - 1} : Int8Scale{M - 1, k}; }
  // 2^i for i in [-126, 127], exactly.
  DSV4_HD static float pow2f(int i) {
    const uint32_t b = static_cast<uint32_t>(i + 127) << 23;
    float f;
    __builtin_memcpy(&f, &b, sizeof f);
    return f;
  }
};

// The smallest grid value >= fl(amax / 127) for amax >= 1e-4, finite, without a division: fl(amax / 127)
// lies in (2^(e-1), 2^e] (act_int8_exp), so it is M 2^(e-4) with M the smallest of 9 .. 16 where amax <= 127
// M 2^(e-4) (the comparison act_int8_exp's argument makes exact; 127 M 2^(e-4) is an exact float): M from an
// estimate of a / 127 corrected by one exact comparison each way (the estimate's error is far below one).
// Returned with M in [8, 16): 16 2^(e-4) as 8 2^(e-3). e is in [-20, 122], so 2^k and 2^-k are normal floats.
// (test_act_quant checks it over every mantissa against the smallest grid value >= fl(amax / 127).)
// It is also how a consumer recovers a quantised block's scale: act_int8_scale(max(amax_y, 1e-4)) of its
// largest output |y| (the rule in the header comment; below the 1e-4 floor the scale is the floor's).
DSV4_HD Int8Scale act_int8_scale(float amax) {
  const int e = act_int8_exp(amax);
  const float a = amax * Int8Scale::pow2f(4 - e);  // in (1016, 2032], exact
  int M = static_cast<int>(a * (1.0f / 127.0f)) + 1;
  M -= a <= 127.0f * static_cast<float>(M - 1);
  M += a > 127.0f * static_cast<float>(M);
  return M == 16 ? Int8Scale{8, e - 3} : Int8Scale{M, e - 4};
}

// A block's scale s and fl(1 / s), as the quantiser multiplies by them and the int8 kernels use them.
struct Int8Step {
  float scale, inv;
};

// The quantiser's scale of a block with amax = max(1e-4, max_i |x_i|) (finite): act_int8_scale, or the grid
// value below it when the largest value's code there fits the lower scale's range (the header's rule; never
// below the floor's scale: at amax = 1e-4 the code is 120 of M = 14, above 127 13 / 14 = 117.9). The kept
// scale's reciprocal is the one the rule already computed.
DSV4_HD Int8Step act_int8_block_scale(float amax) {
  const Int8Scale s0 = act_int8_scale(amax), sp = s0.below();
  const float v0 = s0.value(), inv0 = s0.inverse(), vp = sp.value();
  if (rintf(amax * inv0) * v0 <= 127.0f * vp) return {vp, sp.inverse()};
  return {v0, inv0};
}

}  // namespace dsv4
