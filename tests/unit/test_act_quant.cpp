// Activation quantisation of `fast` numerics (core/act_quant.h) against an
// independent formulation: every output is the nearest point of the block's
// grid (all 256 e4m3 codes times the block's scale, or the integers -127..127
// times it), found by exhaustive search, ties to the even code; plus the scale
// rule's edges (exact powers of two, the 1e-4 floor), block independence, a
// short last block, and NaN/Inf.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/act_quant.h"
#include "core/float_conv.h"

using namespace dsv4;

namespace {

// The nearest of the codes' values to v (ties: the code whose lowest mantissa bit is 0).
float nearest_e4m3(float v) {
  float best = 0.0f, best_d = std::numeric_limits<float>::infinity();
  int best_code = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN codes of e4m3fn
    const float g = fp8_e4m3_decode(static_cast<uint8_t>(c));
    const float d = std::fabs(g - v);
    if (d < best_d || (d == best_d && (best_code & 1) && !(c & 1))) best = g, best_d = d, best_code = c;
  }
  return best;
}

// Block [b0, b1) of x quantised by exhaustive search over the grid of its scale.
void oracle_block(const std::vector<float>& x, std::vector<float>& out, size_t b0, size_t b1, ActQuant q) {
  float amax = 1e-4f;
  for (size_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float qmax = q == ActQuant::FP8_128 ? 448.0f : 127.0f;
  // s = the smallest power of two (fp8) or M 2^k, M in 8 .. 15 (int8) with amax / s <= qmax; int8 scales
  // x by fl(1 / s), and takes the grid value below s when amax's nearest multiple of s is at most 127 times it.
  float s = 0x1p-126f;
  if (q == ActQuant::FP8_128) {
    while (amax / s > qmax) s *= 2.0f;
  } else {
    float below = 0.0f;
    for (int k = -40, M = 8; amax / (s = std::ldexp(static_cast<float>(M), k)) > qmax; below = s)
      if (++M == 16) M = 8, ++k;
    if (std::nearbyint(amax * (1.0f / s)) * s <= 127.0f * below) s = below;
  }
  for (size_t i = b0; i < b1; ++i) {
    const float v = q == ActQuant::FP8_128 ? x[i] / s : x[i] * (1.0f / s);
    float r;
    if (q == ActQuant::FP8_128) {
      r = nearest_e4m3(v);
    } else {
      r = std::floor(v);
      const float frac = v - r;
      if (frac > 0.5f || (frac == 0.5f && std::fmod(r, 2.0f) != 0.0f)) r += 1.0f;
      r = std::clamp(r, -127.0f, 127.0f);
    }
    out[i] = std::copysign(r * s, x[i]);
  }
}

std::vector<float> oracle(const std::vector<float>& x, ActQuant q) {
  std::vector<float> out(x.size());
  const size_t B = static_cast<size_t>(act_quant_block(q));
  for (size_t b0 = 0; b0 < x.size(); b0 += B) oracle_block(x, out, b0, std::min(x.size(), b0 + B), q);
  return out;
}

std::vector<float> quantised(std::vector<float> x, ActQuant q) {
  act_quant_row(x.data(), static_cast<int64_t>(x.size()), q);
  return x;
}

void expect_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(f32_bits(a[i]), f32_bits(b[i])) << what << " at " << i << ": " << a[i] << " vs " << b[i];
}

}  // namespace

TEST(ActQuant, NamesAndBlocks) {
  for (ActQuant q : {ActQuant::NONE, ActQuant::FP8_128, ActQuant::INT8_32})
    EXPECT_EQ(*act_quant_from_name(act_quant_name(q)), q);
  EXPECT_FALSE(act_quant_from_name("fp4").has_value());
  EXPECT_EQ(act_quant_block(ActQuant::FP8_128), 128);
  EXPECT_EQ(act_quant_block(ActQuant::INT8_32), 32);
  std::vector<float> x = {1.3f, -2.7f};
  EXPECT_EQ(quantised(x, ActQuant::NONE), x);
}

TEST(ActQuant, MatchesExhaustiveNearestOnRandomRows) {
  std::mt19937 g(7);
  for (ActQuant q : {ActQuant::FP8_128, ActQuant::INT8_32})
    for (int trial = 0; trial < 40; ++trial) {
      // Widths with short last blocks; magnitudes from 1e-8 to 1e6, some rows spanning decades.
      const size_t d = 1 + g() % 700;
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::uniform_real_distribution<float> ex(-8.0f, 6.0f);
      const float base = std::pow(10.0f, ex(g));
      std::vector<float> x(d);
      for (auto& v : x) v = nd(g) * base * (trial % 3 == 0 ? std::pow(10.0f, ex(g) / 3.0f) : 1.0f);
      expect_bits(quantised(x, q), oracle(x, q), act_quant_name(q));
    }
}

TEST(ActQuant, ScaleRuleAtItsEdges) {
  // amax exactly 448: s = 1, the smallest subnormal survives; just above: s = 2, it rounds to 0 (a tie).
  std::vector<float> x(128, 0.0f);
  x[0] = 448.0f;
  x[1] = 0x1p-9f;
  EXPECT_EQ(quantised(x, ActQuant::FP8_128)[1], 0x1p-9f);
  x[0] = 449.0f;
  const auto y = quantised(x, ActQuant::FP8_128);
  EXPECT_EQ(y[0], 448.0f);  // 224.5 -> 224 (quantum 16), times 2
  EXPECT_EQ(y[1], 0.0f);
  // int8: amax 127 -> s = 1 (2.5 ties to 2, 3.5 to 4); amax 127.5 -> s = 2.
  std::vector<float> z(32, 0.0f);
  z[0] = 127.0f, z[1] = 2.5f, z[2] = 3.5f, z[3] = -0.5f;
  const auto zq = quantised(z, ActQuant::INT8_32);
  EXPECT_EQ(zq[1], 2.0f);
  EXPECT_EQ(zq[2], 4.0f);
  EXPECT_EQ(f32_bits(zq[3]), f32_bits(-0.0f));
  z[0] = 127.5f;  // s = 9/8: 127.5 / s = 113.3 -> 113 (113 * 9/8 = 127.125 > 127 = 127 s_p)
  EXPECT_EQ(quantised(z, ActQuant::INT8_32)[0], 127.125f);
  EXPECT_EQ(quantised(z, ActQuant::INT8_32)[1], 2.25f);  // 2.5 / s = 2.22 -> 2, times 9/8
  z[0] = 127.0f * 1.125f;                                // s = 9/8 still, exactly 127 s
  EXPECT_EQ(quantised(z, ActQuant::INT8_32)[0], z[0]);
  z[0] = std::nextafter(z[0], 200.0f);  // s0 = 5/4, but z[0] / s0 = 114.3 -> 114 and 114 * 5/4 <= 127 * 9/8:
  EXPECT_EQ(quantised(z, ActQuant::INT8_32)[0], 127.0f * 1.125f);  // s = 9/8, z[0] saturates at 127 s
  EXPECT_EQ(quantised(z, ActQuant::INT8_32)[1], 2.25f);
  z[0] = 143.5f;  // 143.5 / (5/4) = 114.8 -> 115, 115 * 5/4 = 143.75 > 142.875: s = 5/4
  EXPECT_EQ(quantised(z, ActQuant::INT8_32)[0], 143.75f);
  EXPECT_EQ(quantised(z, ActQuant::INT8_32)[1], 2.5f);  // 2.5 / 1.25 = 2 exactly
  // The 1e-4 floor: an all-zero block stays zero, a block of 1e-6 uses s = 2^-22 (not its own amax).
  EXPECT_EQ(quantised(std::vector<float>(128, 0.0f), ActQuant::FP8_128), std::vector<float>(128, 0.0f));
  const auto tiny = quantised(std::vector<float>(4, 1e-6f), ActQuant::FP8_128);
  EXPECT_EQ(tiny[0], fp8_e4m3_round(1e-6f / 0x1p-22f) * 0x1p-22f);
  EXPECT_NE(tiny[0], 1e-6f);
}

TEST(ActQuant, BlocksAreIndependentAndTheLastMayBeShort) {
  std::vector<float> x(130, 0.3f);
  x[5] = 1000.0f;  // only the first block's scale grows
  const auto y = quantised(x, ActQuant::FP8_128);
  EXPECT_EQ(y[6], fp8_e4m3_round(0.3f / 4.0f) * 4.0f);
  EXPECT_EQ(y[128], fp8_e4m3_round(0.3f / 0x1p-10f) * 0x1p-10f);  // 2 values: amax 0.3, s = 2^-10
  EXPECT_EQ(y[129], y[128]);
}

TEST(ActQuant, NanStaysAndInfinityPoisonsOnlyItsBlock) {
  for (ActQuant q : {ActQuant::FP8_128, ActQuant::INT8_32}) {
    const size_t B = static_cast<size_t>(act_quant_block(q));
    std::vector<float> x(2 * B, 1.5f);
    const float one = quantised(x, q)[0];  // 1.5 in a block of 1.5s (int8: 118 * 13/1024)
    x[3] = std::numeric_limits<float>::quiet_NaN();
    const auto y = quantised(x, q);
    EXPECT_TRUE(std::isnan(y[3]));
    EXPECT_EQ(y[4], one);
    x[3] = -std::numeric_limits<float>::infinity();
    const auto z = quantised(x, q);
    for (size_t i = 0; i < B; ++i) EXPECT_TRUE(std::isnan(z[i])) << i;
    for (size_t i = B; i < 2 * B; ++i) EXPECT_EQ(z[i], one) << i;
  }
}

TEST(ActQuant, DivisionFreeInt8ScaleIsTheDefinitions) {
  // act_int8_exp (the kernels' form) against pow2_ceil(amax / 127) (the reference's): every mantissa in the
  // binades of 1 and of the 1e-4 floor, and 64 random mantissas in every binade from there to FLT_MAX.
  // act_int8_scale (M 2^k) against the definition: the smallest grid value >= fl(amax / 127), i.e. at least
  // it while the grid value below it is not.
  auto check = [](float amax) {
    const float t = amax / 127.0f, s = pow2_ceil(t);
    const int e = act_int8_exp(amax);
    if (std::ldexp(1.0f, e) != s) {
      ADD_FAILURE() << "amax " << amax << ": 2^" << e << " vs " << s;
      return false;
    }
    const Int8Scale sc = act_int8_scale(amax);
    const float g = sc.value(), below = sc.M == 8 ? std::ldexp(15.0f, sc.k - 1) : std::ldexp(sc.M - 1.0f, sc.k);
    if (sc.M < 8 || sc.M > 15 || g != std::ldexp(static_cast<float>(sc.M), sc.k) || !(g >= t) || !(below < t) ||
        sc.inverse() != 1.0f / g) {
      ADD_FAILURE() << "amax " << amax << ": scale " << sc.M << " 2^" << sc.k << " for amax / 127 = " << t;
      return false;
    }
    return true;
  };
  for (const int E : {0, -14}) {
    const uint32_t base = static_cast<uint32_t>(E + 127) << 23;
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      float a;
      const uint32_t u = base | m;
      std::memcpy(&a, &u, 4);
      if (a >= 1e-4f && !check(a)) return;
    }
  }
  std::mt19937 g(5);
  for (int E = -14; E <= 127; ++E)
    for (int i = 0; i < 64; ++i) {
      const uint32_t u = (static_cast<uint32_t>(E + 127) << 23) | (g() & 0x7fffffu);
      float a;
      std::memcpy(&a, &u, 4);
      if (a >= 1e-4f && !check(a)) return;
    }
  EXPECT_EQ(act_int8_exp(127.0f), 0);
  EXPECT_EQ(act_int8_scale(127.0f).value(), 1.0f);
  EXPECT_EQ(act_int8_scale(std::nextafter(127.0f, 200.0f)).value(), 1.125f);
  EXPECT_EQ(act_int8_exp(std::nextafter(127.0f, 200.0f)), 1);
  EXPECT_EQ(act_int8_exp(1e-4f), -20);
}

TEST(ActQuant, MantissaReciprocalsAreTheCorrectlyRoundedQuotients) {
  // The select tree of Int8Scale::recip_mantissa against the division, bitwise, for every M of the grid.
  for (int M = 8; M < 16; ++M) {
    const float r = Int8Scale::recip_mantissa(M), q = 1.0f / static_cast<float>(M);
    EXPECT_EQ(std::memcmp(&r, &q, sizeof r), 0) << "M = " << M;
  }
}

TEST(ActQuant, Int8ScaleComesBackFromTheQuantisedValues) {
  // What the int8 kernels do with a quantiser's output y (act_quant.h, cuda's int8_codes_scale): the scale
  // act_int8_scale(max(amax_y, 1e-4)) of its largest |y| alone gives back every y_i as an integer code of
  // magnitude <= 127 times it. Blocks with their largest value at every 97th mantissa step of a binade (where
  // the quantiser takes the lower scale for some), random blocks over 24 decades, and blocks under the 1e-4
  // floor; the lower scale must have been taken for some.
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int lower = 0;
  auto check = [&](std::vector<float> x) {
    float amax_x = 1e-4f;
    for (float v : x) amax_x = std::max(amax_x, std::fabs(v));
    act_quant_row(x.data(), 32, ActQuant::INT8_32);
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const Int8Scale sc = act_int8_scale(std::max(amax, 1e-4f));
    lower += sc.value() < act_int8_scale(amax_x).value();
    for (float v : x) {
      const float c = std::nearbyint(v * sc.inverse());
      ASSERT_TRUE(c * sc.value() == v && std::fabs(c) <= 127.0f) << "amax_y " << amax << ", value " << v;
    }
  };
  for (uint32_t m = 0; m < (1u << 23); m += 97) {
    const uint32_t u = (127u << 23) | m;
    float top;
    std::memcpy(&top, &u, 4);
    std::vector<float> x(32);
    for (auto& v : x) v = nd(g) * 0.3f;
    x[5] = top * 127.0f / 64.0f;
    check(x);
  }
  std::uniform_real_distribution<float> ex(-12.0f, 12.0f);
  for (int t = 0; t < 20000; ++t) {
    std::vector<float> x(32);
    const float base = std::pow(10.0f, ex(g));
    for (auto& v : x) v = nd(g) * base;
    check(x);
  }
  EXPECT_GT(lower, 0);
}
