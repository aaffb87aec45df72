// Compact row formats of the KV state (design.md §4, model-spec.md §9.2, §10.1).
//
// In reference numerics every stored KV value has been through a quantisation
// simulation, so it is exactly a small code times a power-of-two block scale;
// these formats store the code and the scale, losslessly:
//
// KV_FP8 — main KV rows (the window ring and the compressed rows), width d,
//   n = d - 64 non-RoPE dims (a multiple of 64), then the 64 RoPE dims:
//     [0, n)                 u8  e4m3fn code of dim i (sign bit 7)
//     [n, n + 128)           u16 bf16 of RoPE dim n + j, j < 64
//     [n + 128, + n/64)      u8  e8m0 scale of the 64-block b (2^(byte - 127))
//     zero padding to a multiple of 16 bytes (row starts stay 16-byte aligned)
//   dim i < n = e4m3(code) * scale[i / 64]; d = 512: 592 bytes (f32: 2048).
// KV_FP4 — indexer rows, width d (a multiple of 32):
//     [0, d/2)               u8  e2m1 codes: dim 2j in the low nibble, 2j+1 high
//     [d/2, d/2 + d/32)      u8  e8m0 scale of the 32-block b
//   dim i = e2m1(code) * scale[i / 32]; d = 128: 68 bytes (f32: 512).
//
// Packing repeats the simulation's own steps (model-spec.md §9.2):
//   FP8: amax = max(|v_block|, 1e-4), scale = 2^ceil(log2(amax/448)),
//        code = e4m3(clamp(v/scale, ±448)) (nearest, ties to even); tail = bf16(v).
//   FP4: amax = max(|v_block|, 6*2^-126), scale = 2^ceil(log2(amax/6)),
//        code = e2m1(clamp(v/scale, ±6)).
// so unpack(pack(v)) equals the FP8_BF16 simulation of v, and the FP4 step of
// HADAMARD_FP4 (the rotation is not part of packing). The simulations are
// idempotent, so a row that already went through its simulation is stored
// unchanged (bitwise, signs of zeros included) — tests/unit/test_kv_rows.cpp.
// A zero-filled row unpacks to zeros (scale byte 0 reads as 0).
//
// Host and device (DSV4_HD); the per-row loops are the CPU reference, CUDA
// kernels split the same element maths across threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.h"

namespace dsv4 {

constexpr int k_kv_rope_dims = 64;  // bf16 tail of a KV_FP8 row
constexpr int k_kv_fp8_block = 64;  // FP8 scale block
constexpr int k_kv_fp4_block = 32;  // FP4 scale block

// Bit casts usable on host and device.
template <class To, class From>
DSV4_HD To kvr_bitcast(From v) {
  static_assert(sizeof(To) == sizeof(From), "bit cast between types of different sizes");
  To t;
  __builtin_memcpy(&t, &v, sizeof t);
  return t;
}
DSV4_HD uint32_t kvr_bits(float f) { return kvr_bitcast<uint32_t>(f); }
DSV4_HD float kvr_float(uint32_t u) { return kvr_bitcast<float>(u); }

// ---- geometry ----------------------------------------------------------------
DSV4_HD bool kv_fp8_width_ok(int64_t d) { return d > k_kv_rope_dims && (d - k_kv_rope_dims) % k_kv_fp8_block == 0; }
DSV4_HD int64_t kv_fp8_nope(int64_t d) { return d - k_kv_rope_dims; }
DSV4_HD int64_t kv_fp8_tail_offset(int64_t d) { return kv_fp8_nope(d); }
DSV4_HD int64_t kv_fp8_scale_offset(int64_t d) { return kv_fp8_nope(d) + 2 * k_kv_rope_dims; }
DSV4_HD int64_t kv_fp8_row_bytes(int64_t d) {
  return (kv_fp8_scale_offset(d) + kv_fp8_nope(d) / k_kv_fp8_block + 15) / 16 * 16;
}
DSV4_HD bool kv_fp4_width_ok(int64_t d) { return d > 0 && d % k_kv_fp4_block == 0; }
DSV4_HD int64_t kv_fp4_scale_offset(int64_t d) { return d / 2; }
DSV4_HD int64_t kv_fp4_row_bytes(int64_t d) { return d / 2 + d / k_kv_fp4_block; }

// ---- scalars ------------------------------------------------------------------
// e8m0 byte of 2^ceil(log2(q)) for a finite normal q > 0 (the floors keep q normal).
DSV4_HD uint8_t kv_scale_code(float q) {
  const uint32_t u = kvr_bits(q);
  uint32_t e = u >> 23;
  if (u & 0x7fffffu) ++e;
  return static_cast<uint8_t>(e > 254u ? 254u : e);
}
DSV4_HD float kv_scale_value(uint8_t e) { return kvr_float(static_cast<uint32_t>(e) << 23); }

// Nearest e4m3fn code of v (ties to even), saturating at ±448; keeps the sign of zero.
DSV4_HD uint8_t kv_e4m3_code(float v) {
  const uint32_t u = kvr_bits(v);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  const float af = kvr_float(a);
  if (!(af < 448.0f)) return sign | 0x7eu;                                   // saturate (NaN never reaches storage)
  if (af < 0x1p-6f) return sign | static_cast<uint8_t>(rintf(af * 512.0f));  // multiples of 2^-9; 8 = 2^-6
  // Keep 3 mantissa bits, ties to even; a carry moves into the exponent.
  const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // biased exp << 3 | mantissa
  uint32_t code = r - ((127u - 7u) << 3);
  if (code > 0x7eu) code = 0x7eu;
  return sign | static_cast<uint8_t>(code);
}
DSV4_HD float kv_e4m3_value(uint8_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  const float a = e == 0 ? static_cast<float>(m) * 0x1p-9f : kvr_float(((e + 120u) << 23) | (m << 20));
  return (c & 0x80u) ? -a : a;
}

// Nearest e2m1 code (ties to the even code, as fp4_e2m1_round), saturating at ±6; sign in bit 3.
DSV4_HD uint8_t kv_e2m1_code(float v) {
  const float a = fabsf(v);
  uint8_t c;
  if (a <= 0.25f)
    c = 0;
  else if (a < 0.75f)
    c = 1;
  else if (a <= 1.25f)
    c = 2;
  else if (a < 1.75f)
    c = 3;
  else if (a <= 2.5f)
    c = 4;
  else if (a < 3.5f)
    c = 5;
  else if (a <= 5.0f)
    c = 6;
  else
    c = 7;
  return static_cast<uint8_t>((kvr_bits(v) >> 31) << 3) | c;
}
// Magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}: code e|m = (1 + m/2) * 2^(e-1) for e > 0, m/2 for e = 0.
DSV4_HD float kv_e2m1_value(uint8_t c) {
  const uint32_t e = (c >> 1) & 3u, m = c & 1u;
  const float a = e == 0 ? 0.5f * static_cast<float>(m) : kvr_float(((e + 126u) << 23) | (m << 22));
  return (c & 8u) ? -a : a;
}

// bf16 <-> f32 (round to nearest even; NaN stays NaN).
DSV4_HD uint16_t kv_bf16_code(float f) {
  uint32_t x = kvr_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}
DSV4_HD float kv_bf16_value(uint16_t h) { return kvr_float(static_cast<uint32_t>(h) << 16); }

// ---- block codecs -----------------------------------------------------------------
// Scale byte of an FP8 / FP4 block from its largest magnitude.
DSV4_HD uint8_t kv_fp8_block_scale(float amax) { return kv_scale_code(fmaxf(amax, 1e-4f) / 448.0f); }
DSV4_HD uint8_t kv_fp4_block_scale(float amax) { return kv_scale_code(fmaxf(amax, 6.0f * 0x1p-126f) / 6.0f); }
DSV4_HD uint8_t kv_fp8_encode(float v, float scale) { return kv_e4m3_code(v / scale); }
DSV4_HD uint8_t kv_fp4_encode(float v, float scale) { return kv_e2m1_code(v / scale); }

// ---- whole rows (CPU reference; one thread) -------------------------------------------
DSV4_HD float kv_block_amax(const float* v, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(v[i]));
  return amax;
}

DSV4_HD void kv_fp8_pack_row(uint8_t* dst, const float* x, int64_t d) {
  const int64_t n = kv_fp8_nope(d);
  uint16_t tail[k_kv_rope_dims];
  for (int64_t b = 0; b < n / k_kv_fp8_block; ++b) {
    const float* v = x + b * k_kv_fp8_block;
    const uint8_t s = kv_fp8_block_scale(kv_block_amax(v, k_kv_fp8_block));
    const float scale = kv_scale_value(s);
    for (int i = 0; i < k_kv_fp8_block; ++i) dst[b * k_kv_fp8_block + i] = kv_fp8_encode(v[i], scale);
    dst[kv_fp8_scale_offset(d) + b] = s;
  }
  for (int j = 0; j < k_kv_rope_dims; ++j) tail[j] = kv_bf16_code(x[n + j]);
  std::memcpy(dst + kv_fp8_tail_offset(d), tail, sizeof tail);
  for (int64_t i = kv_fp8_scale_offset(d) + n / k_kv_fp8_block; i < kv_fp8_row_bytes(d); ++i) dst[i] = 0;
}

DSV4_HD void kv_fp8_unpack_row(float* x, const uint8_t* src, int64_t d) {
  const int64_t n = kv_fp8_nope(d);
  for (int64_t i = 0; i < n; ++i)
    x[i] = kv_e4m3_value(src[i]) * kv_scale_value(src[kv_fp8_scale_offset(d) + i / k_kv_fp8_block]);
  uint16_t tail[k_kv_rope_dims];
  std::memcpy(tail, src + kv_fp8_tail_offset(d), sizeof tail);
  for (int j = 0; j < k_kv_rope_dims; ++j) x[n + j] = kv_bf16_value(tail[j]);
}

DSV4_HD void kv_fp4_pack_row(uint8_t* dst, const float* x, int64_t d) {
  for (int64_t b = 0; b < d / k_kv_fp4_block; ++b) {
    const float* v = x + b * k_kv_fp4_block;
    const uint8_t s = kv_fp4_block_scale(kv_block_amax(v, k_kv_fp4_block));
    const float scale = kv_scale_value(s);
    for (int i = 0; i < k_kv_fp4_block; i += 2)
      dst[(b * k_kv_fp4_block + i) / 2] =
          static_cast<uint8_t>(kv_fp4_encode(v[i], scale) | (kv_fp4_encode(v[i + 1], scale) << 4));
    dst[kv_fp4_scale_offset(d) + b] = s;
  }
}

DSV4_HD void kv_fp4_unpack_row(float* x, const uint8_t* src, int64_t d) {
  for (int64_t i = 0; i < d; ++i) {
    const uint8_t byte = src[i / 2];
    x[i] = kv_e2m1_value((i & 1) ? (byte >> 4) : (byte & 15)) *
           kv_scale_value(src[kv_fp4_scale_offset(d) + i / k_kv_fp4_block]);
  }
}

}  // namespace dsv4
