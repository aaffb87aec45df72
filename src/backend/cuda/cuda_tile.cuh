// The batched FFMA weight tile shared by the prefill matmul (cuda_matmul.cu) and the
// expert-grouped MoE (cuda_moe.cu): one 256-thread block computes 32 weight rows
// (4 per warp) x up to 8 tokens whose input rows are given by pointers. Used for
// F32/F16/BF16 weights, and for every type when tensor cores are off
// (CudaOptions::tensor_cores = false); cuda_mma.cuh is the tensor-core tile.
//
//   out(r, tt) = sum_c W[r, c] * xrow[tt][c]        r in [r_blk, r_blk + 32), tt < nt
//
// Summation order (what makes it bit-identical to the matvec of cuda_quant.cuh
// for every batch size): lane l accumulates units u = l, l + 32, ... and the
// U elements of each unit in order, acc = fma(w, x, acc); then warp_sum.
//
// x is staged per chunk of 32 units in shared memory ([8][32][U + 1] floats,
// the +1 pad keeps lanes on distinct banks); each lane decodes its unit of the
// warp's 4 rows into registers, then reads each staged x value once for the 4
// rows (one shared load per 4 FMAs; FFMA-bound, not shared-load-bound). Plain
// FFMA (no tensor cores): the decoded weight and x feed fmaf exactly as in the matvec.
#pragma once

#include "backend/cuda/cuda_quant.cuh"

namespace dsv4::cuda {

constexpr int k_tile_tokens = 8;  // tokens per block
constexpr int k_tile_rpw = 4;     // rows per warp
constexpr int k_tile_rows = 8 * k_tile_rpw;

// Shared memory of one tile block for weight type T.
template <GgmlType T>
struct TileSmem {
  float xs[k_tile_tokens][32 * (WeightUnit<T>::U + 1)];
};

// Computes the tile and calls store(r, tt, value) from lane 0 for every row
// r < r_end and token tt < nt. w: row 0 of the weight matrix (row r at
// r * row_bytes); r_warp: this warp's first row; xrow[tt]: token tt's input row
// (cols floats; only read for tt < nt); x_vec4: every xrow is 16-byte aligned
// (then x is staged with float4 loads). blockDim.x must be 256; every thread
// of the block must call it.
template <GgmlType T, class Store>
__device__ __forceinline__ void weight_tile(const uint8_t* __restrict__ w, size_t row_bytes, int64_t r_warp,
                                            int64_t r_end, int64_t n_units, int64_t cols, const float* const* xrow,
                                            int nt, bool x_vec4, TileSmem<T>& sm, const QuantTables& tab, Store store) {
  constexpr int U = WeightUnit<T>::U;
  constexpr int UP = U + 1;
  constexpr int NT = k_tile_tokens, RW = k_tile_rpw;
  constexpr int CH = 32 * U;  // elements per chunk (one unit per lane)
  const int lane = threadIdx.x & 31;

  float acc[RW][NT];
#pragma unroll
  for (int a = 0; a < RW; ++a)
#pragma unroll
    for (int b = 0; b < NT; ++b) acc[a][b] = 0.0f;

  const int64_t n_chunks = (n_units + 31) / 32;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t e0 = c * CH;
    if (x_vec4) {
      // All of this thread's float4 loads are issued before the first store
      // (blockDim.x == 256; NT * CH / 4 is a multiple of 256 for every U >= 4).
      constexpr int PER = NT * CH / 4 / 256;
      float4 v[PER];
#pragma unroll
      for (int k = 0; k < PER; ++k) {
        const int i = 4 * (static_cast<int>(threadIdx.x) + 256 * k);
        const int tt = i / CH, e = i % CH;  // e % 4 == 0, and cols % 4 == 0
        v[k] = tt < nt && e0 + e < cols ? *reinterpret_cast<const float4*>(xrow[tt] + e0 + e)
                                        : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int k = 0; k < PER; ++k) {
        const int i = 4 * (static_cast<int>(threadIdx.x) + 256 * k);
        const int tt = i / CH, e = i % CH;
        float* d = &sm.xs[tt][(e / U) * UP + e % U];  // U >= 4: the 4 elements share a unit
        d[0] = v[k].x;
        d[1] = v[k].y;
        d[2] = v[k].z;
        d[3] = v[k].w;
      }
    } else {
      for (int i = threadIdx.x; i < NT * CH; i += blockDim.x) {
        const int tt = i / CH, e = i % CH;
        float v = 0.0f;
        if (tt < nt && e0 + e < cols) v = xrow[tt][e0 + e];
        sm.xs[tt][(e / U) * UP + e % U] = v;
      }
    }
    __syncthreads();
    const int64_t u = c * 32 + lane;
    if (u < n_units && r_warp < r_end) {
      // The warp's RW units decoded into registers first (rows past r_end
      // decode row r_warp again; their sums are never stored), then every
      // staged x value is read once and used for RW rows: one shared load per
      // RW fused multiply-adds. Each (row, token) chain still adds its unit's
      // elements j = 0..U-1 in order.
      float wv[RW][U];
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const int64_t r = r_warp + rr < r_end ? r_warp + rr : r_warp;
        WeightUnit<T>::decode(w + r * row_bytes, u, wv[rr], tab);
      }
#pragma unroll
      for (int j = 0; j < U; ++j)
#pragma unroll
        for (int tt = 0; tt < NT; ++tt) {
          const float xv = sm.xs[tt][lane * UP + j];
#pragma unroll
          for (int rr = 0; rr < RW; ++rr) acc[rr][tt] = fmaf(wv[rr][j], xv, acc[rr][tt]);
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int rr = 0; rr < RW; ++rr)
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      const float s = warp_sum(acc[rr][tt]);
      const int64_t r = r_warp + rr;
      if (lane == 0 && r < r_end && tt < nt) store(r, tt, s);
    }
}

}  // namespace dsv4::cuda
