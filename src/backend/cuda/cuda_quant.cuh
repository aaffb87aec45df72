// Weight decoding on the device: every weight type dsv4 computes with is read
// in "units" of U consecutive elements of a row, decoded into registers with
// exactly the float operations of src/quant/block_decode.h (so the decoded
// weights are bit-identical to dequantize_row's), and consumed by the matvec,
// tiled matmul, embedding, mHC and MoE kernels.
//
//   type      U   unit                                   loads (weights stay in GGUF layout)
//                                                        (matvec: Q8_0/Q2_K/IQ2_XXS staged, see UnitStaging)
//   F32       4   4 floats                               one 16-byte load (row must be 16-byte aligned)
//   F16/BF16  8   8 halves                               one 16-byte load
//   Q8_0     32   one 34-byte block                      d + 16 two-byte loads (blocks are 2-byte aligned;
//                                                        staged copies: 9 aligned words, decode_words)
//   Q2_K     32   two 16-element sub-blocks of a 256-blk 8 four-byte qs loads, scales, d/dmin
//   Q4_K     32   one 32-element sub-block of a 256-blk  2 sixteen-byte qs loads, 12 scale bytes, d/dmin
//   IQ2_XXS  32   one 32-element group of a 256-blk      d + 4 two-byte loads, grid look-ups (the
//                                                        grid in shared memory: block_tables), signs computed
//   MXFP4    32   one 17-byte block (E8M0 scale, 16      the 5 aligned words that hold the block (blocks are
//                 code bytes)                            byte-aligned), magnitudes by a byte permute
//
// The block-quantised decoders take an optional power-of-two factor s that
// multiplies the block scales (d, dmin) before anything else: every decoded
// weight is then exactly s times the unscaled one (all intermediate products
// scale exactly; the callers keep s and the scales in f32's normal range).
// The grouped expert GEMM (cuda_expert_gemm.cuh) folds its row exponent in
// this way; s = 1 (the default) compiles to the plain decoder.
//
// A row of `cols` elements has cols / U units; lane l of a warp handles units
// l, l + 32, l + 64, ... in that order (the canonical accumulation order that
// makes the matvec and the batched matmul give bit-identical results).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

// Plain load through a generic pointer: the decoders read global memory (the
// weights) or a shared-memory copy of it (staged matvec chunks).
template <class V>
DSV4_HD V ld(const V* p) {
  return *p;
}

template <GgmlType T>
struct WeightUnit;

// Exact integer -> float conversions of one byte of a word, for the decoders'
// inner loops. I2F of an 8-bit or 64-bit integer is a quarter-rate
// conversion-unit instruction (the IQ2_XXS and Q8_0 decoders issued one per
// weight); on the device these are one byte permute into the mantissa of 2^23
// (bits 0x4B0000bb = 2^23 + bb) and one f32 subtraction, both exact.
// u8_f32(w, j) = float(byte j of w); s8_f32(wx, j) = float(int8 byte j of w)
// given wx = w ^ 0x80808080 (so byte j of wx is that int8 + 128).
DSV4_HD float u8_f32(uint32_t w, int j) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + static_cast<unsigned>(j))) - 8388608.0f;
#else
  return static_cast<float>((w >> (8 * j)) & 0xFFu);
#endif
}
DSV4_HD float s8_f32(uint32_t wx, int j) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(__byte_perm(wx, 0x4B000000u, 0x7540u + static_cast<unsigned>(j))) - 8388736.0f;
#else
  return static_cast<float>(static_cast<int>((wx >> (8 * j)) & 0xFFu) - 128);
#endif
}

template <>
struct WeightUnit<GgmlType::F32> {
  static constexpr int U = 4;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables&) {
    decode_vec(ld(reinterpret_cast<const uint4*>(row) + u), w);
  }
  // The unit's 16 bytes, already loaded.
  DSV4_HD static void decode_vec(uint4 v, float* w) {
    w[0] = float_of(v.x);
    w[1] = float_of(v.y);
    w[2] = float_of(v.z);
    w[3] = float_of(v.w);
  }
};

template <>
struct WeightUnit<GgmlType::F16> {
  static constexpr int U = 8;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables&) {
    decode_vec(ld(reinterpret_cast<const uint4*>(row) + u), w);
  }
  DSV4_HD static void decode_vec(uint4 v, float* w) {
    const uint32_t p[4] = {v.x, v.y, v.z, v.w};
    DSV4_UNROLL
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = f16_bits_to_f32(static_cast<uint16_t>(p[i] & 0xffffu));
      w[2 * i + 1] = f16_bits_to_f32(static_cast<uint16_t>(p[i] >> 16));
    }
  }
};

template <>
struct WeightUnit<GgmlType::BF16> {
  static constexpr int U = 8;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables&) {
    decode_vec(ld(reinterpret_cast<const uint4*>(row) + u), w);
  }
  DSV4_HD static void decode_vec(uint4 v, float* w) {
    const uint32_t p[4] = {v.x, v.y, v.z, v.w};
    DSV4_UNROLL
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = float_of(p[i] << 16);
      w[2 * i + 1] = float_of(p[i] & 0xffff0000u);
    }
  }
};

// Q8_0: w[i] = fp16(d) * qs[i].
template <>
struct WeightUnit<GgmlType::Q8_0> {
  static constexpr int U = 32;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables&, float s = 1.0f) {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(row + u * 34);
    const float d = f16_bits_to_f32(ld(b)) * s;
    DSV4_UNROLL
    for (int i = 0; i < 16; ++i) {
      const uint32_t q2x = static_cast<uint32_t>(ld(b + 1 + i)) ^ 0x8080u;
      w[2 * i] = d * s8_f32(q2x, 0);
      w[2 * i + 1] = d * s8_f32(q2x, 1);
    }
  }
  // Unit u of a 4-byte aligned copy (the staged matvec's shared memory) as its
  // scale d and 8 words of 4 signed codes each (qs[4m .. 4m+3] in word m): the
  // unit's 34 bytes read as the 9 aligned words that hold them (half the loads
  // of decode's 17 two-byte ones), bytes picked with funnel shifts.
  DSV4_HD static void unit_words(const uint8_t* base, int64_t u, float& d, uint32_t (&q)[8]) {
    const size_t off = static_cast<size_t>(u) * 34;
    const uint32_t* p = reinterpret_cast<const uint32_t*>(base + (off & ~size_t{3}));
    const unsigned sh = static_cast<unsigned>(off & 2) * 8;  // 0 or 16 bits
    uint32_t v[9];
    DSV4_UNROLL
    for (int i = 0; i < 9; ++i) v[i] = ld(p + i);
    // Byte k of the block is byte k + sh/8 of the word stream v.
    d = f16_bits_to_f32(static_cast<uint16_t>(v[0] >> sh));
    DSV4_UNROLL
    for (int m = 0; m < 8; ++m)  // block bytes 2+4m .. 5+4m = stream bits [16 + sh + 32m, +32)
      q[m] = static_cast<uint32_t>(((static_cast<uint64_t>(v[m + 1]) << 32) | v[m]) >> (16 + sh));
  }
  // The 4 weights of word q (codes 4m .. 4m+3 of unit_words) with the unit's scale d: w[4m + j] = w4[j].
  DSV4_HD static void word_floats(float d, uint32_t q, float (&w4)[4]) {
    const uint32_t q4x = q ^ 0x80808080u;
    DSV4_UNROLL
    for (int j = 0; j < 4; ++j) w4[j] = d * s8_f32(q4x, j);
  }
  // decode from a 4-byte aligned copy (unit_words). Same floats.
  DSV4_HD static void decode_words(const uint8_t* base, int64_t u, float* w) {
    float d;
    uint32_t q[8];
    unit_words(base, u, d, q);
    DSV4_UNROLL
    for (int m = 0; m < 8; ++m) {
      float w4[4];
      word_floats(d, q[m], w4);
      DSV4_UNROLL
      for (int j = 0; j < 4; ++j) w[4 * m + j] = w4[j];
    }
  }
};

// Q2_K: unit v (0..7) of block b covers elements [32v, 32v+32) = sub-blocks
// g = 2v, 2v+1 (16 each); h = v / 4, s = v % 4; element l reads bits 2s..2s+1 of
// qs[32h + l]; w = (d*sc_g) * q - (dmin*m_g), the product rounded before the subtraction.
template <>
struct WeightUnit<GgmlType::Q2_K> {
  static constexpr int U = 32;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables&, float scale = 1.0f) {
    const uint8_t* blk = row + (u >> 3) * 84;
    const int v = static_cast<int>(u & 7), h = v >> 2, s = v & 3;
    const uint32_t dd = ld(reinterpret_cast<const uint32_t*>(blk + 80));
    const float d = f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu)) * scale;
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(dd >> 16)) * scale;
    const uint16_t sc = ld(reinterpret_cast<const uint16_t*>(blk + 2 * v));  // scales[2v], scales[2v+1]
    const uint32_t* q = reinterpret_cast<const uint32_t*>(blk + 16 + 32 * h);
    DSV4_UNROLL
    for (int k = 0; k < 2; ++k) {
      const uint8_t scb = static_cast<uint8_t>(k == 0 ? (sc & 0xff) : (sc >> 8));
      const float dl = d * static_cast<float>(scb & 0x0F);
      const float ml = dmin * static_cast<float>(scb >> 4);
      DSV4_UNROLL
      for (int i = 0; i < 4; ++i) {
        const uint32_t q4 = (ld(q + 4 * k + i) >> (2 * s)) & 0x03030303u;  // the 4 elements' 2-bit codes, one per byte
        DSV4_UNROLL
        for (int j = 0; j < 4; ++j) w[16 * k + 4 * i + j] = sub_rn(mul_rn(dl, u8_f32(q4, j)), ml);
      }
    }
  }
};

// Q4_K's 6-bit scale sc and min m of sub-block j (0..7) from the 12 packed
// scale bytes as three words (bytes selected without a run-time-indexed array).
DSV4_HD void q4k_scale_min(int j, uint32_t s0, uint32_t s1, uint32_t s2, int& sc, int& m) {
  auto sb = [&](int k) -> int {
    const uint32_t word = k < 4 ? s0 : (k < 8 ? s1 : s2);
    return static_cast<int>((word >> (8 * (k & 3))) & 0xFFu);
  };
  if (j < 4) {
    sc = sb(j) & 63;
    m = sb(j + 4) & 63;
  } else {
    sc = (sb(j + 4) & 0x0F) | ((sb(j - 4) >> 6) << 4);
    m = (sb(j + 4) >> 4) | ((sb(j) >> 6) << 4);
  }
}

// Q4_K: unit j (0..7) of block b covers elements [32j, 32j+32): nibble (j odd:
// high, even: low) of qs[32(j/2) + l]; scale/min j from the packed 6-bit table.
template <>
struct WeightUnit<GgmlType::Q4_K> {
  static constexpr int U = 32;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables&, float s = 1.0f) {
    const uint8_t* blk = row + (u >> 3) * 144;
    const int j = static_cast<int>(u & 7), c = j >> 1;
    const uint32_t dd = ld(reinterpret_cast<const uint32_t*>(blk));
    const float d = f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu)) * s;
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(dd >> 16)) * s;
    const uint32_t* sw = reinterpret_cast<const uint32_t*>(blk + 4);  // the 12 scale bytes as 3 words
    int sc, m;
    q4k_scale_min(j, ld(sw), ld(sw + 1), ld(sw + 2), sc, m);
    const float d1 = d * static_cast<float>(sc);
    const float m1 = dmin * static_cast<float>(m);
    const uint4* q = reinterpret_cast<const uint4*>(blk + 16 + 32 * c);
    const int shift = (j & 1) * 4;
    DSV4_UNROLL
    for (int half = 0; half < 2; ++half) {
      const uint4 v = ld(q + half);
      const uint32_t p[4] = {v.x, v.y, v.z, v.w};
      DSV4_UNROLL
      for (int i = 0; i < 4; ++i) DSV4_UNROLL
      for (int k = 0; k < 4; ++k) {
        const float qv = static_cast<float>((p[i] >> (8 * k + shift)) & 0x0Fu);
        w[16 * half + 4 * i + k] = sub_rn(mul_rn(d1, qv), m1);
      }
    }
  }
};

// IQ2_XXS's sign byte for a 7-bit sign index i: bits 0..6 = i, bit 7 = the
// parity of i (the sign table quant::iq2xxs_signs() holds, computed instead of
// looked up: one table gather less per 8 weights).
DSV4_HD uint32_t iq2_sign_bits(uint32_t i) {
#ifdef __CUDA_ARCH__
  return i | ((static_cast<uint32_t>(__popc(i)) & 1u) << 7);
#else
  return i | ((static_cast<uint32_t>(__builtin_popcount(i)) & 1u) << 7);
#endif
}

// IQ2_XXS: unit ib (0..7) of block b = group of 32: words wa (4 grid indices)
// and wb (4 seven-bit sign indices, 4-bit scale ls); db = d*(0.5+ls)*0.25;
// w = +-(db * grid byte), the sign from bit j of the sign table entry.
template <>
struct WeightUnit<GgmlType::IQ2_XXS> {
  static constexpr int U = 32;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables& t, float s = 1.0f) {
    const uint16_t* blk = reinterpret_cast<const uint16_t*>(row + (u >> 3) * 66);
    const int ib = static_cast<int>(u & 7);
    const float d = f16_bits_to_f32(ld(blk)) * s;
    const uint16_t* g = blk + 1 + 4 * ib;
    const uint32_t wa = static_cast<uint32_t>(ld(g)) | (static_cast<uint32_t>(ld(g + 1)) << 16);
    const uint32_t wb = static_cast<uint32_t>(ld(g + 2)) | (static_cast<uint32_t>(ld(g + 3)) << 16);
    const float db = mul_rn(mul_rn(d, 0.5f + static_cast<float>(wb >> 28)), 0.25f);
#ifdef __CUDA_ARCH__
    // db * b rounded once, as fma(db, 2^23 + b, -db * 2^23): the byte permute
    // gives the float 2^23 + b exactly, -db * 2^23 is exact (a power-of-two
    // scaling; |db| < 2^18), and the FMA rounds the exact db * b once: the same
    // bits as mul_rn(db, float(b)) for every finite db, one instruction per
    // weight fewer than u8_f32's subtraction + the product. (b is a grid byte:
    // 8, 25 or 43, never 0, so no signed-zero case; a non-finite scale, i.e. a
    // corrupt block, gives NaN where the product gives +-inf.)
    const float ndb = -db * 8388608.0f;
#endif
    DSV4_UNROLL
    for (int k = 0; k < 4; ++k) {
      const uint64_t grid = ld(t.iq2_grid + ((wa >> (8 * k)) & 0xFFu));
      const uint32_t g2[2] = {static_cast<uint32_t>(grid), static_cast<uint32_t>(grid >> 32)};
      const uint32_t sg = iq2_sign_bits((wb >> (7 * k)) & 127u);
      DSV4_UNROLL
      for (int j = 0; j < 8; ++j) {
#ifdef __CUDA_ARCH__
        const float v = __fmaf_rn(
            db, __uint_as_float(__byte_perm(g2[j >> 2], 0x4B000000u, 0x7540u + static_cast<unsigned>(j & 3))), ndb);
#else
        const float v = mul_rn(db, u8_f32(g2[j >> 2], j & 3));
#endif
        // -v for a set sign bit, as a flip of v's sign bit (one logic op, no select).
        w[8 * k + j] = float_of(bits_of(v) ^ ((sg << (31 - j)) & 0x80000000u));
      }
    }
  }
};

// prmt: byte i of the result = byte (s >> 4i) & 7 of the 8 bytes {y:x} (CUDA's __byte_perm).
DSV4_HD uint32_t prmt(uint32_t x, uint32_t y, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, sel);
#else
  const uint64_t xy = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((xy >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return r;
#endif
}

// The 32 bits at bit offset sh (0..32) of the 64-bit {hi:lo}.
DSV4_HD uint32_t funnel_r(uint32_t lo, uint32_t hi, unsigned sh) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_rc(lo, hi, sh);
#else
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> sh);
#endif
}

// E8M0 scale 2^(e - 127) as block_decode.h reads it (e = 0: 2^-127, a subnormal; e = 255: +inf).
DSV4_HD float mxfp4_scale(uint32_t e) { return float_of(e == 0 ? 0x00400000u : e << 23); }

// w[j] = x2(c_j) * hs for the 4-bit E2M1 codes c_j in the low nibbles of the 4 bytes of c (high
// nibbles zero), x2 = twice the E2M1 value: |x2| = 0, 1, 2, 3, 4, 6, 8, 12 by magnitude code (c & 7,
// one byte permute for all four), the sign bit of c (bit 3) flipping the product's sign unless the
// magnitude is 0 (code 8 is +0, as block_decode.h's table has it).
DSV4_HD void mxfp4_decode4(uint32_t c, float hs, float* w) {
  const uint32_t m = c & 0x07070707u;
  const uint32_t t = m | (m >> 4);  // byte 0: m0 | m1 << 4, byte 2: m2 | m3 << 4
  const uint32_t mag = prmt(0x03020100u, 0x0C080604u, (t & 0xFFu) | ((t >> 8) & 0xFF00u));
  const uint32_t neg = c & (m + 0x07070707u) & 0x08080808u;  // bit 3 of byte j: code j negative, nonzero
  DSV4_UNROLL
  for (int j = 0; j < 4; ++j)
    w[j] = float_of(bits_of(mul_rn(u8_f32(mag, j), hs)) ^ ((neg << (28 - 8 * j)) & 0x80000000u));
}

// MXFP4 (ds4-variants-mtp-dspark.md §1.1): unit u = block u of 17 bytes, the E8M0 byte e then 16
// code bytes; element j < 16 is the low nibble of code byte j, element j + 16 its high nibble.
// w = x2(c) * hs with hs = 0.5 * 2^(e - 127): both factors exact and the product exact (|x2| <= 12, hs
// a power of two), so this is block_decode.h's (0.5 * x2) * 2^(e - 127) bit for bit. The blocks are
// byte-aligned: the unit is read as the 5 aligned words that hold its 17 bytes (each word holds a byte
// of the block, so no load leaves the 4-byte-aligned span of the tensor) and picked with funnel shifts.
// The same decoder reads the staged matvec's 4-byte-aligned chunk copies.
template <>
struct WeightUnit<GgmlType::MXFP4> {
  static constexpr int U = 32;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, float* w, const QuantTables&) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>(u) * 17;
    const uint32_t* p = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
    const unsigned sh = static_cast<unsigned>(a & 3u) * 8;
    uint32_t v[5];
    DSV4_UNROLL
    for (int i = 0; i < 5; ++i) v[i] = ld(p + i);
    const float hs = mul_rn(0.5f, mxfp4_scale((v[0] >> sh) & 0xFFu));
    DSV4_UNROLL
    for (int m = 0; m < 4; ++m) {
      const uint32_t c = funnel_r(v[m], v[m + 1], sh + 8);  // code bytes 4m .. 4m + 3
      mxfp4_decode4(c & 0x0F0F0F0Fu, hs, w + 4 * m);
      mxfp4_decode4((c >> 4) & 0x0F0F0F0Fu, hs, w + 16 + 4 * m);
    }
  }
};

// Wide staging of the 32 units a warp consumes per step (one per lane), for
// the types whose blocks are not 16-byte aligned in the GGUF layout: the warp
// copies the chunk's contiguous bytes to shared memory with 16-byte (IQ2_XXS:
// 8-byte) coalesced loads, then each lane decodes its unit from there. Usable
// when every chunk starts aligned, i.e. row_bytes % sizeof(Vec) == 0 (Q8_0:
// cols % 256 == 0; Q2_K, IQ2_XXS: cols % 1024 == 0; MXFP4: cols % 512 == 0); chunk_bytes = 0: no staging.
template <GgmlType T>
struct UnitStaging {
  using Vec = uint4;
  static constexpr int chunk_bytes = 0;
};
template <>
struct UnitStaging<GgmlType::Q8_0> {
  using Vec = uint4;
  static constexpr int chunk_bytes = 32 * 34;  // 32 blocks = 68 x 16 bytes
};
template <>
struct UnitStaging<GgmlType::Q2_K> {
  using Vec = uint4;
  static constexpr int chunk_bytes = 4 * 84;  // 4 blocks = 21 x 16 bytes
};
template <>
struct UnitStaging<GgmlType::MXFP4> {
  using Vec = uint4;
  static constexpr int chunk_bytes = 32 * 17;  // 32 blocks = 34 x 16 bytes
};
template <>
struct UnitStaging<GgmlType::IQ2_XXS> {
  using Vec = uint2;
  static constexpr int chunk_bytes = 4 * 66;  // 4 blocks = 33 x 8 bytes
};
template <GgmlType T>
__host__ __device__ constexpr int stage_vecs() {
  return UnitStaging<T>::chunk_bytes / static_cast<int>(sizeof(typename UnitStaging<T>::Vec));
}
template <GgmlType T>
inline bool can_stage(const void* w, size_t row_bytes) {
  using Vec = typename UnitStaging<T>::Vec;
  return UnitStaging<T>::chunk_bytes > 0 && row_bytes % sizeof(Vec) == 0 &&
         reinterpret_cast<uintptr_t>(w) % sizeof(Vec) == 0;
}

// Calls f(std::integral_constant<GgmlType, T>{}) for the weight type t; aborts
// for a type that is not a weight type (a programmer error: the model loader
// validates types).
template <class F>
void dispatch_weight_type(GgmlType t, F&& f) {
  if (t == GgmlType::F32) return f(std::integral_constant<GgmlType, GgmlType::F32>{});
  if (t == GgmlType::F16) return f(std::integral_constant<GgmlType, GgmlType::F16>{});
  if (t == GgmlType::BF16) return f(std::integral_constant<GgmlType, GgmlType::BF16>{});
  if (t == GgmlType::Q8_0) return f(std::integral_constant<GgmlType, GgmlType::Q8_0>{});
  if (t == GgmlType::Q2_K) return f(std::integral_constant<GgmlType, GgmlType::Q2_K>{});
  if (t == GgmlType::Q4_K) return f(std::integral_constant<GgmlType, GgmlType::Q4_K>{});
  if (t == GgmlType::IQ2_XXS) return f(std::integral_constant<GgmlType, GgmlType::IQ2_XXS>{});
  if (t == GgmlType::MXFP4) return f(std::integral_constant<GgmlType, GgmlType::MXFP4>{});
  DSV4_ASSERT(false, "CUDA backend: %s is not a weight type", ggml_type_name(t));
}

// Elements per unit of a weight type (host side).
int weight_unit_elems(GgmlType t);

// Asynchronous global -> shared copies (cp.async, sm_80+): the staged matvec
// issues the next chunk's copies before it decodes the current one.
template <class Vec>
__device__ __forceinline__ void cp_async_vec(Vec* smem, const Vec* gmem) {
  static_assert(sizeof(Vec) == 16 || sizeof(Vec) == 8, "cp.async of 8 or 16 bytes");
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  if constexpr (sizeof(Vec) == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// v[0..N) = p[0..N) with 16-byte loads (p 16-byte aligned, N % 4 == 0).
template <int N>
__device__ __forceinline__ void load_f32x4s(const float* p, float (&v)[N]) {
  static_assert(N % 4 == 0, "whole float4s");
  const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 t = q[i];
    v[4 * i] = t.x;
    v[4 * i + 1] = t.y;
    v[4 * i + 2] = t.z;
    v[4 * i + 3] = t.w;
  }
}

// Shared memory (bytes) of one warp's S staging buffers in warp_rows_dot<T, R, S>.
template <GgmlType T, int R, int S>
__host__ __device__ constexpr int stage_bytes_per_warp() {
  return S * R * UnitStaging<T>::chunk_bytes;
}

// x of a matvec as the lanes read it, one unit (U floats) at a time. Lane l
// reads units l, l + 32, ...: straight from global memory that is a 128-byte
// stride between lanes for 32-float units (32 L1 wavefronts per 16-byte load,
// which made the Q8_0 matvecs L1-bound at ~1.3 TB/s); XShared reads a
// shared-memory copy whose units are padded to U + 4 floats, so each quarter
// warp's 16-byte loads hit 32 distinct banks (4 wavefronts per load).
struct XGlobal {
  const float* p;
  template <int U>
  __device__ __forceinline__ void unit(int64_t u, float (&v)[U]) const {
    load_f32x4s(p + u * U, v);
  }
};
struct XShared {
  const float* p;
  template <int U>
  __device__ __forceinline__ void unit(int64_t u, float (&v)[U]) const {
    load_f32x4s(p + u * (U + 4), v);
  }
};
// Largest XShared copy the matvec kernels make (larger x: read through XGlobal).
constexpr size_t k_max_x_shared_bytes = 64 * 1024;

// Floats of XShared's copy of n_units units.
template <int U>
__host__ __device__ constexpr int64_t x_shared_floats(int64_t n_units) {
  return n_units * (U + 4);
}
// The block copies x (n_units * U floats, 16-byte aligned) into dst in XShared's
// layout. Every thread of the block calls it; the caller synchronises.
template <int U>
__device__ __forceinline__ void block_stage_x(float* dst, const float* x, int64_t n_units) {
  static_assert(U % 4 == 0, "whole float4s per unit");
  const int64_t n4 = n_units * U / 4;
  for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
    const int64_t u = (4 * i) / U, j = (4 * i) % U;
    *reinterpret_cast<float4*>(dst + u * (U + 4) + j) = reinterpret_cast<const float4*>(x)[i];
  }
}

// The IQ2_XXS grid in shared memory for a block that decodes IQ2_XXS units (a
// warp's 32 grid look-ups in global memory touch up to 16 L1 lines; in shared
// memory a few banks conflict at most). Every thread of the block calls it; the
// caller synchronises before decoding. Other types: the tables as given.
// Static shared memory of block_tables (allow_smem's static_bytes for kernels that call it).
constexpr size_t k_block_tables_smem = 256 * sizeof(uint64_t);
template <GgmlType T>
__device__ __forceinline__ QuantTables block_tables(const QuantTables& tab) {
  if constexpr (T == GgmlType::IQ2_XXS) {
    __shared__ uint64_t grid[256];
    for (int i = threadIdx.x; i < 256; i += blockDim.x) grid[i] = tab.iq2_grid[i];
    QuantTables t = tab;
    t.iq2_grid = grid;
    return t;
  } else {
    return tab;
  }
}

// The prologue of a block of matvec warps (warp_rows_dot's on_issued): the
// tables for T (block_tables) into `tb`, pdl_enter() (cuda_launch.cuh: the
// first weight loads are already in flight, so they overlap the predecessor
// kernel's end; x is read only after it), with XS the block's x copied into
// `x_smem` (XShared layout), then one barrier if either needs it. Every
// thread of the block calls it once.
template <GgmlType T, bool XS>
__device__ __forceinline__ void matvec_block_prologue(float* x_smem, const float* x, int64_t n_units,
                                                      const QuantTables& tab, QuantTables& tb) {
  tb = block_tables<T>(tab);
  pdl_enter();
  if constexpr (XS) block_stage_x<WeightUnit<T>::U>(x_smem, x, n_units);
  if constexpr (XS || T == GgmlType::IQ2_XXS) __syncthreads();
}

// The staged ring of the matvecs (requires can_stage<T>): chunk k (32 units
// per row) of every row is copied to ring buffer k % S of `stage` (this warp's
// S buffers of R * chunk_bytes, stage_bytes_per_warp<T, R, S>() bytes) with
// coalesced wide cp.async copies; chunks c + 1 .. c + S - 1 are in flight while
// the lanes consume chunk c from shared memory (S = 1: one buffer, no overlap
// within the warp; the other warps of the SM hide the latency). For each
// chunk, lane l < (units in the chunk) calls unit_fn(u = 32c + l, row_buf)
// where row_buf(r) is the staged chunk of row r (unit u is unit l of it).
// on_issued(): called once by every lane right after the first copies are in
// flight (it may synchronise the block). Every lane of the warp must call it.
template <GgmlType T, int R, int S, class OnIssued, class UnitFn>
__device__ __forceinline__ void warp_rows_staged(const uint8_t* const (&rows)[R], int64_t n_units, int lane,
                                                 typename UnitStaging<T>::Vec* stage, OnIssued&& on_issued,
                                                 UnitFn&& unit_fn) {
  using Vec = typename UnitStaging<T>::Vec;
  constexpr int CB = UnitStaging<T>::chunk_bytes;
  constexpr int SV = CB / static_cast<int>(sizeof(Vec));
  static_assert(CB > 0 && S > 0, "no staging for this type");
  const int64_t n_chunks = (n_units + 31) / 32;
  // Copies chunk k's bytes of every row into ring buffer k % S as one commit
  // group (an empty group past the last chunk, so that cp.async.wait_group
  // S - 1 always means "chunk c has landed").
  auto issue = [&](int64_t k) {
    if (k < n_chunks) {
      Vec* buf = stage + static_cast<int>(k % S) * R * SV;
      // n units in this chunk; with can_stage, n*CB/32 is a whole number of vectors.
      const int n = static_cast<int>(n_units - 32 * k < 32 ? n_units - 32 * k : 32);
      const int nv = n * CB / 32 / static_cast<int>(sizeof(Vec));
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const Vec* src = reinterpret_cast<const Vec*>(rows[r] + k * CB);
        for (int i = lane; i < nv; i += 32) cp_async_vec(buf + r * SV + i, src + i);
      }
    }
    cp_async_commit();
  };
  if constexpr (S > 1) {
    for (int k = 0; k < S - 1; ++k) issue(k);
    on_issued();
  }
  for (int64_t c = 0; c < n_chunks; ++c) {
    issue(c + S - 1);  // into the buffer every lane finished with last step
    if constexpr (S == 1)
      if (c == 0) on_issued();
    cp_async_wait<S - 1>();
    __syncwarp();  // every lane's copies of chunk c are visible
    const Vec* cur = stage + static_cast<int>(c % S) * R * SV;
    const int n = static_cast<int>(n_units - 32 * c < 32 ? n_units - 32 * c : 32);
    if (lane < n) unit_fn(32 * c + lane, [&](int r) { return reinterpret_cast<const uint8_t*>(cur + r * SV); });
    __syncwarp();  // buffer c % S is refilled by a later step's issue
  }
}

// The register path of the matvecs for 16-byte units (F32/F16/BF16): lane l
// walks units l, l + 32, ... in order, loading B units of each of the R rows
// before using any (the loads in flight); unit_fn(u, raw) with raw[i] row i's
// unit u. on_issued() as warp_rows_staged's (once, every lane, after the first
// loads). Every lane of the warp must call it.
template <int B, int R, class OnIssued, class UnitFn>
__device__ __forceinline__ void warp_rows_vec(const uint8_t* const (&rows)[R], int64_t n_units, int lane,
                                              OnIssued&& on_issued, UnitFn&& unit_fn) {
  for (int64_t c0 = 0; c0 < n_units; c0 += 32 * B) {  // warp-uniform trip count
    uint4 raw[B][R];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int64_t u = c0 + 32 * b + lane;
      if (u < n_units)
#pragma unroll
        for (int i = 0; i < R; ++i) raw[b][i] = ld(reinterpret_cast<const uint4*>(rows[i]) + u);
    }
    if (c0 == 0) on_issued();
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int64_t u = c0 + 32 * b + lane;
      if (u < n_units) unit_fn(u, raw[b]);
    }
  }
}

// Lane-strided dot products of R weight rows with one f32 vector x (n_units *
// U floats, read through the XGlobal/XShared view xv); sums[i] is valid in lane
// 0 (and garbage for i >= nr: those rows repeat rows[0] so that every lane runs
// the same code). Every lane of the warp must call it. Per row and lane: units
// lane, lane+32, ... each element j in order, acc = fma(w, x, acc); then
// warp_sum — the canonical order, so any R, x view and the staged/unstaged
// variants give bit-identical results. R > 1 reuses each x unit (registers)
// for R rows and keeps R rows' loads in flight per warp.
// on_issued(): called once by every lane right after the first weight loads are
// in flight (the block prologue — staging x, tables — overlaps them; it may
// synchronise the block).
// S > 0 (staged, requires can_stage): the units come through warp_rows_staged's
// ring of shared-memory chunks.
// Unstaged F32/F16/BF16 (one 16-byte vector per unit): 16 / R units per lane are
// loaded into registers before any is used (the matrices that take this path
// are small: without several loads in flight per lane they are latency-bound).
template <GgmlType T, int R, int S, class XView, class OnIssued>
__device__ __forceinline__ void warp_rows_dot(const uint8_t* const (&rows)[R], int64_t n_units, const XView& xv,
                                              int lane, const QuantTables& tab, typename UnitStaging<T>::Vec* stage,
                                              float (&sums)[R], OnIssued&& on_issued) {
  constexpr int U = WeightUnit<T>::U;
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  // acc[i] += w_i (decoded by decode_i(i, w)) times x unit u.
  auto fma_unit = [&](int64_t u, auto&& decode_i) {
    float xu[U];
    xv.unit(u, xu);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float w[U];
      decode_i(i, w);
#pragma unroll
      for (int j = 0; j < U; ++j) acc[i] = fmaf(w[j], xu[j], acc[i]);
    }
  };
  if constexpr (S > 0) {
    warp_rows_staged<T, R, S>(rows, n_units, lane, stage, on_issued, [&](int64_t u, auto&& row_buf) {
      fma_unit(u, [&](int r, float* w) {
        if constexpr (T == GgmlType::Q8_0)
          WeightUnit<T>::decode_words(row_buf(r), lane, w);
        else
          WeightUnit<T>::decode(row_buf(r), lane, w, tab);
      });
    });
  } else if constexpr (T == GgmlType::F32 || T == GgmlType::F16 || T == GgmlType::BF16) {
    constexpr int B = R >= 16 ? 1 : 16 / R;  // units per lane in flight
    warp_rows_vec<B, R>(rows, n_units, lane, on_issued, [&](int64_t u, const uint4(&raw)[R]) {
      fma_unit(u, [&](int i, float* w) { WeightUnit<T>::decode_vec(raw[i], w); });
    });
  } else {
    on_issued();
    for (int64_t u = lane; u < n_units; u += 32)
      fma_unit(u, [&](int i, float* w) { WeightUnit<T>::decode(rows[i], u, w, tab); });
  }
#pragma unroll
  for (int i = 0; i < R; ++i) sums[i] = warp_sum(acc[i]);
}

}  // namespace dsv4::cuda
