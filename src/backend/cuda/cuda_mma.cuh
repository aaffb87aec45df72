// The f16 kind of the tensor-core weight tile (the tile itself:
// cuda_mma_tile.cuh) of the prefill matmul (cuda_matmul.cu) and the
// expert-grouped MoE (cuda_moe.cu) — its weight codes and split x — for the block-quantised weight types
// (Q8_0, Q2_K, Q4_K, IQ2_XXS, MXFP4; and F16 in the matmul): one 256-thread block computes 256 weight rows
// (32 per warp: two m16 tiles) x BN tokens (BN = 8, 16 or 32) with
// mma.sync.m16n8k16 (f16 inputs, f32 accumulation).
//
//   out(r, tt) = sum_c W[r, c] * xrow[tt][c]
//
// Exactness of the inputs. Every weight of these types is (block scale) x
// (small integer code) [- block min]: the MMA multiplies the integer codes
// (|code| <= 128, exact in f16) and the scales are applied in f32 after each
// 32-element unit (16 for Q2_K's sub-blocks):
//   Q8_0     w = d * q                      code q (int8)
//   IQ2_XXS  w = db * (+-grid)              code +-grid byte (8, 25 or 43)
//   Q4_K     w = d1 * q - m1                code q (0..15); the min term -m1 * sum(x) per unit
//   Q2_K     w = dl_s * q - ml_s (s = 0, 1) code q (0..3);  per 16-element sub-block
//   MXFP4    w = (2^14 s) * c              code c = the E2M1 value * 2^-14 as an f16 (its bits are
//                                           the E2M1 code's, shifted: MmaCodes<MXFP4>); s = 2^(e - 127)
//   F16      w = 1 * w                      the f16 weight itself (matmul only)
// x is not f16: each (token, unit) of 32 values is scaled by a power of two
// 2^s so that its largest magnitude lies in [2^14, 2^15), then split into
// f16 hi = f16(x 2^s) and lo = f16(x 2^s - hi) — 22 significant bits, so the
// products are within ~2^-22 of f32's — and the MMA runs twice (hi, lo); the
// unit's sum is multiplied back by (scale * 2^-s). Accuracy: NMSE ~1e-13
// against the CPU's f32 dot products (test_cuda_ops, k_thr_f32 = 1e-10).
// The summation order is not the matvec's (cuda_quant.cuh): results agree with
// the decode kernels to f32 rounding, not bitwise (the FFMA tile of
// cuda_tile.cuh keeps the bitwise agreement; CudaBackendOptions::tensor_cores
// = false selects it).
//
// Fragment order. The MMA sums over k in any order, so each unit's 32
// elements are laid out in "fragment positions" p = 8t + 4s + i (quad lane t =
// lane % 4, MMA step s = 0, 1, i = 0..3): quad lane t holds positions 8t..8t+7
// of both its weight rows (A) and its token (B), A's register pairs and B's
// 16-byte shared load line up without shuffles. Element of position (t, s, i):
//   Q8_0, IQ2_XXS, Q4_K: 8t + 4s + i (identity: 8 consecutive elements per lane)
//   Q2_K:                16s + 4t + i (step s = sub-block s, for its own scale)
//   MXFP4:               16s + 4t + i (quad lane t's 8 elements are the two nibbles of 4 code bytes)
//
// Launch plan (per matmul / expert matrix):
//   1. mma_split_x_kernel: one warp per (x row, unit), lane = element: the warp
//      max gives 2^s; the lane writes hi/lo at its fragment position; lane 0
//      writes {2^-s, f32 sums of x over elements 0..15, 16..31, 0..31} (fixed
//      shuffle tree; the min terms of Q2_K/Q4_K). Once per matmul, read by
//      every row block.
//   2. the tile kernel (matmul_mma_kernel / expert_mma_kernel) calls mma_tile
//      (cuda_mma_tile.cuh), which runs 4 MMAs (hi, lo x 2 k-steps) per 16x8
//      tile and unit and adds the scaled unit sums to f32 accumulators.
// With x from an INT8_32 activation quantiser the tile runs on int8 MMAs
// instead (cuda_mma_i8.cuh: its own split of x's codes, one MMA per unit).
//
// CPU reference: cpu::matmul (via quant::dequantize_row + f32 dot products).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_quant.cuh"

namespace dsv4::cuda {

// Whether T's fragment positions follow the sub-block order 16s + 4t + i (else the identity).
template <GgmlType T>
DSV4_HD constexpr bool mma_subblock_order() {
  return T == GgmlType::Q2_K || T == GgmlType::MXFP4;
}
// Element (0..31 of a unit) at fragment position p = 8t + 4s + i.
template <GgmlType T>
DSV4_HD int mma_elem_of_pos(int p) {
  if constexpr (mma_subblock_order<T>()) {
    const int t = p >> 3, s = (p >> 2) & 1, i = p & 3;
    return 16 * s + 4 * t + i;
  } else {
    return p;
  }
}
// Inverse: fragment position of element e.
template <GgmlType T>
DSV4_HD int mma_pos_of_elem(int e) {
  if constexpr (mma_subblock_order<T>()) {
    const int s = e >> 4, t = (e >> 2) & 3, i = e & 3;
    return 8 * t + 4 * s + i;
  } else {
    return e;
  }
}

DSV4_HD uint32_t pack_f16x2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// Small integers to f16 pairs without conversions: the f16 with bits 0x64nn is
// 1024 + nn exactly, so (0x6400 | b) - 1024 = b. codes_u8: the two low bytes
// (b0, b1) of x (the high bytes are ignored) minus `bias` (a f16 pair: 1024 for
// unsigned codes; 1152 after flipping the sign bit of int8 codes).
DSV4_HD uint32_t codes_u8_f16x2(uint32_t x, int lo_byte, uint32_t bias) {
  const uint32_t v = prmt(x, 0x64646464u, lo_byte == 0 ? 0x4140u : 0x4342u);  // [b, 0x64, b', 0x64]
#if defined(__CUDA_ARCH__)
  __half2 a, b;
  memcpy(&a, &v, 4);
  memcpy(&b, &bias, 4);
  const __half2 r = __hsub2(a, b);
  uint32_t u;
  memcpy(&u, &r, 4);
  return u;
#else
  auto f = [](uint32_t h) { return f16_bits_to_f32(static_cast<uint16_t>(h & 0xffffu)); };
  return pack_f16x2(f(v) - f(bias), f(v >> 16) - f(bias >> 16));
#endif
}
constexpr uint32_t k_f16x2_1024 = 0x64006400u;
constexpr uint32_t k_f16x2_1152 = 0x64806480u;

// c += A (16x16, row) * B (16x8, col), f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // sm_80+ only (the launchers never pick the MMA tile below sm_80)
#endif
}

// d = A B + c, m16n8k32, s8 x s8 -> s32 (exact).
__device__ __forceinline__ void imma_16832(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                           uint32_t b0, uint32_t b1, const int32_t (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};\n"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
  __trap();  // sm_80+ only (the launchers pick integer MMAs only on sm_80+)
#endif
}

// ---- exact f16 hi/lo splits under a power-of-two scale (cuda_gemm.cu's cuBLAS
// path and cuda_expert_gemm.cuh): v' = v 2^e, hi = f16(v'), lo = f16(v' - hi).
// e with m 2^e in [2^14, 2^15) for a finite m > 0; 0 otherwise (zero rows, and
// rows with an Inf or NaN, which then reach the output as the CPU's would, roughly).
__device__ __forceinline__ int split_exponent(float m) {
  if (!(m > 0.0f) || !isfinite(m)) return 0;
  int E = 0;
  frexpf(m, &E);  // m = f 2^E, f in [0.5, 1)
  return 15 - E;
}

// v (already scaled) as f16 hi and lo: v = hi + lo to ~22 bits.
__device__ __forceinline__ void split_f16(float v, __half& hi, __half& lo) {
  hi = __float2half_rn(v);
  lo = __float2half_rn(v - __half2float(hi));
}

__device__ __forceinline__ uint32_t half2_bits(__half a, __half b) {
  return static_cast<uint32_t>(__half_as_ushort(a)) | (static_cast<uint32_t>(__half_as_ushort(b)) << 16);
}

// Block max of non-negative values, broadcast (red: 33 floats of shared memory).
__device__ __forceinline__ float block_max_nonneg(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_max_all(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < n_warps ? red[lane] : 0.0f;
    s = warp_max_all(s);
    if (lane == 0) red[32] = s;
  }
  __syncthreads();
  return red[32];
}

// ---- bf16 tensor-core helpers (attention, indexer): shared-memory matrix
// loads (ldmatrix: lane l gives the address of row l % 8 of matrix l / 8; rows
// 16-byte aligned) and the bf16 MMA with f32 accumulators.
DSV4_HD uint16_t bf16_bits_rn(float x) {
  const __nv_bfloat16 b = __float2bfloat16_rn(x);
  uint16_t u;
  memcpy(&u, &b, 2);
  return u;
}
DSV4_HD uint32_t pack_bf16x2(float a, float b) {
  return static_cast<uint32_t>(bf16_bits_rn(a)) | (static_cast<uint32_t>(bf16_bits_rn(b)) << 16);
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const uint16_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
#else
  __trap();
#endif
}

// c += A (16x16, row) * B (16x8, col), bf16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const uint16_t* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p))
               : "memory");
#else
  __trap();
#endif
}

// The codes of quad lane t for one weight row and unit u, in two stages so
// that the tile can issue the next unit's loads before it decodes this one:
// load() reads the raw bytes (Raw, registers; it is called for u = 0, 1, 2, ...
// in order on the same Raw, and fields shared by consecutive units — a
// super-block's scales, Q2_K's code words — are read only when u enters a new
// group: the tile is bound by its load count), decode() makes h[k] = the f16
// pair at fragment positions (8t + 2k, 8t + 2k + 1) and sc[s] / mn[s] = the
// scale / min of MMA step s (NS = 1: one scale for the unit, sc[0] applies to
// both steps). Host and device: test_cuda_decode checks on the host that
// sc * code - mn rebuilds dequantize_row's weight bit for bit at every position.
// The IQ2_XXS grid (copied per block into shared memory by mma_smem_tables;
// on the host: quant::iq2xxs_grid()): entry i = 8 bytes, as two words. A lane
// gathers 8 bytes per 8 weights and turns them into f16 pairs itself (an
// expanded f16-pair table would be a 16-byte gather: twice the shared-memory
// wavefronts, the tile's limit). The signs are computed (iq2_sign_bits).
struct MmaTables {
  const uint2* grid = nullptr;  // [256]
};
// f16-pair sign masks of an 8-bit sign byte sg: pair k gets bit 2k of sg as
// bit 15 and bit 2k + 1 as bit 31 (XOR flips the pair's signs). With
// z = sg | sg << 15 (iq2_sign_spread, once per 8 weights), bit 2k of sg sits at
// bit 2k of z and bit 2k + 1 at bit 16 + 2k, so one shift by 15 - 2k moves both
// into place: a shift and a masked XOR per pair (was five logic ops).
DSV4_HD uint32_t iq2_sign_spread(uint32_t sg) { return sg | (sg << 15); }
DSV4_HD uint32_t iq2_pair_sign_mask(uint32_t z, int k) { return (z << (15 - 2 * k)) & 0x80008000u; }

template <GgmlType T>
struct MmaCodes;

template <>
struct MmaCodes<GgmlType::Q8_0> {
  static constexpr int NS = 1;
  static constexpr bool kMin = false;
  struct Raw {
    uint16_t d;
    uint32_t q[2];  // codes 8t..8t+7
  };
  // The 8 codes of lane t start at an even address: two 32-bit loads when it is
  // 4-aligned (every other block when rows hold an even number of blocks), else
  // 16 + 32 + 16 bits (not four 16-bit loads: each load of the tile is one L1
  // request per row, the tile's limit).
  DSV4_HD static void load(const uint8_t* row, int64_t u, int t, Raw& r) {
    const uint8_t* blk = row + u * 34;
    const uint8_t* q = blk + 2 + 8 * t;
    r.d = *reinterpret_cast<const uint16_t*>(blk);
    if ((reinterpret_cast<uintptr_t>(q) & 3u) == 0) {
      r.q[0] = *reinterpret_cast<const uint32_t*>(q);
      r.q[1] = *reinterpret_cast<const uint32_t*>(q + 4);
    } else {
      const uint32_t a = *reinterpret_cast<const uint16_t*>(q), m = *reinterpret_cast<const uint32_t*>(q + 2),
                     b = *reinterpret_cast<const uint16_t*>(q + 6);
      r.q[0] = a | (m << 16);
      r.q[1] = (m >> 16) | (b << 16);
    }
  }
  DSV4_HD static void decode(const Raw& r, int64_t, int, uint32_t (&h)[4], float (&sc)[NS], float (&)[NS],
                             const MmaTables&) {
    sc[0] = f16_bits_to_f32(r.d);
    DSV4_UNROLL
    for (int k = 0; k < 4; ++k)
      h[k] = codes_u8_f16x2(r.q[k >> 1] ^ 0x80808080u, 2 * (k & 1), k_f16x2_1152);  // q + 128 - 1152
  }
};

// F16 weights: the weights themselves (exact), scale 1; unit u = elements
// [32u, 32u + 32), quad lane t's 8 at fragment positions 8t..8t+7 (identity order).
template <>
struct MmaCodes<GgmlType::F16> {
  static constexpr int NS = 1;
  static constexpr bool kMin = false;
  struct Raw {
    uint4 v;
  };
  DSV4_HD static void load(const uint8_t* row, int64_t u, int t, Raw& r) {
    r.v = *reinterpret_cast<const uint4*>(row + u * 64 + 16 * t);
  }
  DSV4_HD static void decode(const Raw& r, int64_t, int, uint32_t (&h)[4], float (&sc)[NS], float (&)[NS],
                             const MmaTables&) {
    sc[0] = 1.0f;
    h[0] = r.v.x;
    h[1] = r.v.y;
    h[2] = r.v.z;
    h[3] = r.v.w;
  }
};

template <>
struct MmaCodes<GgmlType::IQ2_XXS> {
  static constexpr int NS = 1;
  static constexpr bool kMin = false;
  struct Raw {
    uint16_t d;
    uint8_t grid_idx;
    uint32_t wb;
  };
  DSV4_HD static void load(const uint8_t* row, int64_t u, int t, Raw& r) {
    const uint8_t* blk = row + (u >> 3) * 66;
    const int ib = static_cast<int>(u & 7);
    if (ib == 0) r.d = *reinterpret_cast<const uint16_t*>(blk);  // one per super-block of 8 units
    r.grid_idx = blk[2 + 8 * ib + t];      // byte t of the group's first word: the grid index of elements 8t..8t+7
    const uint8_t* pw = blk + 6 + 8 * ib;  // the group's second word (even address)
    if ((reinterpret_cast<uintptr_t>(pw) & 3u) == 0) {
      r.wb = *reinterpret_cast<const uint32_t*>(pw);
    } else {
      const uint16_t* g = reinterpret_cast<const uint16_t*>(pw);
      r.wb = static_cast<uint32_t>(g[0]) | (static_cast<uint32_t>(g[1]) << 16);
    }
  }
  // tab.grid: the grid entry's bytes (8, 25 or 43) become f16 pairs by the
  // byte-permute trick; the sign byte of elements 8t..8t+7 is computed from its
  // 7-bit index. One 8-byte shared-memory gather per 8 weights.
  DSV4_HD static void decode(const Raw& r, int64_t, int t, uint32_t (&h)[4], float (&sc)[NS], float (&)[NS],
                             const MmaTables& tab) {
    sc[0] = mul_rn(mul_rn(f16_bits_to_f32(r.d), 0.5f + static_cast<float>(r.wb >> 28)), 0.25f);
    const uint2 g = tab.grid[r.grid_idx];
    const uint32_t z = iq2_sign_spread(iq2_sign_bits((r.wb >> (7 * t)) & 127u));
    DSV4_UNROLL
    for (int k = 0; k < 4; ++k)
      h[k] = codes_u8_f16x2(k < 2 ? g.x : g.y, 2 * (k & 1), k_f16x2_1024) ^ iq2_pair_sign_mask(z, k);
  }
};

template <>
struct MmaCodes<GgmlType::Q4_K> {
  static constexpr int NS = 1;
  static constexpr bool kMin = true;
  struct Raw {
    uint32_t dd, s[3];
    uint2 q;
  };
  DSV4_HD static void load(const uint8_t* row, int64_t u, int t, Raw& r) {
    const uint8_t* blk = row + (u >> 3) * 144;
    const int j = static_cast<int>(u & 7), c = j >> 1;
    if (j == 0) {  // d, dmin and the 12 scale bytes: once per super-block
      const uint32_t* w = reinterpret_cast<const uint32_t*>(blk);
      r.dd = w[0];
      r.s[0] = w[1];
      r.s[1] = w[2];
      r.s[2] = w[3];
    }
    if ((j & 1) == 0) r.q = *reinterpret_cast<const uint2*>(blk + 16 + 32 * c + 8 * t);  // units 2c, 2c + 1
  }
  DSV4_HD static void decode(const Raw& r, int64_t u, int, uint32_t (&h)[4], float (&sc)[NS], float (&mn)[NS],
                             const MmaTables&) {
    const int j = static_cast<int>(u & 7);
    const float d = f16_bits_to_f32(static_cast<uint16_t>(r.dd & 0xffffu));
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(r.dd >> 16));
    int scv, m;
    q4k_scale_min(j, r.s[0], r.s[1], r.s[2], scv, m);
    sc[0] = mul_rn(d, static_cast<float>(scv));
    mn[0] = mul_rn(dmin, static_cast<float>(m));
    const int shift = (j & 1) * 4;
    const uint32_t q0 = (r.q.x >> shift) & 0x0F0F0F0Fu, q1 = (r.q.y >> shift) & 0x0F0F0F0Fu;
    h[0] = codes_u8_f16x2(q0, 0, k_f16x2_1024);
    h[1] = codes_u8_f16x2(q0, 2, k_f16x2_1024);
    h[2] = codes_u8_f16x2(q1, 0, k_f16x2_1024);
    h[3] = codes_u8_f16x2(q1, 2, k_f16x2_1024);
  }
};

template <>
struct MmaCodes<GgmlType::Q2_K> {
  static constexpr int NS = 2;
  static constexpr bool kMin = true;
  struct Raw {
    uint32_t dd, w[2];
    uint16_t scb;
  };
  DSV4_HD static void load(const uint8_t* row, int64_t u, int t, Raw& r) {
    const uint8_t* blk = row + (u >> 3) * 84;
    const int v = static_cast<int>(u & 7), hh = v >> 2;
    if (v == 0) r.dd = *reinterpret_cast<const uint32_t*>(blk + 80);  // one per super-block
    r.scb = *reinterpret_cast<const uint16_t*>(blk + 2 * v);          // scales[2v], scales[2v + 1]
    // Positions 8t + 4s + i = elements 16s + 4t + i = bits 2(v%4).. of qs[32hh + 16s + 4t + i]:
    // the same two words for units 4hh .. 4hh + 3.
    if ((v & 3) == 0) {
      r.w[0] = *reinterpret_cast<const uint32_t*>(blk + 16 + 32 * hh + 4 * t);
      r.w[1] = *reinterpret_cast<const uint32_t*>(blk + 16 + 32 * hh + 16 + 4 * t);
    }
  }
  DSV4_HD static void decode(const Raw& r, int64_t u, int, uint32_t (&h)[4], float (&sc)[NS], float (&mn)[NS],
                             const MmaTables&) {
    const int sh = 2 * static_cast<int>(u & 3);
    const float d = f16_bits_to_f32(static_cast<uint16_t>(r.dd & 0xffffu));
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(r.dd >> 16));
    DSV4_UNROLL
    for (int s = 0; s < 2; ++s) {
      const uint32_t b = s == 0 ? (r.scb & 0xffu) : (r.scb >> 8);
      sc[s] = mul_rn(d, static_cast<float>(b & 0x0Fu));
      mn[s] = mul_rn(dmin, static_cast<float>(b >> 4));
      const uint32_t q = (r.w[s] >> sh) & 0x03030303u;
      h[2 * s] = codes_u8_f16x2(q, 0, k_f16x2_1024);
      h[2 * s + 1] = codes_u8_f16x2(q, 2, k_f16x2_1024);
    }
  }
};

// MXFP4: quad lane t's codes are code bytes 4t .. 4t + 3 of the 17-byte block (low nibbles: elements
// 4t + i, step 0; high nibbles: 16 + 4t + i, step 1), read as the two aligned words that hold them
// (blocks are byte-aligned; both words hold a byte of the block) plus the scale byte. An E2M1 code
// (sign, exponent e1 e0, mantissa m) placed at f16 bits 15 and 11..9 is the f16 of its value times
// 2^-14 (exponent field e1 e0: 2^(E - 15) (1 + m/2) for E >= 1, the subnormal m 2^-15 for E = 0), so
// the codes need two masks and shifts per pair; the unit scale is then 2^14 s (exact; it overflows
// to inf only for e >= 241, block scales above 2^113, which no real file has). Code 8 becomes -0, the
// reference's +0: the MMA's sums do not see the difference.
template <>
struct MmaCodes<GgmlType::MXFP4> {
  static constexpr int NS = 1;
  static constexpr bool kMin = false;
  struct Raw {
    uint32_t e, w0, w1, sh;
  };
  DSV4_HD static void load(const uint8_t* row, int64_t u, int t, Raw& r) {
    const uint8_t* blk = row + u * 17;
    const uintptr_t a = reinterpret_cast<uintptr_t>(blk) + 1 + 4 * static_cast<uintptr_t>(t);
    r.e = *blk;
    r.w0 = *reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
    r.w1 = *reinterpret_cast<const uint32_t*>((a + 3) & ~uintptr_t{3});
    r.sh = static_cast<uint32_t>(a & 3u) * 8;
  }
  DSV4_HD static void decode(const Raw& r, int64_t, int, uint32_t (&h)[4], float (&sc)[NS], float (&)[NS],
                             const MmaTables&) {
    sc[0] = mul_rn(mxfp4_scale(r.e), 16384.0f);
    const uint32_t q = funnel_r(r.w0, r.w1, r.sh);                          // code bytes 4t .. 4t + 3
    const uint32_t x01 = prmt(q, 0u, 0x4140u), x23 = prmt(q, 0u, 0x4342u);  // [b0, 0, b1, 0], [b2, 0, b3, 0]
    auto low = [](uint32_t x) { return ((x & 0x00070007u) << 9) | ((x & 0x00080008u) << 12); };
    auto high = [](uint32_t x) { return ((x & 0x00700070u) << 5) | ((x & 0x00800080u) << 8); };
    h[0] = low(x01);
    h[1] = low(x23);
    h[2] = high(x01);
    h[3] = high(x23);
  }
};

template <GgmlType T>
constexpr bool mma_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::Q2_K || T == GgmlType::Q4_K || T == GgmlType::IQ2_XXS ||
         T == GgmlType::MXFP4;
}
// Types the matmul tile takes: the block-quantised ones and F16 (its own
// codes: every f16 weight is exact in f16, scale 1; units of 32 elements).
template <GgmlType T>
constexpr bool mma_tile_type() {
  return mma_type<T>() || T == GgmlType::F16;
}

// ---- x, split once per matmul (mma_split_x_kernel), read by every row block.
// (The int8 tile's split, mma_split_x_i8, fills the same struct with 32 bytes of codes per (row, unit) in q and
// {2^k, sums} in s.) Per (row, unit): 128 bytes = hi[32] then lo[32] f16 in fragment order
// (uint4 k of the unit: hi positions 8k..8k+7 for k < 4, lo for k >= 4), and
// float4 {2^-s, sum of elements 0..15, sum of 16..31, sum of 0..31} (f32,
// fixed shuffle tree; the sums of the unscaled x, for the min terms).
struct MmaX {
  const uint4* q = nullptr;   // [rows][units][8]
  const float4* s = nullptr;  // [rows][units]
  int64_t units = 0;          // units per row
};
// Bytes of q + s for rows x units (a 16-byte multiple). The tile indexes the
// split with 32-bit offsets: rows * units * 8 must stay below 2^31 (checked by mma_split_x).
inline size_t mma_split_bytes(int64_t rows, int64_t units) { return static_cast<size_t>(rows * units) * (128 + 16); }

// The split kernels' warps (one per (row, unit) pr, 8 per block, lane = element): this lane's value
// x[row * x_stride + 32 unit + lane]; false for the warps past the last unit (whole warps).
__device__ __forceinline__ bool mma_split_unit(const float* __restrict__ x, int64_t x_stride, int64_t rows,
                                               int64_t units, int64_t& pr, float& v) {
  pr = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (pr >= rows * units) return false;
  v = x[(pr / units) * x_stride + (pr % units) * 32 + (threadIdx.x & 31)];
  return true;
}
// Lane 0 of the unit's warp stores s[pr] = {scale, sum of x over elements 0..15, 16..31, 0..31} (f32, fixed
// shuffle tree: the 16-element halves first, then the unit; the min terms' sums).
__device__ __forceinline__ void mma_split_sums(float4* __restrict__ s, int64_t pr, float v, float scale) {
  float sum = v;
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
  const float other = __shfl_xor_sync(0xffffffffu, sum, 16);
  if ((threadIdx.x & 31) == 0) s[pr] = make_float4(scale, sum, other, __fadd_rn(sum, other));
}

// One warp per (row, unit), lane = element: x[row * x_stride + 32 unit + lane].
template <bool SubBlock>
__global__ void __launch_bounds__(256)
    mma_split_x_kernel(const float* __restrict__ x, int64_t x_stride, int64_t rows, int64_t units,
                       uint4* __restrict__ q, float4* __restrict__ s) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  int64_t pr;
  float v;
  if (!mma_split_unit(x, x_stride, rows, units, pr, v)) return;
  float m = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  int e = 0;
  (void)frexpf(m, &e);  // m = f 2^e, f in [0.5, 1) (e = 0 for m = 0)
  int sh = 15 - e;      // |x| 2^sh < 2^15
  sh = sh < -100 ? -100 : (sh > 100 ? 100 : sh);
  const float xs = __fmul_rn(v, __int_as_float((127 + sh) << 23));  // exact: a power of two, no overflow
  const __half hi = __float2half_rn(xs);
  const __half lo = __float2half_rn(__fsub_rn(xs, __half2float(hi)));
  const int p = SubBlock ? mma_pos_of_elem<GgmlType::Q2_K>(lane) : lane;
  __half* dst = reinterpret_cast<__half*>(q + pr * 8);
  dst[p] = hi;
  dst[32 + p] = lo;
  mma_split_sums(s, pr, v, __int_as_float((127 - sh) << 23));
}

// Splits rows x [rows][x_stride] (the first `units` units of each) into buffer `buf`
// (mma_split_bytes(rows, units) bytes, 16-byte aligned) in T's fragment order.
template <GgmlType T>
MmaX mma_split_x(cudaStream_t stream, const float* x, int64_t x_stride, int64_t rows, int64_t units, void* buf) {
  DSV4_ASSERT(rows * units * 8 < (int64_t{1} << 31), "MMA tile: %lld x %lld split units", static_cast<long long>(rows),
              static_cast<long long>(units));
  MmaX r;
  r.units = units;
  r.q = static_cast<const uint4*>(buf);
  r.s = reinterpret_cast<const float4*>(static_cast<uint8_t*>(buf) + static_cast<size_t>(rows * units) * 128);
  const int64_t pairs = rows * units;
  if (pairs == 0) return r;
  const unsigned blocks = static_cast<unsigned>((pairs + 7) / 8);
  launch_kernel(mma_split_x_kernel<mma_subblock_order<T>()>, blocks, 256, 0, stream, x, x_stride, rows, units,
                const_cast<uint4*>(r.q), const_cast<float4*>(r.s));
  return r;
}

}  // namespace dsv4::cuda
