// MoE router (model-spec.md §6.1–§6.3) and routed experts (§6.4).
//
// moe_route: one 256-thread block per token. s_e = sqrt(softplus(z_e)) into
//   shared memory; experts = the hash-table row of ids[t] (hash layers, read
//   on the device, range-checked) or k rounds of an arg-max of s_e + b_e
//   (largest value, ties to the lower index, excluding taken experts; one warp
//   for E <= 256, block-wide for more) — the
//   CPU's partial_sort order; weights = s[sel_i] / sum_i s[sel_i] * alpha with
//   the sum in slot order. The float chain is the CPU's (expf/log1pf/sqrtf),
//   so the selection matches the CPU's except where two biased scores differ
//   by less than the libm discrepancy (never for equal inputs: exact ties are
//   broken identically).
//   CPU reference: cpu::moe_route (cpu_moe.cpp).
//
// moe_experts: every (token t, slot i) assignment a = t*k + i is independent:
//   1. gate rows:  g[a, f] = W_gate[e_a, f, :] · x[t]   (expert id read on the device)
//   2. up rows:    u[a, f] = W_up[e_a, f, :] · x[t]
//   3. mid[a, f] = silu(min(g, c)) * clamp(u, -c, c) * w_a   (weight before the down projection), then
//      quantised per row by MoeExpertsOp::mid_quant (fast numerics; launch_act_quant, or in decode's
//      digit split of mid when the down projection runs on integer MMAs)
//   4. down rows:  y[a, r] = W_down[e_a, r, :] · mid[a]
//   5. out[t] = (accumulate ? out[t] : 0) + sum_i y[t*k + i]  (slot order)
//   Steps 1, 2, 4, decode (n < CudaContext::expert_group_min, 65 by default): the matvec of cuda_matmul.cu
//   per assignment (4 expert rows per warp, or 2 gate + 2 up in the pair; staged wide
//   loads for Q8_0/Q2_K/IQ2_XXS, grid (assignments, row blocks)); when gate
//   and up share a layout, steps 1-3 are one kernel: each warp dots 2 gate
//   and the same 2 up rows with x in one pass and writes mid directly.
//   IQ2_XXS/Q2_K with tensor cores on (CudaContext::int_dot): x (then mid) is
//   first split into integer digits (split_x_digits_kernel, cuda_idot.cuh) and
//   16 rows at a time are multiplied by integer MMAs (cuda_expert_imma.cuh):
//   within f32 rounding of the CPU like the tensor-core tiles, not bitwise
//   equal to the float matvec.
//   Prefill (n >= expert_group_min): grouped by expert. moe_plan_kernel (one
//   block, a stable counting sort over 16 warps) lists the assignments sorted by (expert,
//   assignment) and cuts each expert's run into tiles of <= 16 when gate, up
//   and down all run on tensor cores (32 for batches of >= 32 assignments per
//   expert on average; mma_tile of cuda_mma.cuh, x and mid
//   split to f16 hi/lo first), else <= 8 (weight_tile of cuda_tile.cuh for
//   the other types); the tile kernel then reads each expert's weights once
//   per tile instead of once per assignment. The tile count is only known on
//   the device: the grid is sized for the worst case (ceil(n*k / tile) + E
//   tiles) and surplus blocks exit, so the host never waits.
//   On an sm_90a build and device (CudaContext::expert_gemm_min; --expert-gemm
//   auto|on|off|N; auto: expert_gemm_auto_min of the gate/up weight type), the plan puts the experts with >=
//   expert_gemm_min assignments in the batch into a second list of tiles of 128, for the grouped GEMM of
//   cuda_expert_wgmma.cu (x split once for gate and up): each weight chunk is decoded once per 128 assignments into
//   shared memory and multiplied by wgmma; the rest (and such an expert's tail of fewer than expert_gemm_min past its
//   last full 128) run on the tile as above. The FFMA tile gives each output element the matvec's float operations
//   (bit-identical whichever path runs); the tensor-core tile agrees to f32
//   rounding. Scratch: [n*k][2F + D] floats, the plan, the split x.
//   CPU reference: cpu::moe_experts (cpu_moe.cpp).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_dense.cuh"
#include "backend/cuda/cuda_expert_gemm.cuh"
#include "backend/cuda/cuda_expert_imma.cuh"
#include "backend/cuda/cuda_expert_prefetch.cuh"
#include "backend/cuda/cuda_expert_stream.cuh"
#include "backend/cuda/cuda_host_experts.cuh"
#include "backend/cuda/cuda_host_ranges.h"
#include "backend/cuda/cuda_expert_rows.cuh"
#include "backend/cuda/cuda_idot.cuh"
#include "backend/cuda/cuda_mma_tile.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/cuda_tile.cuh"
#include "backend/options/cuda_options.h"

namespace dsv4::cuda {

namespace {

constexpr int k_route_threads = 256;
constexpr int k_max_route_k = 64;
constexpr int k_route_lane_experts = 8;  // E <= 256: the selection runs in one warp

__device__ __forceinline__ float softplus_dev(float z) {
  if (z > 20.0f) return z;
  if (z < -20.0f) return expf(z);
  return log1pf(expf(z));
}

// (v, i) beats (bv, bi): larger value, ties to the lower index; i < 0 is "none".
__device__ __forceinline__ bool route_better(float v, int i, float bv, int bi) {
  if (i < 0) return false;
  if (bi < 0) return true;
  return v > bv || (v == bv && i < bi);
}

// Arg-max of the lanes' (bv, bi) under route_better, butterfly: with a total
// order (scores without NaN) every lane ends with the same winner.
__device__ __forceinline__ void warp_route_best(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(k_full_mask, bv, o);
    const int oi = __shfl_xor_sync(k_full_mask, bi, o);
    if (route_better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
}

__global__ void __launch_bounds__(k_route_threads)
    moe_route_kernel(int32_t* experts, float* weights, const float* logits, const float* bias, const int32_t* hash,
                     int64_t hash_rows, int64_t hash_w, const int32_t* ids, int E, int k, float alpha, bool normalize) {
  // The selection bias is a weight: warp 0's lanes load theirs (experts lane +
  // 32 j) before pdl_enter, off the chain.
  const bool lane_select = !hash && E <= 32 * k_route_lane_experts;
  float bias_pre[k_route_lane_experts];
  if (lane_select && threadIdx.x < 32) {
#pragma unroll
    for (int j = 0; j < k_route_lane_experts; ++j) {
      const int e = static_cast<int>(threadIdx.x) + 32 * j;
      bias_pre[j] = (bias && e < E) ? bias[e] : 0.0f;
    }
  }
  pdl_enter();
  extern __shared__ float sm[];
  float* s = sm;                                                   // [E] scores
  unsigned char* taken = reinterpret_cast<unsigned char*>(s + E);  // [E]
  __shared__ int sel[k_max_route_k];
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int64_t t = blockIdx.x;
  const float* z = logits + t * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    s[e] = sqrtf(softplus_dev(z[e]));
    taken[e] = 0;
  }
  __syncthreads();
  if (hash) {
    if (threadIdx.x == 0) {
      const int32_t id = ids[t];
      DEVICE_CHECK(id >= 0 && id < hash_rows);
      for (int i = 0; i < k; ++i) sel[i] = hash[static_cast<int64_t>(id) * hash_w + i];
    }
  } else if (lane_select) {
    // Warp 0 alone, from registers: lane l holds experts l, l + 32, ...; each
    // round takes the lane's best untaken expert, then warp_route_best (lane
    // 0's winner is broadcast, so a NaN score cannot split the lanes). No
    // block barriers per round (the block-wide rounds below cost two each).
    if (warp == 0) {
      float v[k_route_lane_experts];
#pragma unroll
      for (int j = 0; j < k_route_lane_experts; ++j) {
        const int e = lane + 32 * j;
        v[j] = e < E ? (bias ? s[e] + bias_pre[j] : s[e]) : 0.0f;
      }
      unsigned taken_bits = 0;  // bit j: expert lane + 32 j is taken
      for (int i = 0; i < k; ++i) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll
        for (int j = 0; j < k_route_lane_experts; ++j) {
          const int e = lane + 32 * j;
          if (e < E && !((taken_bits >> j) & 1u) && route_better(v[j], e, bv, bi)) {
            bv = v[j];
            bi = e;
          }
        }
        warp_route_best(bv, bi);
        bi = __shfl_sync(k_full_mask, bi, 0);
        if (bi >= 0 && (bi & 31) == lane) taken_bits |= 1u << (bi >> 5);
        if (lane == 0) sel[i] = bi;
      }
    }
  } else {
    for (int i = 0; i < k; ++i) {
      float bv = 0.0f;
      int bi = -1;
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        if (taken[e]) continue;
        const float v = bias ? s[e] + bias[e] : s[e];
        if (route_better(v, e, bv, bi)) {
          bv = v;
          bi = e;
        }
      }
      warp_route_best(bv, bi);
      if (lane == 0) {
        red_v[warp] = bv;
        red_i[warp] = bi;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        float v = red_v[0];
        int b = red_i[0];
        for (int w = 1; w < n_warps; ++w)
          if (route_better(red_v[w], red_i[w], v, b)) {
            v = red_v[w];
            b = red_i[w];
          }
        sel[i] = b;
        taken[b] = 1;
      }
      __syncthreads();
    }
  }
  __syncthreads();
  if (threadIdx.x < k) {  // thread i writes selection i; each forms the sum in the same order
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) {
      DEVICE_CHECK(sel[i] >= 0 && sel[i] < E);
      sum += s[sel[i]];
    }
    const int i = static_cast<int>(threadIdx.x);
    const float v = s[sel[i]];
    experts[t * k + i] = sel[i];
    weights[t * k + i] = (normalize ? v / fmaxf(sum, 1e-30f) : v) * alpha;
  }
}

// mid = silu(min(g, c)) * clamp(u, -c, c) * w (model-spec.md §6.4), the CPU's rounded products.
__device__ __forceinline__ float expert_mid(float g, float u, float w, float c) {
  const float gt = c < g ? c : g;
  const float up = clamp_dev(u, -c, c);
  return __fmul_rn(__fmul_rn(__fmul_rn(gt, sigmoid_dev(gt)), up), w);
}

struct ExpertMid {
  __device__ __forceinline__ float operator()(float g, float u, float w, float c) const {
    return expert_mid(g, u, w, c);
  }
};

// out[a, r] = W[e_a, r, :] · x[a / x_div]; grid (assignments, ceil(R / 8RW)), RW rows per warp.
// XS: x copied to shared memory (cuda_quant.cuh, XShared), else read from
// global memory; the block prologue (the copy, the tables) overlaps the first
// weight chunks in flight.
// Pair (decode): W = gate, W2 = up, both dotted with the same x in one pass
// (2RW rows per warp) and out[a, r] = expert_mid(g, u, weights[a]) directly.
// (IQ2_XXS / Q2_K with tensor cores on take expert_imma_kernel instead.)
template <GgmlType T, int RW, int S, bool Pair, bool XS>
__global__ void __launch_bounds__(256)
    expert_matvec_kernel(float* out, int64_t R, ExpertRows w, ExpertRows w2, size_t row_bytes, int64_t n_units,
                         int64_t E, const int32_t* experts, const float* weights, float clamp, const float* x,
                         int64_t x_stride, int x_div, QuantTables tab) {
  constexpr int NR = Pair ? 2 * RW : RW;
  constexpr int U = WeightUnit<T>::U;
  // Dynamic shared memory: [x copy (XShared floats, XS)][8 x stage_bytes_per_warp<T, NR, S>()]
  extern __shared__ __align__(16) unsigned char ex_smem[];
  pdl_enter();  // before the expert ids (the prologue's second call returns at once)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const size_t x_bytes = XS ? static_cast<size_t>(x_shared_floats<U>(n_units)) * sizeof(float) : 0;
  auto* stage =
      reinterpret_cast<typename UnitStaging<T>::Vec*>(ex_smem + x_bytes + warp * stage_bytes_per_warp<T, NR, S>());
  const int64_t a = blockIdx.x;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.y) * 8 + warp) * RW;
  const float* xr = x + (a / x_div) * x_stride;
  QuantTables tb = tab;
  auto prologue = [&] { matvec_block_prologue<T, XS>(reinterpret_cast<float*>(ex_smem), xr, n_units, tab, tb); };
  const int32_t ex = experts[a];
  // Whole warps past the rows, or an assignment the host computes (ex = -1 - e, cuda_host_experts.cuh: its
  // rows are zeros here); they still join the prologue.
  if (r0 >= R || ex < 0) {
    prologue();
    if (r0 < R && lane == 0)
      for (int i = 0; i < RW && r0 + i < R; ++i) out[a * R + r0 + i] = 0.0f;
    return;
  }
  const int nr = static_cast<int>(R - r0 < RW ? R - r0 : RW);
  DEVICE_CHECK(ex < E);
  const uint8_t* rp[NR];
  const uint8_t* we = w.at(ex);
  const uint8_t* we2 = Pair ? w2.at(ex) : nullptr;
#pragma unroll
  for (int i = 0; i < RW; ++i) {
    const int64_t off = (r0 + (i < nr ? i : 0)) * static_cast<int64_t>(row_bytes);
    rp[i] = we + off;
    if constexpr (Pair) rp[RW + i] = we2 + off;
  }
  float s[NR];
  if constexpr (XS)
    warp_rows_dot<T, NR, S>(rp, n_units, XShared{reinterpret_cast<const float*>(ex_smem)}, lane, tb, stage, s,
                            prologue);
  else
    warp_rows_dot<T, NR, S>(rp, n_units, XGlobal{xr}, lane, tb, stage, s, prologue);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < RW; ++i)
      if (i < nr) {
        if constexpr (Pair)
          out[a * R + r0 + i] = expert_mid(s[i], s[RW + i], weights[a], clamp);
        else
          out[a * R + r0 + i] = s[i];
      }
}

// Expert grouping for prefill. list[] = the assignment ids in (expert, id)
// order; tiles[z] = {expert, first list index, count <= tile, 0} for z < n_tiles[0]
// (the small list). With big_min > 0, experts of >= big_min assignments go to
// a second list, in tiles of big_tile: big[z] for z < n_tiles[1] (the grouped
// GEMM's; both lists index list[]); such an expert's tail of fewer than big_min
// assignments past its last full big tile stays in the small list. big[z].w:
// the tile's first row in the gathered x (expert_gemm_gather_x_kernel), every
// big tile padded to a multiple of 8 rows.
// One block of k_plan_warps warps: a stable counting sort of the assignments
// by expert. Warp w owns the contiguous segment [w seg, (w + 1) seg) of the
// assignments and walks it 32 at a time in order; lanes with the same expert
// find each other with __match_any_sync, so within a step the lower lane (the
// smaller assignment) goes first.
//   pass 1: hist[w][e] = assignments of expert e in segment w;
//   scan:   off[e] (first list index of expert e), toff[e] (first tile), and
//           hist[w][e] becomes the first list index of segment w's run of e;
//   pass 2: the same walk writes every assignment at hist[w][e] + its rank.
// The list is sorted by (expert, assignment) exactly as the one-thread-per-
// expert version wrote it (each thread scanning all n_assign assignments twice,
// 318 us per 2,048-token batch on the H200, ncu); this one takes
// 106 us for 24,576 assignments (4,096 tokens; ncu), still one
// block, latency-bound: a multi-block histogram pass would be the next step.
constexpr int k_plan_warps = 16;
__global__ void __launch_bounds__(k_plan_warps * 32)
    moe_plan_kernel(const int32_t* __restrict__ experts, int64_t n_assign, int E, int tile, int32_t* __restrict__ list,
                    int4* __restrict__ tiles, int32_t* __restrict__ n_tiles, int big_min, int big_tile,
                    int4* __restrict__ big) {
  pdl_enter();
  extern __shared__ int plan_sm[];
  int* hist = plan_sm;                 // [k_plan_warps][E]
  int* cnt = hist + k_plan_warps * E;  // [E] assignments per expert
  int* off = cnt + E;                  // [E] first list index
  int* toff = off + E;                 // [E] first tile index (small list)
  int* boff = toff + E;                // [E] first tile index (big list)
  int* bcnt = boff + E;                // [E] assignments in the big list
  int* bpad = bcnt + E;                // [E] first padded token row of its big tiles (multiples of 8)
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < k_plan_warps * E; i += blockDim.x) hist[i] = 0;
  __syncthreads();
  const int64_t seg = (n_assign + k_plan_warps - 1) / k_plan_warps;
  const int64_t s0 = min(n_assign, w * seg), s1 = min(n_assign, s0 + seg);
  const unsigned lower = (1u << lane) - 1u;
  for (int64_t base = s0; base < s1; base += 32) {
    const int64_t a = base + lane;
    const int e = a < s1 ? experts[a] : -1;
    DEVICE_CHECK(a >= s1 || (e >= 0 && e < E));
    const unsigned same = __match_any_sync(k_full_mask, e);
    if (e >= 0 && (same & lower) == 0) hist[w * E + e] += __popc(same);  // the run's lowest lane
    __syncwarp();  // the next step's leader of e may be another lane
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int v = 0; v < k_plan_warps; ++v) c += hist[v * E + e];
    cnt[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Expert e's first bcnt[e] assignments go to the big list: its full big tiles, and its last partial one if that
    // holds >= big_min (else those assignments go to the small list, where a few cost less).
    int o = 0, t = 0, b = 0, bp = 0;
    for (int i = 0; i < E; ++i) {
      const int c = cnt[i];
      int cb = 0;
      if (big_min > 0 && c >= big_min) {
        const int full = c / big_tile * big_tile;
        cb = c - full >= big_min ? c : full;
      }
      off[i] = o;
      bcnt[i] = cb;
      boff[i] = b;
      bpad[i] = bp;
      toff[i] = t;
      bp += (cb + 7) & ~7;  // full tiles of 128, the partial one rounded up to 8
      o += c;
      b += (cb + big_tile - 1) / big_tile;
      t += (c - cb + tile - 1) / tile;
    }
    n_tiles[0] = t;
    n_tiles[1] = b;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = off[e];
    for (int v = 0; v < k_plan_warps; ++v) {
      const int h = hist[v * E + e];
      hist[v * E + e] = run;
      run += h;
    }
    const int c = cnt[e], cb = bcnt[e], cs = c - cb;
    for (int j = 0; j * big_tile < cb; ++j)
      big[boff[e] + j] = make_int4(e, off[e] + j * big_tile, min(big_tile, cb - j * big_tile), bpad[e] + j * big_tile);
    for (int j = 0; j * tile < cs; ++j)
      tiles[toff[e] + j] = make_int4(e, off[e] + cb + j * tile, min(tile, cs - j * tile), 0);
  }
  __syncthreads();
  for (int64_t base = s0; base < s1; base += 32) {
    const int64_t a = base + lane;
    const int e = a < s1 ? experts[a] : -1;
    const unsigned same = __match_any_sync(k_full_mask, e);
    if (e >= 0) list[hist[w * E + e] + __popc(same & lower)] = static_cast<int32_t>(a);
    __syncwarp();
    if (e >= 0 && (same & lower) == 0) hist[w * E + e] += __popc(same);
    __syncwarp();
  }
}

// out[a, r] = W[e, r, :] · x[a / x_div] for the assignments a of tile blockIdx.y
// (expert e); grid (ceil(R / 32), max tiles), blocks past *n_tiles exit.
template <GgmlType T>
__global__ void __launch_bounds__(256)
    expert_tile_kernel(float* __restrict__ out, int64_t R, ExpertRows w, size_t row_bytes, int64_t n_units,
                       int64_t cols, const int32_t* __restrict__ list, const int4* __restrict__ tiles,
                       const int32_t* __restrict__ n_tiles, const float* __restrict__ x, int64_t x_stride, int x_div,
                       bool x_vec4, QuantTables tab) {
  pdl_enter();
  __shared__ TileSmem<T> sm;
  __shared__ const float* xrow[k_tile_tokens];
  __shared__ int64_t arow[k_tile_tokens];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;  // the whole block leaves together
  const int4 td = tiles[blockIdx.y];
  if (static_cast<int>(threadIdx.x) < td.z) {
    const int64_t a = list[td.y + threadIdx.x];
    arow[threadIdx.x] = a;
    xrow[threadIdx.x] = x + (a / x_div) * x_stride;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  const uint8_t* we = w.at(td.x);
  const int64_t r_warp = static_cast<int64_t>(blockIdx.x) * k_tile_rows + warp * k_tile_rpw;
  weight_tile<T>(we, row_bytes, r_warp, R, n_units, cols, xrow, td.z, x_vec4, sm, tab,
                 [&](int64_t r, int tt, float s) { out[arow[tt] * R + r] = s; });
}

// The same on tensor cores (cuda_mma_tile.cuh; I8: the int8 kind): 256 rows x BN
// assignments per block, grid (ceil(R / 256), max tiles); x split beforehand
// (split row = a / x_div).
template <GgmlType T, int BN, bool I8>
__global__ void __launch_bounds__(256, 2)
    expert_mma_kernel(float* __restrict__ out, int64_t R, ExpertRows w, size_t row_bytes, int64_t n_units,
                      const int32_t* __restrict__ list, const int4* __restrict__ tiles,
                      const int32_t* __restrict__ n_tiles, MmaX xs, int x_div, QuantTables tab) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char mma_smem[];
  auto& sm = *reinterpret_cast<MmaSmem<BN, I8>*>(mma_smem);
  __shared__ int64_t arow[BN];
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;  // the whole block leaves together
  const int4 td = tiles[blockIdx.y];
  if (static_cast<int>(threadIdx.x) < BN) {
    const int64_t a = list[td.y + (static_cast<int>(threadIdx.x) < td.z ? threadIdx.x : 0)];
    arow[threadIdx.x] = a;
    sm.xrow[threadIdx.x] = a / x_div;
  }
  const MmaTables st = mma_smem_tables(sm, tab);
  const uint8_t* we = w.at(td.x);
  mma_tile<T, BN, I8>(we, row_bytes, static_cast<int64_t>(blockIdx.x) * k_mma_rows, R, 0, n_units, xs, 0, sm, td.z, st,
                      [&](int64_t r, int tt, float s) { out[arow[tt] * R + r] = s; });
}

// mid[a, f] = silu(min(g, c)) * clamp(u, -c, c) * weights[a], in place over g.
// q8 (MoeExpertsOp::mid_quant INT8_32, F % 32 == 0): each warp's 32 values are
// one block of a mid row, quantised together (warp_int8_32_quant).
__global__ void expert_swiglu_kernel(float* g, const float* u, const float* weights, int64_t F, int64_t total, float c,
                                     bool q8) {
  pdl_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float m = expert_mid(g[i], u[i], weights[i / F], c);
    g[i] = q8 ? warp_int8_32_quant(m) : m;
  }
}

// Gathering the host-memory experts an op uses (CudaContext::expert_gather), step 1 (one block):
// slots2 = slots, except that each expert in host memory (slot -1) that some assignment names is either the
// host's or gets the next stage slot c (slots2[e] = -2 - c, list[c] = e, in expert order); *count = the number
// staged. With a host request (the host computes some of them, cuda_host_experts.cuh; its rule is in mapped host
// memory, rewritten by the host between ops): of the u used host experts the first h = host_share_plan(rule, u)
// in expert order are the host's (h and the plan's counters into *state), ex2[a] = ex[a], or -1 - ex[a] when
// the host's, and with h > 0 the request is posted.
__global__ void __launch_bounds__(1024)
    gather_plan_kernel(const int32_t* __restrict__ slots, int32_t* __restrict__ slots2, int32_t* __restrict__ list,
                       int32_t* __restrict__ count, const int32_t* __restrict__ ex, int64_t n_assign, int E,
                       int32_t* __restrict__ ex2, HostRequest req) {
  pdl_enter();
  constexpr int32_t k_used = -3;         // a host expert some assignment names (before it gets its stage slot)
  constexpr int32_t k_host = INT32_MIN;  // ... that the host computes
  for (int e = threadIdx.x; e < E; e += blockDim.x) slots2[e] = slots[e];
  __syncthreads();
  for (int64_t a = threadIdx.x; a < n_assign; a += blockDim.x) {
    const int32_t e = ex[a];
    if (e >= 0 && e < E && slots2[e] == -1) slots2[e] = k_used;  // racing writers store the same value
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    const unsigned lane = threadIdx.x;
    int32_t host = 0;
    if (req.rule) {
      HostPlanState* state = req.state;
      int32_t used = 0;
      for (int base = 0; base < E; base += 32) {
        const int e = base + static_cast<int>(lane);
        used += __popc(__ballot_sync(0xffffffffu, e < E && slots2[e] == k_used));
      }
      const volatile HostShareRule* v = req.rule;  // read afresh: the host rewrites it
      HostShareRule r;
      r.share = v->share;
      r.c0 = v->c0;
      r.c1 = v->c1;
      r.g0 = v->g0;
      r.b = v->b;
      r.probe_after = v->probe_after;
      const int32_t before = state->since, before_used = state->since_used;
      int32_t since = before;
      host = host_share_plan(r, used, since);
      __syncwarp();
      if (lane == 0) {
        state->host = host;
        state->since = since;
        state->since_used = host > 0 ? 0 : before_used + used;
        if (host > 0) {
          state->skipped = before;
          state->skipped_used = before_used;
        }
      }
    }
    int32_t c = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + static_cast<int>(lane);
      const bool used = e < E && slots2[e] == k_used;
      const unsigned mask = __ballot_sync(0xffffffffu, used);
      if (used) {
        const int32_t r = c + __popc(mask & ((1u << lane) - 1u));  // rank among the used host experts
        if (r < host) {
          slots2[e] = k_host;
        } else {
          slots2[e] = -2 - (r - host);
          list[r - host] = e;
        }
      }
      c += __popc(mask);
    }
    if (lane == 0) *count = c - host;
  }
  if (!req.rule) return;
  __syncthreads();
  for (int64_t a = threadIdx.x; a < n_assign; a += blockDim.x) {
    const int32_t e = ex[a];
    ex2[a] = e >= 0 && e < E && slots2[e] == k_host ? -1 - e : e;
  }
  __syncthreads();
  host_post_request(req, ex2, n_assign, *count);
}

// Step 2: stage slot c (blockIdx.y; those past *count leave) gets expert list[c] of each of the three matrices
// (src[m] + e * bytes[m] -> dst[m] + c * bytes[m]), the grid's x blocks striding over its bytes in 16-byte
// pieces, four loads in flight per thread (the bus's latency is microseconds). 16-byte aligned bases and sizes.
struct GatherMats {
  const uint8_t* src[3];
  uint8_t* dst[3];
  int64_t bytes[3];
};
__global__ void __launch_bounds__(256)
    gather_copy_kernel(GatherMats g, const int32_t* __restrict__ list, const int32_t* __restrict__ count) {
  pdl_enter();
  const int32_t c = static_cast<int32_t>(blockIdx.y);
  if (c >= *count) return;
  const int64_t e = list[c];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int m = 0; m < 3; ++m) {
    const int64_t n16 = g.bytes[m] / 16;
    const uint4* src = reinterpret_cast<const uint4*>(g.src[m] + e * g.bytes[m]);
    uint4* dst = reinterpret_cast<uint4*>(g.dst[m] + c * g.bytes[m]);
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
      const uint4 v0 = src[i], v1 = src[i + stride], v2 = src[i + 2 * stride], v3 = src[i + 3 * stride];
      dst[i] = v0;
      dst[i + stride] = v1;
      dst[i + 2 * stride] = v2;
      dst[i + 3 * stride] = v3;
    }
    for (; i < n16; i += stride) dst[i] = src[i];
  }
}

// out[t, d] = (accumulate ? out[t, d] : 0) + sum_i y[t*k + i, d], slots in order. With a host request (req.y_h:
// the host's rows, in mapped host memory: cuda_host_experts.cuh) each block first awaits the CPU's answer when
// one was posted, and the term of an assignment ex2 marks the host's (< 0) is y_h's row instead (y's is zero
// there), so only the host's rows cross the bus.
__global__ void expert_sum_kernel(float* out, const float* y, HostRequest req, const int32_t* ex2, int64_t D, int k,
                                  int64_t total, bool accumulate) {
  pdl_enter();
  const float* y2 = req.y_h;
  if (y2) host_await_answer(req);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float s = accumulate ? out[i] : 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t at = (t * k + j) * D + d;
      s = __fadd_rn(s, y2 && ex2[t * k + j] < 0 ? y2[at] : y[at]);
    }
    out[i] = s;
  }
}

unsigned elem_grid(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)); }

// out = W[e_a] · x per assignment; with `w2` (the up projection, same type and
// shape as w = gate), out = expert_mid(gate, up, weights[a], clamp) instead.
// digits: scratch for x's split (n_assign / x_div rows of cols / 32 XDigits)
// when ctx.int_dot, else nullptr.
// w: the shape and type of the expert matrix (the host stack when experts are placed); wr/wr2 where the rows are.
// x_quant (the down projection: MoeExpertsOp::mid_quant; x is then scratch of rows of cols floats): x's rows
// are first quantised like ActQuantOp — INT8_32 inside the digit split where the integer MMAs run (the
// same values: one launch fewer per decode step's layer), otherwise by an act_quant launch in place.
void expert_matvec(const CudaContext& ctx, float* out, int64_t R, const Tensor& w, ExpertRows wr, const ExpertRows* wr2,
                   const int32_t* experts, int64_t n_assign, float* x, int64_t x_stride, int x_div,
                   const float* weights, float clamp, XDigits* digits, ActQuant x_quant = ActQuant::NONE) {
  const int64_t cols = w.ne[0], E = w.ne[2];
  DSV4_ASSERT((R + 31) / 32 <= 65535, "moe_experts: %lld rows per expert", static_cast<long long>(R));
  DSV4_ASSERT(x_quant == ActQuant::NONE || (x_stride == cols && x_div == 1), "moe_experts: quantised x layout");
  DSV4_ASSERT(n_assign <= 0x7fffffff, "moe_experts: too many assignments");
  dispatch_weight_type(w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    constexpr int U = WeightUnit<T>::U;
    DSV4_ASSERT(cols % U == 0 && cols % 4 == 0, "moe_experts: %s rows of %lld elements", ggml_type_name(T),
                static_cast<long long>(cols));
    // Several rows per warp (loads in flight, x reused): an expert matrix has >= 2048
    // rows and a decode step 6 assignments, so the grid still covers the SMs.
    const ExpertRows wq = wr, wq2 = wr2 ? *wr2 : ExpertRows{};
    // x copied to shared memory unless the copy would be large (no Flash shape).
    const size_t x_bytes = static_cast<size_t>(x_shared_floats<U>(cols / U)) * sizeof(float);
    const bool xs = x_bytes <= k_max_x_shared_bytes;
    // Rows per warp: 4, or 2 gate + 2 up rows for the pair (the same 4 rows in
    // flight; measured on the H200 at Flash shapes, IQ2_XXS gate/up:
    // 66.1 -> 64.2 us per decode step's experts; 3 + 3 rows: 64.9, 6 + 6: 74.1).
    auto run = [&](auto stages_tag, auto pair_tag) {
      constexpr int S = decltype(stages_tag)::value;
      constexpr bool Pair = decltype(pair_tag)::value;
      constexpr int RW = Pair ? 2 : 4;
      constexpr int NR = Pair ? 2 * RW : RW;
      const dim3 grid(static_cast<unsigned>(n_assign), ceil_div(R, 8 * RW));
      const size_t stage_bytes = 8 * static_cast<size_t>(stage_bytes_per_warp<T, NR, S>());
      auto launch = [&](auto kernel, size_t smem) {
        allow_smem(kernel, smem, k_block_tables_smem);  // static: the tables
        launch_kernel(kernel, grid, 256, smem, ctx.stream, out, R, wq, wq2, w.row_bytes(), cols / U, E, experts,
                      weights, clamp, x, x_stride, x_div, ctx.tables);
      };
      // Integer MMAs with tensor cores on (agreement to f32 rounding, as the tiles): x split
      // once (one warp per 32 values, one scale per 256), then 16 rows per block.
      if constexpr (idot_type<T>() && S > 0) {
        if (ctx.int_dot && digits) {
          const int64_t x_rows = n_assign / x_div, units = cols / U;
          DSV4_ASSERT(units % 8 == 0, "moe_experts: split x needs whole 256-value blocks");
          const bool q8 = x_quant == ActQuant::INT8_32 && ctx.fuse_act_quant;
          if (x_quant != ActQuant::NONE && !q8) launch_act_quant(ctx.stream, x, x, cols, x_rows, x_quant);
          launch_kernel(split_x_digits_kernel, x_rows * units / 8, 256, 0, ctx.stream, digits, x, x_stride, x_rows,
                        units, q8);
          CUDA_CHECK_LAUNCH();
          // cuda_expert_imma.cuh: blocks of 16 rows, one warp per 1,024-column chunk (at most 8).
          const int64_t n_chunks = units / 32;
          const int warps = static_cast<int>(std::min<int64_t>(n_chunks, k_imma_max_warps));
          const size_t smem = static_cast<size_t>(warps) * (Pair ? 2 : 1) * k_imma_rows * UnitStaging<T>::chunk_bytes;
          const dim3 grid_i(static_cast<unsigned>(n_assign), ceil_div(R, k_imma_rows));
          auto kernel = expert_imma_kernel<T, Pair, ExpertMid>;
          allow_smem(kernel, smem, sizeof(IdotTables) + sizeof(float) * k_imma_max_warps * 2 * k_imma_rows);
          launch_kernel(kernel, grid_i, warps * 32, smem, ctx.stream, out, R, wq, wq2, w.row_bytes(), n_chunks, E,
                        experts, weights, clamp, digits, x_div, ctx.tables);
          return;
        }
      }
      if (x_quant != ActQuant::NONE) launch_act_quant(ctx.stream, x, x, cols, n_assign / x_div, x_quant);
      if (xs)
        launch(expert_matvec_kernel<T, RW, S, Pair, true>, x_bytes + stage_bytes);
      else
        launch(expert_matvec_kernel<T, RW, S, Pair, false>, stage_bytes);
    };
    using yes = std::true_type;
    using no = std::false_type;
    bool staged = false;
    if constexpr (UnitStaging<T>::chunk_bytes > 0) {
      auto stageable = [&](const ExpertRows& e) {
        return can_stage<T>(e.dev, w.row_bytes()) && can_stage<T>(e.host, w.row_bytes()) &&
               can_stage<T>(e.stage, w.row_bytes());
      };
      if (stageable(wq) && (!wr2 || stageable(wq2))) {
        staged = true;
        // Staging buffers per warp: 4 for rows of more than 2 chunks (of 32
        // units), else 2 (Flash: gate/up 4, down 2). Measured on the
        // H200: a decode step's experts 58.6 us with 2, 58.2 with 4, 64.6 with 1.
        const int64_t chunks = ceil_div(cols / U, 32);
        auto with_pair = [&](auto stages_tag) {
          if (wr2)
            run(stages_tag, yes{});
          else
            run(stages_tag, no{});
        };
        if (chunks <= 2)
          with_pair(std::integral_constant<int, 2>{});
        else
          with_pair(std::integral_constant<int, 4>{});
      }
    }
    if (!staged) {
      if (wr2)
        run(std::integral_constant<int, 0>{}, yes{});
      else
        run(std::integral_constant<int, 0>{}, no{});
    }
    CUDA_CHECK_LAUNCH();
  });
}

// The expert plan for n_assign assignments, in scratch after `base`.
// tile: assignments per tile of the small list (k_tile_tokens for the FFMA
// tile, 16 or 32 when every expert matrix runs on tensor cores); big_min > 0:
// experts of >= big_min assignments in the big list instead, in tiles of
// k_wg_tokens (the grouped GEMM). Both counts are known only on the device:
// grids are sized for the worst case of each list.
struct ExpertPlan {
  int32_t* list;
  int4* tiles;
  int32_t* n_tiles;  // [0]: small tiles, [1]: big tiles
  int64_t max_tiles;
  int tile;
  int4* big = nullptr;
  int64_t max_big = 0;
  void* split = nullptr;     // tensor cores: the split x of one expert matrix (cuda_mma.cuh)
  int64_t split_units = 0;   // its capacity in (row, unit) pairs
  void* eg_split = nullptr;  // the big list: the grouped GEMM's split x by rows (cuda_expert_gemm.cuh), same capacity
  void* eg_tiled = nullptr;  // and gathered per tile: hi then lo, eg_rows x eg_cols halves each
  int64_t eg_rows = 0, eg_cols = 0;
};
int64_t plan_max_tiles(int64_t n_assign, int64_t E, int tile) { return ceil_div(n_assign, tile) + E; }
// Big tiles: the full ones, plus at most one partial tile of >= big_min assignments per expert. Small tiles: the
// full ones plus at most one partial tile per expert.
int64_t plan_max_big(int64_t n_assign, int64_t E, int big_min) {
  return big_min > 0 ? ceil_div(n_assign, k_wg_tokens) + std::min<int64_t>(E, n_assign / big_min) : 0;
}
size_t plan_bytes(int64_t n_assign, int64_t E, int tile, int big_min) {
  return static_cast<size_t>(plan_max_tiles(n_assign, E, tile) + plan_max_big(n_assign, E, big_min)) * sizeof(int4) +
         static_cast<size_t>(n_assign) * 4 + 16;
}
ExpertPlan make_plan(const CudaContext& ctx, void* base, const int32_t* experts, int64_t n_assign, int64_t E, int tile,
                     int big_min) {
  DSV4_ASSERT(E <= 1024, "moe_experts: %lld experts (grouping supports up to 1024)", static_cast<long long>(E));
  ExpertPlan p;
  p.tile = tile;
  p.max_tiles = plan_max_tiles(n_assign, E, tile);
  p.max_big = plan_max_big(n_assign, E, big_min);
  DSV4_ASSERT(p.max_tiles <= 65535 && p.max_big <= 65535, "moe_experts: batch of %lld assignments too large",
              static_cast<long long>(n_assign));
  p.tiles =
      static_cast<int4*>(base);  // 16-byte aligned: scratch is, and base follows float arrays of 16-byte multiples
  p.big = p.tiles + p.max_tiles;
  p.list = reinterpret_cast<int32_t*>(p.big + p.max_big);
  p.n_tiles = p.list + n_assign;
  const size_t smem = (k_plan_warps + 6) * static_cast<size_t>(E) * sizeof(int);
  allow_smem(moe_plan_kernel, smem);
  launch_kernel(moe_plan_kernel, 1, k_plan_warps * 32, smem, ctx.stream, experts, n_assign, static_cast<int>(E), tile,
                p.list, p.tiles, p.n_tiles, big_min, k_wg_tokens, p.big);
  CUDA_CHECK_LAUNCH();
  return p;
}

// The grouped GEMM (cuda_expert_gemm.cuh, cuda_expert_wgmma.cu): x's hi/lo split
// by rows in the plan's eg_split buffer, gathered per big tile into eg_tiled
// (the stage layout), then one launch per expert matrix.
struct EgSplit {
  const __half* xth;
  const __half* xtl;
  const __half* xts;  // the sums blocks (expert_gemm_sums), or null
  const int* e_t;
};
// Rows of the gathered x: every assignment of the big list, each tile padded to 8.
int64_t eg_tiled_rows(int64_t n_assign, int64_t max_big) { return n_assign + 7 * max_big; }
// Bytes of the gathered x for rows of up to cols columns: hi and lo halves, and the sums blocks (16 halves per
// row and 64 columns).
size_t eg_tiled_bytes(int64_t rows, int64_t cols) {
  return static_cast<size_t>(rows) * static_cast<size_t>(cols) * 4 +
         static_cast<size_t>(rows) * static_cast<size_t>(cols) / 2;
}
// sums: also the tokens' sub-block sums (expert_gemm_sums: a Q2_K matrix on codes), after hi and lo;
// x_exact (ExpertGemmArgs::x_exact): no lo halves are written (the GEMM does not read them).
EgSplit expert_gemm_split(const CudaContext& ctx, const ExpertPlan& p, const float* x, int64_t x_rows, int64_t x_stride,
                          int64_t cols, int x_div, bool sums, bool x_exact) {
  DSV4_ASSERT(p.eg_split &&
                  static_cast<size_t>(x_rows * cols) * 4 + static_cast<size_t>(x_rows) * 4 <=
                      mma_split_bytes(1, p.split_units) &&
                  cols <= p.eg_cols,
              "moe_experts: grouped GEMM split buffer");
  auto* xh = static_cast<__half*>(p.eg_split);
  auto* xl = xh + x_rows * cols;
  auto* e_t = reinterpret_cast<int*>(xl + x_rows * cols);
  launch_kernel(expert_gemm_split_x_kernel, static_cast<unsigned>(x_rows), 256, 0, ctx.stream, x, x_stride, cols, xh,
                x_exact ? nullptr : xl, e_t);
  CUDA_CHECK_LAUNCH();
  auto* xth = static_cast<__half*>(p.eg_tiled);
  auto* xtl = xth + p.eg_rows * cols;
  auto* xts = sums ? xtl + p.eg_rows * cols : nullptr;  // eg_rows x cols / 4 halves (eg_tiled_bytes)
  launch_kernel(expert_gemm_gather_x_kernel, dim3(ceil_div(cols, k_eg_bk), static_cast<unsigned>(p.max_big)), 256, 0,
                ctx.stream, xh, x_exact ? nullptr : xl, cols, p.list, p.big, p.n_tiles + 1, x_div, xth, xtl, xts);
  CUDA_CHECK_LAUNCH();
  return {xth, xtl, xts, e_t};
}
// x_exact: x is an activation quantiser's output (ExpertGemmArgs::x_exact).
void expert_gemm(const CudaContext& ctx, float* out, int64_t R, const Tensor& w, ExpertRows wr, const ExpertPlan& p,
                 const EgSplit& xs, int x_div, bool x_exact) {
  DSV4_ASSERT(p.max_big > 0, "moe_experts: no big tiles planned");
  launch_expert_wgmma(
      ctx, out, R, w, wr,
      ExpertGemmArgs{p.list, p.big, p.n_tiles + 1, p.max_big, xs.xth, xs.xtl, xs.xts, xs.e_t, x_div, x_exact});
}

// x: x_rows input rows of x_stride floats; assignment a reads row a / x_div; x_quant: the quantiser whose
// output x is (INT8_32: the int8 tile, where CudaContext::int8_tiles and the type allow).
void expert_tiles(const CudaContext& ctx, float* out, int64_t R, const Tensor& w, ExpertRows wr, const ExpertPlan& p,
                  const float* x, int64_t x_rows, int64_t x_stride, int x_div, ActQuant x_quant) {
  const int64_t cols = w.ne[0];
  dispatch_weight_type(w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    constexpr int U = WeightUnit<T>::U;
    DSV4_ASSERT(cols % U == 0, "moe_experts: %s rows of %lld elements", ggml_type_name(T),
                static_cast<long long>(cols));
    if constexpr (mma_type<T>()) {
      if (ctx.tensor_cores) {
        // x split (rows: the distinct inputs, n_assign / x_div of them) into the plan's split buffer.
        DSV4_ASSERT(p.split && x_rows * (cols / 32) <= p.split_units, "moe_experts: split buffer");
        // (the int8 split is the smaller: mma_split_i8_bytes <= mma_split_bytes)
        const dim3 grid(ceil_div(R, k_mma_rows), static_cast<unsigned>(p.max_tiles));
        const ExpertRows wp = wr;
        auto run = [&](auto i8_tag) {
          constexpr bool I8 = decltype(i8_tag)::value;
          const MmaX xs = I8 ? mma_split_x_i8<T>(ctx.stream, x, x_stride, x_rows, cols / 32, p.split)
                             : mma_split_x<T>(ctx.stream, x, x_stride, x_rows, cols / 32, p.split);
          CUDA_CHECK_LAUNCH();
          auto launch = [&](auto kernel, size_t smem) {
            allow_smem(kernel, smem);
            launch_kernel(kernel, grid, 256, smem, ctx.stream, out, R, wp, w.row_bytes(), cols / U, p.list, p.tiles,
                          p.n_tiles, xs, x_div, ctx.tables);
          };
          if (p.tile == 32)
            launch(expert_mma_kernel<T, 32, I8>, sizeof(MmaSmem<32, I8>));
          else if (p.tile == 16)
            launch(expert_mma_kernel<T, 16, I8>, sizeof(MmaSmem<16, I8>));
          else
            launch(expert_mma_kernel<T, 8, I8>, sizeof(MmaSmem<8, I8>));
          CUDA_CHECK_LAUNCH();
        };
        bool i8 = false;
        if constexpr (mma_i8_type<T>()) {
          i8 = ctx.int8_tiles && x_quant == ActQuant::INT8_32;
          if (i8) run(std::true_type{});
        }
        if (!i8) run(std::false_type{});
        return;
      }
    }
    DSV4_ASSERT(p.tile == k_tile_tokens, "moe_experts: FFMA tiles take %d assignments", k_tile_tokens);
    const dim3 grid(ceil_div(R, k_tile_rows), static_cast<unsigned>(p.max_tiles));
    const bool x_vec4 = reinterpret_cast<uintptr_t>(x) % 16 == 0 && x_stride % 4 == 0 && cols % 4 == 0;
    launch_kernel(expert_tile_kernel<T>, grid, 256, 0, ctx.stream, out, R, wr, w.row_bytes(), cols / U, cols, p.list,
                  p.tiles, p.n_tiles, x, x_stride, x_div, x_vec4, ctx.tables);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void launch_moe_route(const CudaContext& ctx, const MoeRouteOp& op) {
  const int64_t E = op.logits.ne[0], n = op.logits.n_rows(), k = op.experts.ne[0];
  DSV4_ASSERT(k <= E && k <= k_max_route_k, "moe_route: k = %lld (E = %lld)", static_cast<long long>(k),
              static_cast<long long>(E));
  DSV4_ASSERT(op.experts.n_rows() == n && op.weights.ne[0] == k && op.weights.n_rows() == n,
              "moe_route: output shapes");
  DSV4_ASSERT(!op.bias || op.bias.ne[0] == E, "moe_route: bias length");
  DSV4_ASSERT(!op.hash || (op.hash.ne[0] >= k && op.ids.ne[0] >= n), "moe_route: hash table / ids shape");
  if (n == 0 || k == 0) return;
  DSV4_ASSERT(n <= 0x7fffffff, "moe_route: too many tokens");
  const size_t smem = static_cast<size_t>(E) * (sizeof(float) + 1);
  allow_smem(moe_route_kernel, smem);
  launch_kernel(moe_route_kernel, static_cast<unsigned>(n), k_route_threads, smem, ctx.stream, op.experts.i32(),
                op.weights.f32(), op.logits.f32(), op.bias ? op.bias.f32() : nullptr, op.hash ? op.hash.i32() : nullptr,
                op.hash ? op.hash.n_rows() : 0, op.hash ? op.hash.ne[0] : 0, op.hash ? op.ids.i32() : nullptr,
                static_cast<int>(E), static_cast<int>(k), op.alpha, op.normalize);
  CUDA_CHECK_LAUNCH();
}

void launch_moe_experts(const CudaContext& ctx, const MoeExpertsOp& op) {
  // With slots, the host stacks carry every expert's shape and type; the device stacks hold the resident ones.
  const bool placed = static_cast<bool>(op.slots);
  const Tensor &gate = placed ? op.gate_host : op.gate, &up = placed ? op.up_host : op.up,
               &down = placed ? op.down_host : op.down;
  const int64_t D = op.x.ne[0], n = op.x.n_rows(), k = op.experts.ne[0];
  const int64_t F = gate.ne[1];
  DSV4_ASSERT(gate.ne[0] == D && up.ne[0] == D && down.ne[0] == F && down.ne[1] == D, "moe_experts: shapes");
  DSV4_ASSERT(up.ne[1] == F && up.ne[2] == gate.ne[2] && down.ne[2] == gate.ne[2], "moe_experts: expert counts");
  DSV4_ASSERT(op.experts.n_rows() == n && op.weights.ne[0] == k && op.out.ne[0] == D && op.out.n_rows() == n,
              "moe_experts: routing/output shapes");
  DSV4_ASSERT(reinterpret_cast<uintptr_t>(op.x.data) % 16 == 0, "moe_experts: x not 16-byte aligned");
  DSV4_ASSERT(!placed || op.slots.ne[0] == gate.ne[2], "moe_experts: %lld slots for %lld experts",
              static_cast<long long>(op.slots.ne[0]), static_cast<long long>(gate.ne[2]));
  DSV4_ASSERT(!placed || !op.gate ||
                  (op.gate.type == gate.type && op.up.type == up.type && op.down.type == down.type &&
                   op.gate.row_bytes() == gate.row_bytes() && op.down.row_bytes() == down.row_bytes()),
              "moe_experts: resident stacks of another layout than the host stacks");
  if (n == 0) return;
  ExpertRows wg = expert_rows(op.gate, op.gate_host, op.slots), wu = expert_rows(op.up, op.up_host, op.slots),
             wd = expert_rows(op.down, op.down_host, op.slots);
  const int64_t n_assign = n * k;
  const int64_t E = gate.ne[2];
  // Host-memory experts gathered into GPU memory first: a stage of min(n_assign, E) experts; or, when the
  // backend prefetched every host expert of the layer (cuda_expert_prefetch.cuh), read there.
  const bool prefetched = placed && k > 0 && ctx.prefetched && ctx.prefetched->slots;
  const bool gather = placed && ctx.expert_gather && k > 0 && !prefetched;
  const int64_t gather_cap = gather ? std::min(n_assign, E) : 0;
  const bool grouped = n >= ctx.expert_group_min && k > 0;
  // Assignments per tile when all three matrices run on tensor cores: 16, or 32
  // once the batch averages >= 32 per expert (each decoded weight unit then
  // serves twice the tokens; smaller batches would leave 32-tiles mostly empty);
  // else the FFMA tile's 8.
  bool all_mma = ctx.tensor_cores, all_eg = ctx.expert_gemm_min != 0;  // expert_gemm_min: with tensor cores only
  for (const Tensor* t : {&gate, &up, &down})
    dispatch_weight_type(t->type, [&](auto tag) {
      all_mma = all_mma && mma_type<decltype(tag)::value>();
      all_eg = all_eg && expert_gemm_type<decltype(tag)::value>();
    });
  // Experts of >= big_min assignments in this batch on the grouped GEMM (cuda_expert_gemm.cuh; tiles of
  // k_wg_tokens), the others on the tile; big_min 1 (--expert-gemm on): every expert, and no tile launches.
  // Not with experts read in place from host memory: the GEMM's bulk copies would (the tile instead).
  // "auto" (k_expert_gemm_auto): the threshold where the GEMM overtakes the tile for this weight type.
  const int eg_min = ctx.expert_gemm_min == k_expert_gemm_auto ? expert_gemm_auto_min(gate.type) : ctx.expert_gemm_min;
  const int big_min =
      grouped && all_eg && (!placed || gather || prefetched) && D % k_eg_bk == 0 && F % k_eg_bk == 0 ? eg_min : 0;
  const bool tiles_too = big_min != 1;
  const int tile = all_mma ? (n_assign >= 32 * E ? 32 : 16) : k_tile_tokens;
  const size_t act_bytes = static_cast<size_t>(n_assign) * static_cast<size_t>(2 * F + D) * sizeof(float);
  const size_t act_pad = (act_bytes + 15) / 16 * 16;
  const size_t plan_pad = grouped ? (plan_bytes(n_assign, E, tile, big_min) + 15) / 16 * 16 : 0;
  // Tensor cores split x ([n][D]) and mid ([n_assign][F]) in turn into one buffer; the grouped GEMM's split
  // (the same size at most) into a second one when both kinds run.
  const int64_t split_units = grouped && ctx.tensor_cores ? std::max(n * (D / 32), n_assign * (F / 32)) : 0;
  // Decode with integer dot products: the split of x, then of mid, in turn.
  const int64_t digit_units = !grouped && ctx.int_dot ? std::max(n * (D / 32), n_assign * (F / 32)) : 0;
  const size_t split_pad = (mma_split_bytes(1, split_units) + 15) / 16 * 16;
  const int64_t eg_rows = big_min > 0 ? eg_tiled_rows(n_assign, plan_max_big(n_assign, E, big_min)) : 0;
  const size_t eg_pad = (big_min > 1 ? split_pad : 0) + eg_tiled_bytes(eg_rows, std::max(D, F));
  const size_t digit_pad = (static_cast<size_t>(digit_units) * sizeof(XDigits) + 15) / 16 * 16;
  // Host experts that are not pinned: staged through the host (cuda_expert_stream.cuh) instead of the copy kernel.
  ExpertStreamRunner* streamer = ctx.expert_stream;
  const bool streamed =
      gather && streamer && (streamer->streamed(wg.host) || streamer->streamed(wu.host) || streamer->streamed(wd.host));
  // Decode steps may leave a share of their host experts to the CPU (cuda_host_experts.cuh): the host's rows
  // of y (HostRequest::y_h, [n_assign, D]) come back in mapped host memory.
  HostExpertTask host_task;
  const bool host_possible = gather && !streamed && !grouped && ctx.host_experts && n <= ctx.host_max_tokens;
  if (host_possible) {
    auto mat = [&](const Tensor& t, const ExpertRows& r, int64_t rows, int64_t cols) {
      return HostExpertMatrix{t.type, ctx.host_ranges ? ctx.host_ranges->host_of(r.host) : nullptr, rows, cols, r.bytes,
                              E};
    };
    host_task.gate = mat(gate, wg, F, D);
    host_task.up = mat(up, wu, F, D);
    host_task.down = mat(down, wd, D, F);
    host_task.n_tokens = n;
    host_task.k = k;
    host_task.clamp = op.clamp;
    host_task.mid_quant = op.mid_quant;
  }
  // Gather: slots2 [E], list [E], count, ex2 [n_assign]; then the three matrices' stages of gather_cap experts each.
  const size_t gather_idx_pad =
      gather ? (static_cast<size_t>(2 * E + 1 + n_assign) * sizeof(int32_t) + 255) / 256 * 256 : 0;
  const int64_t mat_bytes[3] = {wg.bytes, wu.bytes, wd.bytes};
  size_t gather_pad = gather_idx_pad;
  for (int64_t b : mat_bytes) gather_pad += gather ? (static_cast<size_t>(gather_cap * b) + 255) / 256 * 256 : 0;
  const size_t bytes = act_pad + plan_pad + split_pad + eg_pad + digit_pad + gather_pad;
  auto* g8 = static_cast<uint8_t*>(ctx.scratch->get(bytes, ctx.stream));
  HostRequest host_req;                    // no rule: no host share in this op
  const int32_t* ex_k = op.experts.i32();  // the expert ids the kernels see (ex2 with a host share)
  if (gather) {
    uint8_t* gp = g8 + act_pad + plan_pad + split_pad + eg_pad + digit_pad;
    auto* slots2 = reinterpret_cast<int32_t*>(gp);
    int32_t* list = slots2 + E;
    int32_t* count = list + E;
    int32_t* ex2 = count + 1;
    if (host_possible) {
      const int64_t probe = std::min<int64_t>(gather_cap, 6);  // experts' bytes the bus calibration copies
      host_req = ctx.host_experts->plan_for(ctx, host_task, op.x.f32(), op.weights.f32(), wg.host, gp + gather_idx_pad,
                                            static_cast<size_t>(probe * wg.bytes));
    }
    launch_kernel(gather_plan_kernel, 1, 1024, 0, ctx.stream, op.slots.i32(), slots2, list, count, op.experts.i32(),
                  n_assign, static_cast<int>(E), ex2, host_req);
    CUDA_CHECK_LAUNCH();
    if (host_req.rule) ex_k = ex2;
    GatherMats gm{};
    uint8_t* stage = gp + gather_idx_pad;
    ExpertRows* rows[3] = {&wg, &wu, &wd};
    for (int m = 0; m < 3; ++m) {
      DSV4_ASSERT(reinterpret_cast<uintptr_t>(rows[m]->host) % 16 == 0 && mat_bytes[m] % 16 == 0,
                  "moe_experts: host experts of %lld bytes at a pointer not 16-byte aligned",
                  static_cast<long long>(mat_bytes[m]));
      gm.src[m] = rows[m]->host;
      gm.dst[m] = stage;
      gm.bytes[m] = mat_bytes[m];
      rows[m]->slot = slots2;
      rows[m]->stage = stage;
      stage += (static_cast<size_t>(gather_cap * mat_bytes[m]) + 255) / 256 * 256;
    }
    if (streamed) {
      const uint8_t* src[3];
      for (int m = 0; m < 3; ++m) {
        src[m] = streamer->streamed(gm.src[m]) ? gm.src[m]
                 : ctx.host_ranges             ? ctx.host_ranges->host_of(gm.src[m])
                                               : nullptr;
        DSV4_ASSERT(src[m], "moe_experts: host experts neither streamed nor registered");
      }
      streamer->stage(ctx, src, mat_bytes, E, list, count, gather_cap, gm.dst);
    } else {
      // About four blocks per SM over the stage slots in use (an upper bound: count is on the device).
      const unsigned per_expert = static_cast<unsigned>(
          std::clamp<int64_t>((4 * std::max(ctx.sm_count, 1) + gather_cap - 1) / gather_cap, 1, 64));
      launch_kernel(gather_copy_kernel, dim3(per_expert, static_cast<unsigned>(gather_cap)), 256, 0, ctx.stream, gm,
                    list, count);
      CUDA_CHECK_LAUNCH();
    }
  }
  if (prefetched) {
    ExpertRows* rows[3] = {&wg, &wu, &wd};
    for (int m = 0; m < 3; ++m) {
      rows[m]->slot = ctx.prefetched->slots;
      rows[m]->stage = ctx.prefetched->stage[m];
    }
  }
  float* g = reinterpret_cast<float*>(g8);
  XDigits* digits =
      digit_units > 0 ? reinterpret_cast<XDigits*>(g8 + act_pad + plan_pad + split_pad + eg_pad) : nullptr;
  float* u = g + n_assign * F;
  float* y = u + n_assign * F;
  if (k > 0) {
    const int32_t* ex = ex_k;
    const float* wts = op.weights.f32();
    if (grouped) {
      ExpertPlan plan = make_plan(ctx, g8 + act_pad, ex, n_assign, E, tile, big_min);
      plan.split = split_units > 0 ? g8 + act_pad + plan_pad : nullptr;
      plan.split_units = split_units;
      plan.eg_split = big_min > 0 ? g8 + act_pad + plan_pad + (tiles_too ? split_pad : 0) : nullptr;
      plan.eg_tiled = big_min > 0 ? g8 + act_pad + plan_pad + split_pad + (big_min > 1 ? split_pad : 0) : nullptr;
      plan.eg_rows = eg_rows;
      plan.eg_cols = std::max(D, F);
      if (big_min > 0) {
        const bool x_exact = op.x_quant != ActQuant::NONE;
        const bool sums =
            expert_gemm_sums(gate.type, ctx.expert_gemm_codes) || expert_gemm_sums(up.type, ctx.expert_gemm_codes);
        const EgSplit xs = expert_gemm_split(ctx, plan, op.x.f32(), n, D, D, static_cast<int>(k), sums, x_exact);
        expert_gemm(ctx, g, F, gate, wg, plan, xs, static_cast<int>(k), x_exact);
        expert_gemm(ctx, u, F, up, wu, plan, xs, static_cast<int>(k), x_exact);
      }
      if (tiles_too) {
        expert_tiles(ctx, g, F, gate, wg, plan, op.x.f32(), n, D, static_cast<int>(k), op.x_quant);
        expert_tiles(ctx, u, F, up, wu, plan, op.x.f32(), n, D, static_cast<int>(k), op.x_quant);
      }
      // fast numerics: mid as the CPU rounds it, INT8_32 in the SwiGLU kernel
      const bool q8 = op.mid_quant == ActQuant::INT8_32 && F % 32 == 0 && ctx.fuse_act_quant;
      launch_kernel(expert_swiglu_kernel, elem_grid(n_assign * F), 256, 0, ctx.stream, g, u, wts, F, n_assign * F,
                    op.clamp, q8);
      CUDA_CHECK_LAUNCH();
      if (!q8) launch_act_quant(ctx.stream, g, g, F, n_assign, op.mid_quant);
      if (big_min > 0) {
        const bool x_exact = op.mid_quant != ActQuant::NONE;
        const bool sums = expert_gemm_sums(down.type, ctx.expert_gemm_codes);
        expert_gemm(ctx, y, D, down, wd, plan, expert_gemm_split(ctx, plan, g, n_assign, F, F, 1, sums, x_exact), 1,
                    x_exact);
      }
      if (tiles_too) expert_tiles(ctx, y, D, down, wd, plan, g, n_assign, F, 1, op.mid_quant);
    } else {
      // Gate and up in one pass over x with the SwiGLU in its epilogue when they share a layout.
      if (gate.type == up.type && gate.row_bytes() == up.row_bytes()) {
        expert_matvec(ctx, g, F, gate, wg, &wu, ex, n_assign, op.x.f32(), D, static_cast<int>(k), wts, op.clamp,
                      digits);
      } else {
        expert_matvec(ctx, g, F, gate, wg, nullptr, ex, n_assign, op.x.f32(), D, static_cast<int>(k), nullptr, 0.0f,
                      digits);
        expert_matvec(ctx, u, F, up, wu, nullptr, ex, n_assign, op.x.f32(), D, static_cast<int>(k), nullptr, 0.0f,
                      digits);
        launch_kernel(expert_swiglu_kernel, elem_grid(n_assign * F), 256, 0, ctx.stream, g, u, wts, F, n_assign * F,
                      op.clamp, false);
        CUDA_CHECK_LAUNCH();
      }
      expert_matvec(ctx, y, D, down, wd, nullptr, ex, n_assign, g, F, 1, nullptr, 0.0f, digits, op.mid_quant);
    }
  }
  launch_kernel(expert_sum_kernel, elem_grid(n * D), 256, 0, ctx.stream, op.out.f32(), y, host_req, ex_k, D,
                static_cast<int>(k), n * D, op.accumulate);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
