// The tensor-core weight tile of the prefill matmul (cuda_matmul.cu) and the
// expert-grouped MoE (cuda_moe.cu), for the block-quantised weight types
// (Q8_0, Q2_K, Q4_K, IQ2_XXS): one 256-thread block computes 256 weight rows
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
//
// Staging (per chunk of 4 units = 128 columns): warp w takes (token, unit)
// pairs, lane = element: the warp max gives 2^s, the lane writes hi/lo at its
// fragment position (rows padded to 320 bytes: the quarter-warps' 16-byte
// loads hit distinct banks), the unit's token scale 2^-s and, for Q2_K/Q4_K,
// the f32 sums of x per 16/32 elements (shuffle tree, fixed order).
// Weights are decoded straight from global memory into A fragments (each quad
// lane reads its 8 codes and the row's scales).
//
// CPU reference: cpu::matmul (via quant::dequantize_row + f32 dot products).
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/cuda_quant.cuh"

namespace dsv4::cuda {

constexpr int k_mma_rows = 256;      // weight rows per block (8 warps x 2 m16 tiles)
constexpr int k_mma_chunk_units = 4; // 32-element units staged per chunk
constexpr int k_mma_xstride = 160;   // halves per staged token row (128 + 32 pad: 320 bytes)

// Element (0..31 of a unit) at fragment position p = 8t + 4s + i.
template <GgmlType T>
DSV4_HD int mma_elem_of_pos(int p) {
  if constexpr (T == GgmlType::Q2_K) {
    const int t = p >> 3, s = (p >> 2) & 1, i = p & 3;
    return 16 * s + 4 * t + i;
  } else {
    return p;
  }
}
// Inverse: fragment position of element e.
template <GgmlType T>
DSV4_HD int mma_pos_of_elem(int e) {
  if constexpr (T == GgmlType::Q2_K) {
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

// c += A (16x16, row) * B (16x8, col), f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // sm_80+ only (the launchers never pick the MMA tile below sm_80)
#endif
}

// The codes of quad lane t for one weight row and unit u: h[k] = the f16 pair
// at fragment positions (8t + 2k, 8t + 2k + 1); sc[s] / mn[s] = the scale /
// min of MMA step s (NS = 1: one scale for the unit, sc[0] applies to both steps).
// Host and device: test_cuda_decode checks on the host that sc * code - mn
// rebuilds dequantize_row's weight bit for bit at every position.
template <GgmlType T>
struct MmaCodes;

template <>
struct MmaCodes<GgmlType::Q8_0> {
  static constexpr int NS = 1;
  static constexpr bool kMin = false;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, int t, uint32_t (&h)[4], float (&sc)[NS], float (&)[NS],
                                const QuantTables&) {
    const uint16_t* b = reinterpret_cast<const uint16_t*>(row + u * 34);
    sc[0] = f16_bits_to_f32(b[0]);
DSV4_UNROLL
    for (int k = 0; k < 4; ++k) {
      const uint16_t q2 = b[1 + 4 * t + k];
      h[k] = pack_f16x2(static_cast<float>(static_cast<int8_t>(q2 & 0xff)), static_cast<float>(static_cast<int8_t>(q2 >> 8)));
    }
  }
};

template <>
struct MmaCodes<GgmlType::IQ2_XXS> {
  static constexpr int NS = 1;
  static constexpr bool kMin = false;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, int t, uint32_t (&h)[4], float (&sc)[NS], float (&)[NS],
                                const QuantTables& tab) {
    const uint16_t* blk = reinterpret_cast<const uint16_t*>(row + (u >> 3) * 66);
    const int ib = static_cast<int>(u & 7);
    const float d = f16_bits_to_f32(blk[0]);
    const uint16_t* g = blk + 1 + 4 * ib;
    const uint32_t wa = static_cast<uint32_t>(g[0]) | (static_cast<uint32_t>(g[1]) << 16);
    const uint32_t wb = static_cast<uint32_t>(g[2]) | (static_cast<uint32_t>(g[3]) << 16);
    sc[0] = mul_rn(mul_rn(d, 0.5f + static_cast<float>(wb >> 28)), 0.25f);
    const uint64_t grid = tab.iq2_grid[(wa >> (8 * t)) & 0xFFu];
    const uint32_t sg = tab.iq2_signs[(wb >> (7 * t)) & 127u];
DSV4_UNROLL
    for (int k = 0; k < 4; ++k) {
      float v[2];
DSV4_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int e = 2 * k + j;
        const float m = static_cast<float>((grid >> (8 * e)) & 0xFFu);
        v[j] = ((sg >> e) & 1u) ? -m : m;
      }
      h[k] = pack_f16x2(v[0], v[1]);
    }
  }
};

template <>
struct MmaCodes<GgmlType::Q4_K> {
  static constexpr int NS = 1;
  static constexpr bool kMin = true;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, int t, uint32_t (&h)[4], float (&sc)[NS], float (&mn)[NS],
                                const QuantTables&) {
    const uint8_t* blk = row + (u >> 3) * 144;
    const int j = static_cast<int>(u & 7), c = j >> 1;
    const uint32_t dd = *reinterpret_cast<const uint32_t*>(blk);
    const float d = f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu));
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(dd >> 16));
    const uint8_t* s = blk + 4;
    int scv, m;
    if (j < 4) {
      scv = s[j] & 63;
      m = s[j + 4] & 63;
    } else {
      scv = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
      m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    sc[0] = mul_rn(d, static_cast<float>(scv));
    mn[0] = mul_rn(dmin, static_cast<float>(m));
    const uint2 q = *reinterpret_cast<const uint2*>(blk + 16 + 32 * c + 8 * t);
    const int shift = (j & 1) * 4;
DSV4_UNROLL
    for (int k = 0; k < 4; ++k) {
      const uint32_t w = k < 2 ? q.x : q.y;
      const int b0 = 16 * (k & 1);
      h[k] = pack_f16x2(static_cast<float>((w >> (b0 + shift)) & 0x0Fu), static_cast<float>((w >> (b0 + 8 + shift)) & 0x0Fu));
    }
  }
};

template <>
struct MmaCodes<GgmlType::Q2_K> {
  static constexpr int NS = 2;
  static constexpr bool kMin = true;
  DSV4_HD static void decode(const uint8_t* row, int64_t u, int t, uint32_t (&h)[4], float (&sc)[NS], float (&mn)[NS],
                                const QuantTables&) {
    const uint8_t* blk = row + (u >> 3) * 84;
    const int v = static_cast<int>(u & 7), hh = v >> 2, sh = 2 * (v & 3);
    const uint32_t dd = *reinterpret_cast<const uint32_t*>(blk + 80);
    const float d = f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu));
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(dd >> 16));
    const uint16_t scb = *reinterpret_cast<const uint16_t*>(blk + 2 * v);  // scales[2v], scales[2v + 1]
DSV4_UNROLL
    for (int s = 0; s < 2; ++s) {
      const uint32_t b = s == 0 ? (scb & 0xffu) : (scb >> 8);
      sc[s] = mul_rn(d, static_cast<float>(b & 0x0Fu));
      mn[s] = mul_rn(dmin, static_cast<float>(b >> 4));
      // Positions 8t + 4s + i = elements 16s + 4t + i = bits sh.. of qs[32hh + 16s + 4t + i].
      const uint32_t w = *reinterpret_cast<const uint32_t*>(blk + 16 + 32 * hh + 16 * s + 4 * t);
      h[2 * s] = pack_f16x2(static_cast<float>((w >> sh) & 3u), static_cast<float>((w >> (8 + sh)) & 3u));
      h[2 * s + 1] = pack_f16x2(static_cast<float>((w >> (16 + sh)) & 3u), static_cast<float>((w >> (24 + sh)) & 3u));
    }
  }
};

template <GgmlType T>
constexpr bool mma_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::Q2_K || T == GgmlType::Q4_K || T == GgmlType::IQ2_XXS;
}

// Shared memory of one MMA tile block (BN tokens).
template <int BN>
struct MmaSmem {
  __half hi[BN][k_mma_xstride];
  __half lo[BN][k_mma_xstride];
  float tscale[BN][k_mma_chunk_units];      // 2^-s of (token, unit)
  float xsum[BN][2 * k_mma_chunk_units];    // sums of x per 16 elements (Q2_K) or per unit ([.][u], Q4_K)
};

// Computes the tile and calls store(r, tt, value) for every row r in
// [r_blk, min(r_blk + 256, r_end)) and token tt < nt. w: row 0 of the weight
// matrix (row r at r * row_bytes); xrow[tt]: token tt's input row (cols
// floats, read for tt < nt). blockDim.x must be 256; every thread calls it.
template <GgmlType T, int BN, class Store>
__device__ __forceinline__ void mma_tile(const uint8_t* __restrict__ w, size_t row_bytes, int64_t r_blk, int64_t r_end,
                                         int64_t n_units, const float* const* xrow, int nt, MmaSmem<BN>& sm,
                                         const QuantTables& tab, Store store) {
  static_assert(mma_type<T>(), "MMA tile: block-quantised types only");
  constexpr int NJ = BN / 8;  // n8 tiles
  constexpr int NS = MmaCodes<T>::NS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;

  // This lane's 4 weight rows: m-tile mt, rows g and g + 8 (clamped to a valid row; never stored).
  const uint8_t* rp[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int64_t r = r_blk + 32 * warp + 16 * mt + 8 * h + g;
      if (r >= r_end) r = r_end - 1;
      rp[mt][h] = w + r * row_bytes;
    }
  float acc[2][NJ][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][j][i] = 0.0f;
  const bool warp_live = r_blk + 32 * warp < r_end;

  for (int64_t u0 = 0; u0 < n_units; u0 += k_mma_chunk_units) {
    // ---- stage x for units [u0, u0 + 4) of every token: (token, unit) pairs per warp, lane = element.
    for (int pr = warp; pr < BN * k_mma_chunk_units; pr += 8) {
      const int n = pr / k_mma_chunk_units, uu = pr % k_mma_chunk_units;
      const int64_t u = u0 + uu;
      float x = 0.0f;
      if (n < nt && u < n_units) x = xrow[n][u * 32 + lane];
      float m = fabsf(x);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      int e = 0;
      (void)frexpf(m, &e);  // m = f * 2^e, f in [0.5, 1) (e = 0 for m = 0)
      int s = 15 - e;       // |x| 2^s < 2^15
      s = s < -100 ? -100 : (s > 100 ? 100 : s);
      const float up = __int_as_float((127 + s) << 23), down = __int_as_float((127 - s) << 23);
      const float xs = __fmul_rn(x, up);  // exact (power of two, no overflow)
      const __half hi = __float2half_rn(xs);
      const __half lo = __float2half_rn(__fsub_rn(xs, __half2float(hi)));
      const int p = uu * 32 + mma_pos_of_elem<T>(lane);
      sm.hi[n][p] = hi;
      sm.lo[n][p] = lo;
      if (lane == 0) sm.tscale[n][uu] = down;
      if constexpr (MmaCodes<T>::kMin) {
        float sum = x;  // fixed tree: 16-element halves first (Q2_K keeps them), then the unit
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
        if constexpr (NS == 2) {
          if ((lane & 15) == 0) sm.xsum[n][2 * uu + (lane >> 4)] = sum;
        } else {
          sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 16));
          if (lane == 0) sm.xsum[n][uu] = sum;
        }
      }
    }
    __syncthreads();
    if (warp_live) {
      const int nu = static_cast<int>(n_units - u0 < k_mma_chunk_units ? n_units - u0 : k_mma_chunk_units);
      for (int uu = 0; uu < nu; ++uu) {
        const int64_t u = u0 + uu;
        uint32_t a[2][2][4];  // [mt][row g / g + 8][pair]
        float sc[2][2][NS], mn[2][2][NS];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) MmaCodes<T>::decode(rp[mt][h], u, t, a[mt][h], sc[mt][h], mn[mt][h], tab);
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          if (8 * j >= nt) break;  // warp-uniform
          const int n = 8 * j + g;  // B column of this lane
          const uint4 bh = *reinterpret_cast<const uint4*>(&sm.hi[n][uu * 32 + 8 * t]);
          const uint4 bl = *reinterpret_cast<const uint4*>(&sm.lo[n][uu * 32 + 8 * t]);
          const int c0 = 8 * j + 2 * t;  // accumulator columns c0, c0 + 1
          const float ts0 = sm.tscale[c0][uu], ts1 = sm.tscale[c0 + 1][uu];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            float c[NS][4];
#pragma unroll
            for (int s = 0; s < NS; ++s)
#pragma unroll
              for (int i = 0; i < 4; ++i) c[s][i] = 0.0f;
            // step 0: positions 8t + 0..3 (pairs 0, 1); step 1: 8t + 4..7 (pairs 2, 3)
            mma_16816(c[0], a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], bh.x, bh.y);
            mma_16816(c[0], a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], bl.x, bl.y);
            mma_16816(c[NS - 1], a[mt][0][2], a[mt][1][2], a[mt][0][3], a[mt][1][3], bh.z, bh.w);
            mma_16816(c[NS - 1], a[mt][0][2], a[mt][1][2], a[mt][0][3], a[mt][1][3], bl.z, bl.w);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i >> 1;  // row g (i = 0, 1) or g + 8 (i = 2, 3)
              const float ts = (i & 1) ? ts1 : ts0;
              float v = acc[mt][j][i];
#pragma unroll
              for (int s = 0; s < NS; ++s) v = fmaf(__fmul_rn(sc[mt][h][s], ts), c[s][i], v);
              if constexpr (MmaCodes<T>::kMin) {
                const int col = c0 + (i & 1);
#pragma unroll
                for (int s = 0; s < NS; ++s) v = fmaf(-mn[mt][h][s], sm.xsum[col][NS * uu + s], v);
              }
              acc[mt][j][i] = v;
            }
          }
        }
      }
    }
    __syncthreads();
  }
  if (!warp_live) return;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t r = r_blk + 32 * warp + 16 * mt + 8 * (i >> 1) + g;
        const int tt = 8 * j + 2 * t + (i & 1);
        if (r < r_end && tt < nt) store(r, tt, acc[mt][j][i]);
      }
}

}  // namespace dsv4::cuda
