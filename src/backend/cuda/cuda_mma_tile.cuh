// The tensor-core weight tile (the prefill matmul's matmul_mma_kernel and the
// MoE's expert_mma_kernel): 256 weight rows (8 warps x 2 m16 tiles) x BN
// tokens (8, 16 or 32) per block, in one of two kinds:
//   f16 (I8 = false; cuda_mma.cuh): x split into f16 hi + lo per (token, unit),
//     4 mma.sync.m16n8k16 per 16x8 tile and unit; every type of mma_tile_type;
//   int8 (I8 = true; cuda_mma_i8.cuh): x an INT8_32 quantiser's output, its
//     codes against the weights' int8 codes, 1 mma.sync.m16n8k32 s8 per 16x8
//     tile and unit; the types of mma_i8_type.
// Per 32-element unit each warp decodes its 32 rows' codes straight from
// global memory into A fragments (the next unit's raw bytes loaded before this
// unit's MMAs: the tile is bound by its load and issue counts), runs the MMAs
// against the block's shared copy of the split x and adds each unit's sums into
// f32 accumulators with the unit's scales (and min terms). The block copies
// the split x of k_mma_uc units of its tokens per chunk into shared memory
// (cp.async, two buffers, one barrier per chunk).
#pragma once

#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_mma_i8.cuh"

namespace dsv4::cuda {

constexpr int k_mma_rows = 256;  // weight rows per block (8 warps x 2 m16 tiles)
constexpr int k_mma_uc = 8;      // units per staged chunk of the split x

// Shared memory of one tile block: the IQ2_XXS tables, the split-x row of each
// of the BN tokens, and two chunk buffers of the split x (cp.async ring):
//   f16: q[buf][n][uu][8] uint4: token n's unit u0 + uu; for odd n the hi and
//     lo halves trade places (slot k ^ 4), so the two tokens of a
//     quarter-warp's 16-byte loads hit different banks;
//   int8: q[buf][uu][n][2] uint4: token n's 32 codes of unit u0 + uu (the 8
//     tokens of a quarter-warp's 8-byte loads 32 bytes apart: a half-warp's 16
//     loads cover the 32 banks);
//   s[buf][uu][n] float4: unit-major, so the 4 accumulator column pairs of a
//     quarter-warp are 32 bytes apart (distinct banks).
template <int BN, bool I8 = false>
struct MmaSmem {
  uint4 q[2][BN][k_mma_uc][8];
  float4 s[2][k_mma_uc][BN];
  uint2 grid[256];
  int64_t xrow[BN];
};
template <int BN>
struct MmaSmem<BN, true> {
  uint4 q[2][k_mma_uc][BN][2];
  float4 s[2][k_mma_uc][BN];
  uint2 grid[256];
  int64_t xrow[BN];
};

// Builds the IQ2_XXS grid table in sm and returns tables pointing there. Every
// thread must call it (it ends with __syncthreads, which also publishes xrow).
template <class Smem>
__device__ __forceinline__ MmaTables mma_smem_tables(Smem& sm, const QuantTables& tab) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    const uint64_t e = tab.iq2_grid[i];
    sm.grid[i] = make_uint2(static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32));
  }
  __syncthreads();
  MmaTables t;
  t.grid = sm.grid;
  return t;
}

// Computes the tile and calls store(r, tt, value) for every row r in
// [r_blk, min(r_blk + 256, r_end)) and token tt < nt: the sum over the row's
// units [u_lo, u_hi) (all of them: 0, n_units; a slice of a split-K launch).
// w: row 0 of the weight matrix (row r at r * row_bytes); token tt's x is
// split row sm.xrow[tt] of xs (mma_split_x, or mma_split_x_i8 for I8), units
// [u_off + u_lo, u_off + u_hi) (u_off: the group of a grouped matmul). Every
// thread of the block must call it (blockDim.x == 256).
template <GgmlType T, int BN, bool I8, class Store>
__device__ __forceinline__ void mma_tile(const uint8_t* __restrict__ w, size_t row_bytes, int64_t r_blk, int64_t r_end,
                                         int64_t u_lo, int64_t u_hi, const MmaX& xs, int64_t u_off, MmaSmem<BN, I8>& sm,
                                         int nt, const MmaTables& tab, Store store) {
  static_assert(I8 ? mma_i8_type<T>() : mma_tile_type<T>(), "MMA tile: weight type of the other kind");
  using Codes = MmaCodes<T>;
  constexpr int NJ = BN / 8;      // n8 tiles
  constexpr int QV = I8 ? 2 : 8;  // uint4 of x codes per (token, unit)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const bool live = r_blk + 32 * warp < r_end;  // dead warps still copy and meet the barriers

  // Copies chunk c (units [u_lo + c * uc, +uc) of every live token) into buffer c & 1.
  const int64_t n_chunks = (u_hi - u_lo + k_mma_uc - 1) / k_mma_uc;
  auto issue = [&](int64_t c) {
    const int b = static_cast<int>(c & 1);
    const int64_t u0 = u_lo + c * k_mma_uc;
    const int nu = static_cast<int>(u_hi - u0 < k_mma_uc ? u_hi - u0 : k_mma_uc);
    for (int i = threadIdx.x; i < nt * k_mma_uc * (QV + 1); i += 256) {
      const int n = i / (k_mma_uc * (QV + 1)), rest = i % (k_mma_uc * (QV + 1)), uu = rest / (QV + 1),
                k = rest % (QV + 1);
      if (uu >= nu) continue;
      const int64_t su = xs.units * sm.xrow[n] + u_off + u0 + uu;
      if (k == QV)
        cp_async_vec(reinterpret_cast<uint4*>(&sm.s[b][uu][n]), reinterpret_cast<const uint4*>(xs.s + su));
      else if constexpr (I8)
        cp_async_vec(&sm.q[b][uu][n][k], xs.q + su * QV + k);
      else
        cp_async_vec(&sm.q[b][n][uu][k ^ ((n & 1) << 2)], xs.q + su * QV + k);
    }
    cp_async_commit();
  };

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
  typename Codes::Raw raw[2][2];
  auto load_raw = [&](int64_t u) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) Codes::load(rp[mt][h], u, t, raw[mt][h]);
  };
  if (live) load_raw(u_lo);
  // The {scale, sums} of this lane's two columns of n8 tile j (tokens 8j + 2t, + 1) in buffer b, unit uu:
  // types without a min term need only the scale (4-byte loads).
  auto col_scales = [&](int b, int uu, int j, float4& s0, float4& s1) {
    if constexpr (Codes::kMin) {
      s0 = sm.s[b][uu][8 * j + 2 * t];
      s1 = sm.s[b][uu][8 * j + 2 * t + 1];
    } else {
      s0.x = sm.s[b][uu][8 * j + 2 * t].x;
      s1.x = sm.s[b][uu][8 * j + 2 * t + 1].x;
    }
  };

  issue(0);
  for (int64_t c = 0; c < n_chunks; ++c) {
    if (c + 1 < n_chunks) {
      issue(c + 1);  // into the buffer every warp finished with (barrier at the end of the last step)
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // chunk c visible to every warp
    const int b = static_cast<int>(c & 1);
    const int64_t u0 = u_lo + c * k_mma_uc;
    const int nu = static_cast<int>(u_hi - u0 < k_mma_uc ? u_hi - u0 : k_mma_uc);
    if (live) {
      for (int uu = 0; uu < nu; ++uu) {
        const int64_t u = u0 + uu;
        if constexpr (I8) {
          using C = MmaCodesI8<T>;
          static_assert((C::kMins > 0) == Codes::kMin, "col_scales: the kinds agree on min terms");
          uint32_t a[2][2][2];  // [mt][row g / g + 8][positions 8t..8t+3, 8t+4..8t+7]
          float sc[2][2], mn[2][2][2];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) C::decode(raw[mt][h], u, t, a[mt][h], sc[mt][h], mn[mt][h], tab);
          if (u + 1 < u_hi) load_raw(u + 1);
          const int32_t zero[4] = {0, 0, 0, 0};
#pragma unroll
          for (int j = 0; j < NJ; ++j) {
            if (8 * j >= nt) break;  // warp-uniform
            const uint2 bx = reinterpret_cast<const uint2*>(&sm.q[b][uu][8 * j + g][0])[t];
            float4 s0, s1;
            col_scales(b, uu, j, s0, s1);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              int32_t d[4];
              imma_16832(d, a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], bx.x, bx.y, zero);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int h = i >> 1;  // row g (i = 0, 1) or g + 8 (i = 2, 3)
                const float4& sx = (i & 1) ? s1 : s0;
                float v = fmaf(__fmul_rn(sc[mt][h], sx.x), static_cast<float>(d[i]), acc[mt][j][i]);
                if constexpr (C::kMins == 2) {
                  v = fmaf(-mn[mt][h][0], sx.y, v);
                  v = fmaf(-mn[mt][h][1], sx.z, v);
                } else if constexpr (C::kMins == 1) {
                  v = fmaf(-mn[mt][h][0], sx.w, v);
                }
                acc[mt][j][i] = v;
              }
            }
          }
        } else {
          constexpr int NS = Codes::NS;
          uint32_t a[2][2][4];  // [mt][row g / g + 8][pair]
          float sc[2][2][NS], mn[2][2][NS];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) Codes::decode(raw[mt][h], u, t, a[mt][h], sc[mt][h], mn[mt][h], tab);
          if (u + 1 < u_hi) load_raw(u + 1);
#pragma unroll
          for (int j = 0; j < NJ; ++j) {
            if (8 * j >= nt) break;  // warp-uniform
            const int n = 8 * j + g, sw = (n & 1) << 2;
            const uint4 bh = sm.q[b][n][uu][t ^ sw];
            const uint4 bl = sm.q[b][n][uu][(4 + t) ^ sw];
            float4 s0, s1;
            col_scales(b, uu, j, s0, s1);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              float cc[NS][4];
#pragma unroll
              for (int s = 0; s < NS; ++s)
#pragma unroll
                for (int i = 0; i < 4; ++i) cc[s][i] = 0.0f;
              // step 0: positions 8t + 0..3 (pairs 0, 1); step 1: 8t + 4..7 (pairs 2, 3)
              mma_16816(cc[0], a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], bh.x, bh.y);
              mma_16816(cc[0], a[mt][0][0], a[mt][1][0], a[mt][0][1], a[mt][1][1], bl.x, bl.y);
              mma_16816(cc[NS - 1], a[mt][0][2], a[mt][1][2], a[mt][0][3], a[mt][1][3], bh.z, bh.w);
              mma_16816(cc[NS - 1], a[mt][0][2], a[mt][1][2], a[mt][0][3], a[mt][1][3], bl.z, bl.w);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int h = i >> 1;  // row g (i = 0, 1) or g + 8 (i = 2, 3)
                const float4& sx = (i & 1) ? s1 : s0;
                float v = acc[mt][j][i];
#pragma unroll
                for (int s = 0; s < NS; ++s) v = fmaf(__fmul_rn(sc[mt][h][s], sx.x), cc[s][i], v);
                if constexpr (Codes::kMin) {
                  if constexpr (NS == 2) {
                    v = fmaf(-mn[mt][h][0], sx.y, v);
                    v = fmaf(-mn[mt][h][1], sx.z, v);
                  } else {
                    v = fmaf(-mn[mt][h][0], sx.w, v);
                  }
                }
                acc[mt][j][i] = v;
              }
            }
          }
        }
      }
    }
    __syncthreads();  // buffer b is refilled by the next step's issue
  }
  if (!live) return;
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
