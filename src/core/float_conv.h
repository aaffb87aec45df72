// Scalar conversions between f32 and the narrow float formats the model uses:
// IEEE binary16 (F16), bfloat16 (BF16), FP8 E4M3FN and FP4 E2M1, plus the
// power-of-two (UE8M0) block scales of DeepSeek's quantisation simulations
// (model-spec.md §9.2). All roundings are round-to-nearest-even.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace dsv4 {

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- binary16 -------------------------------------------------------------
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  if (exp == 0x1f) return f32_from_bits(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign);
    // subnormal: man * 2^-24
    float v = static_cast<float>(man) * 0x1p-24f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  uint32_t exp = (x >> 23) & 0xff;
  uint32_t man = x & 0x7fffff;
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return sign;
    uint32_t m = man | 0x800000;  // 24-bit significand; result = m * 2^(e-14) in units of 2^-24
    int shift = 14 - e;
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (q & 1))) q++;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t q = (static_cast<uint32_t>(e) << 10) | (man >> 13);
  uint32_t rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (q & 1))) q++;  // a carry may round up to inf: correct
  return static_cast<uint16_t>(sign | q);
}

inline float f16_round(float f) { return f16_to_f32(f32_to_f16(f)); }

// ---- bfloat16 -------------------------------------------------------------
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

inline float bf16_round(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- power-of-two scales ---------------------------------------------------
// 2^ceil(log2(x)) for finite x > 0, computed exactly from the bits.
inline float pow2_ceil(float x) {
  int e;
  float m = std::frexp(x, &e);  // x = m * 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

// ---- FP8 E4M3FN (max 448, min subnormal 2^-9, no inf) ---------------------
constexpr float k_fp8_e4m3_max = 448.0f;

// Rounds v to the nearest E4M3FN value (ties to even), saturating at ±448.
inline float fp8_e4m3_round(float v) {
  float a = std::fabs(v);
  if (!(a > 0.0f)) return v != v ? v : 0.0f * v;  // nan passes, ±0 kept
  if (a >= k_fp8_e4m3_max) return std::copysign(k_fp8_e4m3_max, v);
  int e;
  std::frexp(a, &e);                          // a in [2^(e-1), 2^e)
  int q_exp = (e - 1 < -6) ? -9 : e - 1 - 3;  // quantum: 2^-9 in the subnormal range, else 3 mantissa bits
  float q = std::ldexp(1.0f, q_exp);
  float r = std::nearbyint(a / q) * q;  // default FP env: round half to even
  if (r > k_fp8_e4m3_max) r = k_fp8_e4m3_max;
  return std::copysign(r, v);
}

// Byte encoding (for compact storage); encode expects |v| <= 448 and returns the nearest code.
uint8_t fp8_e4m3_encode(float v);
float fp8_e4m3_decode(uint8_t b);

// ---- FP4 E2M1 (magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6) -----------------------
constexpr float k_fp4_e2m1_max = 6.0f;

// Nearest E2M1 value, ties to the even code; saturates at ±6.
inline float fp4_e2m1_round(float v) {
  float a = std::fabs(v);
  float r;
  if (a <= 0.25f)
    r = 0.0f;
  else if (a < 0.75f)
    r = 0.5f;
  else if (a <= 1.25f)
    r = 1.0f;
  else if (a < 1.75f)
    r = 1.5f;
  else if (a <= 2.5f)
    r = 2.0f;
  else if (a < 3.5f)
    r = 3.0f;
  else if (a <= 5.0f)
    r = 4.0f;
  else
    r = 6.0f;
  return std::copysign(r, v);
}

// E2M1 nibble (sign in bit 3) to value; used by the FP4 checkpoint importer.
inline float fp4_e2m1_decode(uint8_t nibble) {
  static constexpr float k_values[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = k_values[nibble & 7];
  return (nibble & 8) ? -v : v;
}

// E8M0 byte e encodes 2^(e-127); e = 0 is read as 2^-127 (checkpoint importer convention).
inline float e8m0_decode(uint8_t e) { return std::ldexp(1.0f, static_cast<int>(e) - 127); }

}  // namespace dsv4
