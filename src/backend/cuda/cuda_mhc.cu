// Embedding + mHC expansion, hc_pre (with Sinkhorn), hc_post, hc_head
// (model-spec.md §4).
//
// embed     out[t, s, :] = table[ids[t], :] for each stream s. One block per
//           token; ids read from device memory (range-checked in the kernel).
// hc_pre /  per token, over the flattened state x̄ = X[t] (hc*D floats):
// hc_head   rho = 1/sqrt(mean(x̄^2) + eps), mix[m] = rho * (fn[m] · x̄).
//           Two kernels:
//           1. partials, per (token, slice of 256 elements, mix row): lane l
//              forms its 8 products with the fn row (one fmaf chain) and
//              warp_sum adds the lane sums; x̄^2 is summed the same way in
//              double. Into scratch [n][S][n_mix] + [n][S]. Small batches (a
//              decode step, Flash: hc*D = 16384, n_mix = 24): one warp per
//              (token, slice, group of 4 rows), 64 x 6 warps over the 0.75 MiB
//              of F16 fn, each loading its fn bytes before pdl_enter. Larger
//              ones: one warp per (slice, 4 tokens) over all rows, each fn unit
//              loaded and decoded once for the 4 tokens, the 4 warps of a block
//              on one slice (one token per warp read fn from L2 once per token
//              and slice: 12x the state's bytes, ~0.4 ms of a 2,048-token call).
//              From 128 tokens (n_mix 24 or 8): two threads per token, each
//              forming all 32 lane chains of its rows and adding them in
//              warp_sum's tree without shuffles (hc_mix_partial_lanes_kernel).
//              The partials' bits do not depend on the grouping or the batch
//              (test_cuda_ops: "hc_pre batch == one token").
//           2. finalize: one block per token (batches > 16 tokens: the
//              register-light loop path below, 3 blocks per SM); the block copies the partials
//              to shared memory, one warp per mix row (and one for the sum of
//              squares) adds its S partials, lane-strided then the warp tree
//              (combine_mix); then (hc = 4) warp 1
//              forms the pre/post gates, and warp 0 runs Sinkhorn on the hc x hc
//              matrix with one lane per entry (exactly cpu::sinkhorn's
//              operations); u = sum_i pre_i X_i from X columns every thread
//              loaded into registers at the start (D <= 4096: in flight during
//              the partial sums and Sinkhorn; larger D: warps 1.. form u while
//              warp 0 runs Sinkhorn; other hc: thread 0 does gates and
//              Sinkhorn, then all threads form u); the
//              head: weights, then h = sum_i w_i X_i;
//              with HcPreOp::norm_out, the same block then writes RMSNorm(u; w)
//              with rms_norm_kernel's row code (the sublayer's input norm: one
//              launch less per sublayer), and with HcPreOp::norm_quant INT8_32
//              also its quantised copy (block_rms_norm_regs' q8: `fast`
//              numerics' act_quant inside the finalize): for batches of more
//              than 16 tokens by default (CudaContext::fuse_act_quant; H100,
//              hc_pre with its norm at 4,096 tokens 607 -> 541 us against a
//              separate act_quant launch), for decode steps only with
//              --act-quant-fusion=all (slower there: fast-numerics.md).
//           S depends only on hc*D, so results never depend on the batch size.
//           (A block per (token, slice, 8 rows) with block-wide reductions
//           measured 1.5 ms per prefill call of 2,048 tokens.)
// hc_post   X'_j = post_j * y + sum_i comb[i][j] X_i (optional bf16 round; y
//           optionally y + y2, fusing the decode FFN's shared-expert addition),
//           in place: one thread per (token, 4 consecutive d) for hc = 4 (16-byte
//           accesses), else one per (token, d).
//
// Float operations outside the dot products repeat the CPU's (rounded
// products and sums in the CPU's order, no contraction).
// CPU reference: cpu::embed, cpu::hc_pre, cpu::hc_post, cpu::hc_head (cpu_mhc.cpp).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_dense.cuh"
#include "backend/cuda/cuda_mhc.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/cuda_rowops.cuh"

namespace dsv4::cuda {

namespace {

constexpr int k_mix_pass = 8;              // mix rows accumulated per pass over a slice (batches)
constexpr int k_mix_pre = 4;               // mix rows per warp in small batches, their weights preloaded (decode)
constexpr int k_mix_tt = 4;                // tokens per warp in larger batches
constexpr int64_t k_mix_tokens_min = 16;   // larger batches: the tokens kernel
constexpr int64_t k_finalize_tr_min = 16;  // larger batches: the finalize's transposed partials (combine_mix)
constexpr int k_max_hc = 8;

template <GgmlType T>
__global__ void embed_kernel(float* out, const uint8_t* table, size_t row_bytes, int64_t n_rows, const int32_t* ids,
                             int64_t hc, int64_t D, QuantTables tab) {
  pdl_enter();
  constexpr int U = WeightUnit<T>::U;
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  DEVICE_CHECK(id >= 0 && id < n_rows);
  const uint8_t* row = table + static_cast<int64_t>(id) * row_bytes;
  float* o = out + t * hc * D;
  for (int64_t u = threadIdx.x; u < D / U; u += blockDim.x) {
    float w[U];
    WeightUnit<T>::decode(row, u, w, tab);
    for (int64_t s = 0; s < hc; ++s)
#pragma unroll
      for (int j = 0; j < U; ++j) o[s * D + u * U + j] = w[j];
  }
}

// Elements per lane (and a slice = 32 lanes) of the partial dot products for
// the mix weight types (F32: 2 units of 4; F16, BF16: 1 unit of 8).
constexpr int k_mix_lane = 8;
constexpr int k_mix_slice = 32 * k_mix_lane;

// Partial sums of one slice: part_dot[(t*S + s) * n_mix + m] (float dot m) and
// part_ss[t*S + s] (double sum of squares). Small batches: one warp per
// (token t, slice s, group of up to k_mix_pre mix rows): lane l holds the 8
// elements [256 s + 8 l, +8) of x̄, forms its 8 products with each fn row in
// element order (one fmaf chain) and warp_sum adds the 32 lane sums in a fixed
// tree; the group-0 warp also sums x̄^2 in double the same way. The lane's
// weight units of every row are loaded before pdl_enter() (fn is a constant
// weight), so their latency overlaps the predecessor instead of following the
// state load. hc_mix_partial_tokens_kernel below does the same operations per
// (t, s, m) for larger batches: every partial has the same bits whatever the
// batch size or the grouping.
template <GgmlType T>
__global__ void __launch_bounds__(128)
    hc_mix_partial_kernel(const float* state, int64_t n, int64_t len, const uint8_t* fn, size_t fn_row_bytes, int n_mix,
                          int S, float* part_dot, double* part_ss, QuantTables) {
  constexpr int U = WeightUnit<T>::U, E = k_mix_lane;
  static_assert(E % U == 0, "a lane's elements are whole units");
  const int lane = threadIdx.x & 31;
  const int n_groups = (n_mix + k_mix_pre - 1) / k_mix_pre;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w >= n * S * n_groups) {  // whole warps
    pdl_enter();
    return;
  }
  const int grp = static_cast<int>(w % n_groups);
  const int64_t s = (w / n_groups) % S, t = w / n_groups / S;
  const int64_t e0 = s * k_mix_slice + static_cast<int64_t>(lane) * E;
  const bool in = e0 < len;  // len % 8 == 0 (launcher)
  const int m0 = grp * k_mix_pre, m1 = min(n_mix, m0 + k_mix_pre);
  uint4 wv_pre[k_mix_pre][E / U];
  if (in) {
#pragma unroll
    for (int k = 0; k < k_mix_pre; ++k)
      if (m0 + k < m1)
#pragma unroll
        for (int u = 0; u < E / U; ++u)
          wv_pre[k][u] =
              ld(reinterpret_cast<const uint4*>(fn + static_cast<int64_t>(m0 + k) * fn_row_bytes) + e0 / U + u);
  }
  pdl_enter();
  float xv[E];
  if (in) {
    load_f32x4s(state + t * len + e0, xv);
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j) xv[j] = 0.0f;
  }
  if (grp == 0) {
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < E; ++j) ss += static_cast<double>(xv[j]) * static_cast<double>(xv[j]);
    ss = warp_sum_double(ss);
    if (lane == 0) part_ss[t * S + s] = ss;
  }
  float acc[k_mix_pre];
#pragma unroll
  for (int k = 0; k < k_mix_pre; ++k) {
    acc[k] = 0.0f;
    if (m0 + k < m1 && in) {
#pragma unroll
      for (int u = 0; u < E / U; ++u) {
        float wv[U];
        WeightUnit<T>::decode_vec(wv_pre[k][u], wv);
#pragma unroll
        for (int j = 0; j < U; ++j) acc[k] = fmaf(wv[j], xv[u * U + j], acc[k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < k_mix_pre; ++k) {
    if (m0 + k >= m1) break;  // uniform across the warp
    const float v = warp_sum(acc[k]);
    if (lane == 0) part_dot[(t * S + s) * n_mix + m0 + k] = v;
  }
}

// Larger batches: one warp per (slice s, k_mix_tt consecutive tokens), every
// mix row in passes of k_mix_pass; each row's fn unit is loaded and decoded
// once and multiplied into the k_mix_tt tokens' chains (registers: the tokens'
// x̄ slices, 4 x 8, and the pass's accumulators, 8 x 4). Warps are numbered
// slice-major, so a block's 4 warps share a slice's 24 x 512 bytes of fn (L1).
// Per (t, s, m) the same operations as hc_mix_partial_kernel: the same bits.
template <GgmlType T>
__global__ void __launch_bounds__(128)
    hc_mix_partial_tokens_kernel(const float* state, int64_t n, int64_t len, const uint8_t* fn, size_t fn_row_bytes,
                                 int n_mix, int S, float* part_dot, double* part_ss, QuantTables tab) {
  constexpr int U = WeightUnit<T>::U, E = k_mix_lane, TT = k_mix_tt;
  static_assert(E % U == 0, "a lane's elements are whole units");
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t n_tg = (n + TT - 1) / TT;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w >= S * n_tg) return;  // whole warps
  const int64_t s = w / n_tg, t0 = (w - s * n_tg) * TT;
  const int nt = static_cast<int>(min(static_cast<int64_t>(TT), n - t0));  // warp-uniform
  const int64_t e0 = s * k_mix_slice + static_cast<int64_t>(lane) * E;
  const bool in = e0 < len;  // len % 8 == 0 (launcher)
  float xv[TT][E];
#pragma unroll
  for (int k = 0; k < TT; ++k) {
    if (k < nt && in) {
      load_f32x4s(state + (t0 + k) * len + e0, xv[k]);
    } else {
#pragma unroll
      for (int j = 0; j < E; ++j) xv[k][j] = 0.0f;
    }
  }
#pragma unroll
  for (int k = 0; k < TT; ++k) {
    if (k >= nt) break;  // uniform across the warp
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < E; ++j) ss += static_cast<double>(xv[k][j]) * static_cast<double>(xv[k][j]);
    ss = warp_sum_double(ss);
    if (lane == 0) part_ss[(t0 + k) * S + s] = ss;
  }
  for (int mb = 0; mb < n_mix; mb += k_mix_pass) {
    float acc[k_mix_pass][TT];
#pragma unroll
    for (int r = 0; r < k_mix_pass; ++r) {
#pragma unroll
      for (int k = 0; k < TT; ++k) acc[r][k] = 0.0f;
      if (mb + r < n_mix && in) {
        const uint8_t* row = fn + static_cast<int64_t>(mb + r) * fn_row_bytes;
#pragma unroll
        for (int u = 0; u < E / U; ++u) {
          float wv[U];
          WeightUnit<T>::decode(row, e0 / U + u, wv, tab);
#pragma unroll
          for (int k = 0; k < TT; ++k)
#pragma unroll
            for (int j = 0; j < U; ++j) acc[r][k] = fmaf(wv[j], xv[k][u * U + j], acc[r][k]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < k_mix_pass; ++r) {
      if (mb + r >= n_mix) break;  // uniform across the warp
#pragma unroll
      for (int k = 0; k < TT; ++k) {
        if (k >= nt) break;  // uniform across the warp
        const float v = warp_sum(acc[r][k]);
        if (lane == 0) part_dot[((t0 + k) * S + s) * n_mix + mb + r] = v;
      }
    }
  }
}

// Large batches (n >= k_mix_lanes_min): a block per (k_mix_lanes_tokens tokens,
// slice s), two threads per token (thread p: mix rows p NM / 2 ..), the same
// bits again without shuffles. A thread forms its rows' partials of (t, s)
// alone: chain l (l = 0..31) is what lane l of the warp kernels forms (its 8
// elements [256 s + 8 l, +8) in element order, one fmaf chain per mix row; the
// squares in double, thread 0 of the pair), and the chains are added in
// warp_sum's tree — l with l + 16, then with l + 8, 4, 2, 1 — which is the
// order in which a binary counter adds them when they come in bit-reversed
// order (0, 16, 8, 24, 4, ...): chain i of that order goes in with one
// addition per trailing one bit of i (mix_tree_push within a quarter, then
// the quarters). Quarter q of that order is the chains l = 4 br3(j) + br2(q),
// j = 0..7.
// Shared memory: the slice's fn rows decoded once per block as floats (the
// values the warp kernels decode; a warp reads two addresses, in distinct
// banks), and x̄ by quarters, double-buffered: cp.async brings quarter q + 1
// (the block's tokens x 8 chains of 32 bytes, 32 KiB) while quarter q is
// summed (a thread loading its own token would keep only a chain's 32 bytes
// in flight). Two threads per token (12 rows each, 128 registers: ptxas spills
// ~90 bytes) measured faster than one (24 rows, 212 registers, half the warps
// per SM): the kernel 258 against 281 us at 4,096 tokens (ncu, H100), hc_pre
// 509 against 526. Either takes about half the instructions of the tokens
// kernel (503 us), whose 5-step shuffle trees per (t, s, m) were ~30% of its
// instructions and most of its short-scoreboard stalls (PERFORMANCE.md "Where
// the time goes").
constexpr int k_mix_lanes_tokens = 128;                      // tokens per block
constexpr int k_mix_lanes_threads = 2 * k_mix_lanes_tokens;  // two threads per token
constexpr int64_t k_mix_lanes_min = 128;                     // batches of at least this many tokens
constexpr int k_mix_lanes_xs = 8 * 8 + 4;  // floats per token row of a quarter's x̄ (+16 bytes: LDS.128 conflict-free)
constexpr int k_mix_lanes_fs = k_mix_slice + 4;  // floats per fn row (+16 bytes: the pair's rows in distinct banks)
template <int NM>
constexpr size_t mix_lanes_smem() {
  return (static_cast<size_t>(NM) * k_mix_lanes_fs + 2 * k_mix_lanes_tokens * k_mix_lanes_xs) * sizeof(float);
}

// Adds chain number I of the bit-reversed order into the tree levels st (warp_sum's pairing): returns the
// level-k sum a chain completes (k = the trailing one bits of I), kept in st[k] for a later partner.
template <int I, typename V>
__device__ __forceinline__ V mix_tree_push(V (&st)[3], V v) {
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    if (!((I >> k) & 1)) {
      st[k] = v;
      return v;
    }
    if constexpr (std::is_same_v<V, double>)
      v = __dadd_rn(st[k], v);
    else
      v = __fadd_rn(st[k], v);
  }
  return v;  // I = 7: the level-3 sum of the eight
}
__host__ __device__ constexpr int mix_bitrev3(int j) { return ((j & 1) << 2) | (j & 2) | ((j & 4) >> 2); }

// NM mix rows (n_mix == NM: 24 for hc = 4, 8 for hc = 2).
template <GgmlType T, int NM>
__global__ void __launch_bounds__(k_mix_lanes_threads, 2)
    hc_mix_partial_lanes_kernel(const float* state, int64_t n, int64_t len, const uint8_t* fn, size_t fn_row_bytes,
                                int S, float* part_dot, double* part_ss, QuantTables tab) {
  constexpr int U = WeightUnit<T>::U, E = k_mix_lane, TB = k_mix_lanes_tokens, P = k_mix_lanes_threads / TB;
  constexpr int R = NM / P, RG = R % 2 == 0 ? 2 : 1;  // rows per thread; rows whose weights are loaded together
  static_assert(E % U == 0 && E == 8, "a chain is 8 elements: whole units");
  static_assert(NM % P == 0, "whole rows per thread");
  extern __shared__ __align__(16) float mix_lanes_smem[];
  float* fs = mix_lanes_smem;                        // fs[m k_mix_lanes_fs + e]: fn row m, element 256 s + e
  float* xq = mix_lanes_smem + NM * k_mix_lanes_fs;  // [2][TB][k_mix_lanes_xs]: quarter q's chains j = 0..7
  const int64_t s = blockIdx.y, tb = static_cast<int64_t>(blockIdx.x) * TB;
  const int n_chains = static_cast<int>(min(int64_t{32}, (len - s * k_mix_slice) / E));  // len % 8 == 0
  // The slice of fn (a constant weight: before pdl_enter, overlapping the predecessor). Chains past len (a
  // partial last slice) are skipped below, as the warp kernels' lanes past it.
  for (int i = threadIdx.x; i < NM * 32; i += blockDim.x) {
    const int m = i >> 5, l = i & 31;
    if (l >= n_chains) continue;
    float w[E];
    const uint8_t* row = fn + static_cast<int64_t>(m) * fn_row_bytes;
#pragma unroll
    for (int u = 0; u < E / U; ++u) WeightUnit<T>::decode(row, (s * k_mix_slice + 8 * l) / U + u, w + u * U, tab);
    float4* d = reinterpret_cast<float4*>(fs + m * k_mix_lanes_fs + 8 * l);
    d[0] = make_float4(w[0], w[1], w[2], w[3]);
    d[1] = make_float4(w[4], w[5], w[6], w[7]);
  }
  pdl_enter();
  // Quarter q's x̄ into buffer q & 1: 16-byte pieces, 16 per token (8 chains x 2), consecutive threads along a
  // token's pieces.
  auto fetch = [&](int q) {
    const int lq = ((q & 1) << 1) | (q >> 1);
    float* dst = xq + (q & 1) * TB * k_mix_lanes_xs;
    for (int c = threadIdx.x; c < TB * 16; c += blockDim.x) {
      const int tk = c >> 4, j = (c >> 1) & 7, h = c & 1, l = 4 * mix_bitrev3(j) + lq;
      if (tb + tk < n && l < n_chains)
        cp_async_vec(reinterpret_cast<float4*>(dst + tk * k_mix_lanes_xs + 8 * j + 4 * h),
                     reinterpret_cast<const float4*>(state + (tb + tk) * len + s * k_mix_slice + 8 * l + 4 * h));
    }
    cp_async_commit();
  };
  fetch(0);
  const int tk = static_cast<int>(threadIdx.x) / P, p = static_cast<int>(threadIdx.x) % P;
  const int64_t t = tb + tk;
  const float* fr = fs + p * R * k_mix_lanes_fs;  // this thread's rows
  float lv3[R], lv4[R];                           // the tree's levels 3 and 4 (quarters 0 + 1, then (0 + 1) + (2 + 3))
  double sv3 = 0.0, sv4 = 0.0;
#pragma unroll 1
  for (int q = 0; q < 4; ++q) {
    if (q + 1 < 4) {
      fetch(q + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // quarter q's x̄ (and, the first time, fs) visible to the block
    const int lq = ((q & 1) << 1) | (q >> 1);
    const float* xr = xq + (q & 1) * TB * k_mix_lanes_xs + tk * k_mix_lanes_xs;
    float st[R][3], g[R];
    double sst[3], gs = 0.0;
    auto chain = [&](auto jtag) {
      constexpr int J = decltype(jtag)::value;
      const int l = 4 * mix_bitrev3(J) + lq;
      const bool on = l < n_chains;  // uniform: a chain past len is 0
      float x[E];
      if (on) {
        const float4 a = reinterpret_cast<const float4*>(xr + 8 * J)[0],
                     b = reinterpret_cast<const float4*>(xr + 8 * J)[1];
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
      }
      if (p == 0) {
        double ss = 0.0;
        if (on)
#pragma unroll
          for (int j = 0; j < E; ++j) ss += static_cast<double>(x[j]) * static_cast<double>(x[j]);
        gs = mix_tree_push<J>(sst, ss);
      }
      // RG rows at a time: their 8 weights each, then the RG chains interleaved element by element.
#pragma unroll
      for (int r0 = 0; r0 < R; r0 += RG) {
        float c[RG];
#pragma unroll
        for (int r = 0; r < RG; ++r) c[r] = 0.0f;
        if (on) {
          float wv[RG][E];
#pragma unroll
          for (int r = 0; r < RG; ++r) {
            const float4* w = reinterpret_cast<const float4*>(fr + (r0 + r) * k_mix_lanes_fs + 8 * l);
            const float4 w0 = w[0], w1 = w[1];
            wv[r][0] = w0.x, wv[r][1] = w0.y, wv[r][2] = w0.z, wv[r][3] = w0.w;
            wv[r][4] = w1.x, wv[r][5] = w1.y, wv[r][6] = w1.z, wv[r][7] = w1.w;
          }
#pragma unroll
          for (int j = 0; j < E; ++j)
#pragma unroll
            for (int r = 0; r < RG; ++r) c[r] = fmaf(wv[r][j], x[j], c[r]);
        }
#pragma unroll
        for (int r = 0; r < RG; ++r) g[r0 + r] = mix_tree_push<J>(st[r0 + r], c[r]);
      }
    };
    chain(std::integral_constant<int, 0>{});
    chain(std::integral_constant<int, 1>{});
    chain(std::integral_constant<int, 2>{});
    chain(std::integral_constant<int, 3>{});
    chain(std::integral_constant<int, 4>{});
    chain(std::integral_constant<int, 5>{});
    chain(std::integral_constant<int, 6>{});
    chain(std::integral_constant<int, 7>{});
    // g: the quarter's level-3 sums; levels 3 and 4 as a binary counter over the quarters.
    if (q == 0 || q == 2) {
#pragma unroll
      for (int m = 0; m < R; ++m) lv3[m] = g[m];
      sv3 = gs;
    } else {
#pragma unroll
      for (int m = 0; m < R; ++m) {
        const float v = __fadd_rn(lv3[m], g[m]);
        lv4[m] = q == 1 ? v : __fadd_rn(lv4[m], v);
      }
      const double v = __dadd_rn(sv3, gs);
      sv4 = q == 1 ? v : __dadd_rn(sv4, v);
    }
    __syncthreads();  // every thread is done with buffer q & 1 before quarter q + 2's copy lands there
  }
  if (t >= n) return;
  float* pd = part_dot + (t * S + s) * NM + p * R;
#pragma unroll
  for (int m = 0; m < R; ++m) pd[m] = lv4[m];
  if (p == 0) part_ss[t * S + s] = sv4;
}

// mix[m] = rho * (sum over slices of the dot partials); rho from the double
// partials. Called by every thread of the block (blockDim.x a multiple of 32,
// >= n_mix); ends with the block synchronised. `sm`: dynamic shared memory of
// finalize_smem(S, n_mix) bytes: the partials are first copied there by the
// whole block (coalesced global loads, a round of them in flight per thread); then warp w sums rows
// w, w + warps, ... (and, as row n_mix, the squares): lane l adds slices l,
// l + 32, ... in order, then the warp tree (warp_sum). The order is fixed, so
// the result never depends on the batch or on the layout. Layouts of the
// copy: Tr (large batches, throughput) transposes the dot partials to
// [n_mix][S + 1] (the odd row stride keeps both the copy's stores and the
// sums' loads free of bank conflicts); !Tr (decode, latency) keeps [S][n_mix]
// (8-way conflicts at n_mix = 24 on 2 loads per lane, but no index divisions
// on the copy). (Thread m adding its row's S partials one after another
// would put a chain of S = 64 dependent shared-memory loads and adds on
// every decode call's critical path.)
__host__ __device__ constexpr size_t finalize_smem(int S, int n_mix) {
  return static_cast<size_t>(S) * sizeof(double) +
         static_cast<size_t>(S + 1) * static_cast<size_t>(n_mix) * sizeof(float);
}
template <bool Tr>
__device__ void combine_mix(const float* part_dot, const double* part_ss, int64_t t, int S, int n_mix, int64_t len,
                            float norm_eps, float* mix, float* rho_shared, unsigned char* sm) {
  double* ss_s = reinterpret_cast<double*>(sm);
  float* dot_s = reinterpret_cast<float*>(sm + static_cast<size_t>(S) * sizeof(double));
  const int nt = static_cast<int>(blockDim.x), total = S * n_mix;
  const float* pd = part_dot + t * static_cast<int64_t>(total);
  // The copy in rounds: round r moves squares [r nt, (r + 1) nt) and dot
  // partials [r B nt, (r + 1) B nt), every load of the round issued before its
  // stores. (A load-store loop waits for each load in turn: Flash's 1,536 + 64
  // values took 6 dependent L2 round trips per thread, now 1; decode hc_pre
  // 10.7 -> 10.0 us.)
  constexpr int B = 8;
  for (int r = 0;; ++r) {
    const int i_ss = static_cast<int>(threadIdx.x) + r * nt, i_d = static_cast<int>(threadIdx.x) + r * B * nt;
    if (i_ss >= S && i_d >= total) break;
    const double sv = i_ss < S ? part_ss[t * S + i_ss] : 0.0;
    float dv[B];
#pragma unroll
    for (int k = 0; k < B; ++k) dv[k] = i_d + k * nt < total ? pd[i_d + k * nt] : 0.0f;
    if (i_ss < S) ss_s[i_ss] = sv;
#pragma unroll
    for (int k = 0; k < B; ++k) {
      const int i = i_d + k * nt;
      if (i >= total) break;
      if constexpr (Tr) {
        const int sl = i / n_mix, m = i - sl * n_mix;
        dot_s[m * (S + 1) + sl] = dv[k];
      } else {
        dot_s[i] = dv[k];
      }
    }
  }
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  for (int m = warp; m <= n_mix; m += n_warps) {  // warp-uniform
    if (m < n_mix) {
      float d = 0.0f;
      for (int sl = lane; sl < S; sl += 32) d = __fadd_rn(d, Tr ? dot_s[m * (S + 1) + sl] : dot_s[sl * n_mix + m]);
      d = warp_sum(d);
      if (lane == 0) mix[m] = d;
    } else {
      double ss = 0.0;
      for (int sl = lane; sl < S; sl += 32) ss += ss_s[sl];
      ss = warp_sum_double(ss);
      if (lane == 0)
        *rho_shared = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(len) + static_cast<double>(norm_eps)));
    }
  }
  __syncthreads();
  if (threadIdx.x < n_mix) mix[threadIdx.x] = __fmul_rn(*rho_shared, mix[threadIdx.x]);
  __syncthreads();
}

// Sinkhorn projection of an hc x hc matrix in place (cpu::sinkhorn).
__device__ void sinkhorn_dev(float* c, int hc, float eps, int iters) {
  for (int i = 0; i < hc; ++i) {
    float* row = c + i * hc;
    float mx = row[0];
    for (int j = 1; j < hc; ++j) mx = mx < row[j] ? row[j] : mx;
    float sum = 0.0f;
    for (int j = 0; j < hc; ++j) sum = __fadd_rn(sum, (row[j] = expf(__fsub_rn(row[j], mx))));
    for (int j = 0; j < hc; ++j) row[j] = __fadd_rn(row[j] / sum, eps);
  }
  auto col_norm = [&] {
    for (int j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int i = 0; i < hc; ++i) s = __fadd_rn(s, c[i * hc + j]);
      for (int i = 0; i < hc; ++i) c[i * hc + j] /= __fadd_rn(s, eps);
    }
  };
  auto row_norm = [&] {
    for (int i = 0; i < hc; ++i) {
      float s = 0.0f;
      for (int j = 0; j < hc; ++j) s = __fadd_rn(s, c[i * hc + j]);
      for (int j = 0; j < hc; ++j) c[i * hc + j] /= __fadd_rn(s, eps);
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
}

// sinkhorn_dev for hc = 4 spread over the 16 lanes of a half warp (lane 4i + j
// holds c[i][j]; both half warps compute the same matrix): every row or column
// sum gathers its four values with shuffles and adds them in the CPU's order,
// so the bits are cpu::sinkhorn's, with the 4 rows or columns normalised in
// parallel instead of one after another by a single thread (which, with the
// ordered partial sums read from global memory, made hc_pre ~40 us per call). Returns c[i][j]
// of this lane. Every lane of the warp must call it.
__device__ float sinkhorn_warp4(float v, float eps, int iters) {
  const int lane = threadIdx.x & 31, i = (lane >> 2) & 3, j = lane & 3;
  auto row_at = [&](float x, int k) { return __shfl_sync(k_full_mask, x, (lane & 16) + 4 * i + k); };
  auto col_at = [&](float x, int k) { return __shfl_sync(k_full_mask, x, (lane & 16) + 4 * k + j); };
  // Row softmax (+ eps).
  const float r0 = row_at(v, 0), r1 = row_at(v, 1), r2 = row_at(v, 2), r3 = row_at(v, 3);
  float mx = r0;
  mx = mx < r1 ? r1 : mx;
  mx = mx < r2 ? r2 : mx;
  mx = mx < r3 ? r3 : mx;
  const float e = expf(__fsub_rn(v, mx));
  const float sum =
      __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(0.0f, row_at(e, 0)), row_at(e, 1)), row_at(e, 2)), row_at(e, 3));
  v = __fadd_rn(e / sum, eps);
  const int n_it = iters > 1 ? iters : 1;  // one column pass even for iters <= 1, as sinkhorn_dev
  for (int it = 0; it < n_it; ++it) {
    if (it > 0) {
      const float s =
          __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(0.0f, row_at(v, 0)), row_at(v, 1)), row_at(v, 2)), row_at(v, 3));
      v /= __fadd_rn(s, eps);
    }
    const float s =
        __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(0.0f, col_at(v, 0)), col_at(v, 1)), col_at(v, 2)), col_at(v, 3));
    v /= __fadd_rn(s, eps);
  }
  return v;
}

// The finalize of one token (blockIdx.x); the kernels below call it after
// pdl_enter().
template <bool Tr, bool Regs>
__device__ __forceinline__ void hc_pre_finalize_body(const float* state, int64_t D, int hc, int S,
                                                     const float* part_dot, const double* part_ss, const float* scale,
                                                     const float* base, float norm_eps, float hc_eps, int iters,
                                                     float* u, float* post, float* comb, float* xn, const float* xn_w,
                                                     float xn_eps, float* xq8_arg) {
  // The quantised copy (INT8_32) inside the norm when the launcher passes it (launch_hc_pre: which path when).
  float* const xq8 = xq8_arg;
  extern __shared__ unsigned char fin_sm[];
  __shared__ float mix[(2 + k_max_hc) * k_max_hc];
  __shared__ float pre[k_max_hc];
  __shared__ float rho;
  const int64_t t = blockIdx.x;
  const int n_mix = (2 + hc) * hc;
  const float* X = state + t * hc * D;
  // hc = 4 and rows of up to k_norm_reg * blockDim.x (DeepSeek V4: 4 x 4096):
  // thread k's columns k, k + blockDim.x, ... of X (and of the norm weight)
  // are loaded before anything else, all in flight while the partials are
  // combined and Sinkhorn runs; u and the fused norm then work on registers
  // (block_rms_norm_regs: the column mapping of block_rms_norm_row, so the
  // same bits as the separate norm). The loop below instead reads X after the
  // gates, a few dependent round trips, and the norm read u back. Regs (small
  // batches: latency) compiles the register path; larger batches (throughput)
  // take the loop, whose registers let several blocks share an SM (the
  // register path's ~160 registers per thread allow one 256-thread block per
  // SM: a 2,048-token call took 123 us in 16 waves of 132 blocks).
  const bool regs = Regs && hc == 4 && D <= k_norm_reg * static_cast<int64_t>(blockDim.x);
  float xr[4][k_norm_reg], wr[k_norm_reg];
  if (regs) {
#pragma unroll
    for (int k = 0; k < k_norm_reg; ++k) {
      const int64_t d = threadIdx.x + k * static_cast<int64_t>(blockDim.x);
#pragma unroll
      for (int i = 0; i < 4; ++i) xr[i][k] = d < D ? X[i * D + d] : 0.0f;
      wr[k] = (xn_w && d < D) ? xn_w[d] : 1.0f;
    }
  }
  combine_mix<Tr>(part_dot, part_ss, t, S, n_mix, hc * D, norm_eps, mix, &rho, fin_sm);
  float* po = post + t * hc;
  float* co = comb + t * hc * hc;
  const float* cm = mix + 2 * hc;  // the comb logits
  // u's threads: with hc = 4, warp 0 runs Sinkhorn while warps 1.. form u (u
  // needs only the pre gates; each u[d] is one thread's fixed sum, whatever the
  // mapping), which hides the Sinkhorn chain (~20 dependent shuffle rounds).
  int u_tid = static_cast<int>(threadIdx.x), u_threads = static_cast<int>(blockDim.x);
  if (hc == 4) {  // DeepSeek V4's n_hc
    if (threadIdx.x >= 32 && threadIdx.x < 32 + hc) {
      const int i = threadIdx.x - 32;
      pre[i] = __fadd_rn(sigmoid_dev(__fadd_rn(__fmul_rn(scale[0], mix[i]), base[i])), hc_eps);
      po[i] = __fmul_rn(2.0f, sigmoid_dev(__fadd_rn(__fmul_rn(scale[1], mix[hc + i]), base[hc + i])));
    }
    __syncthreads();  // pre visible
    if (threadIdx.x < 32) {
      const int k = threadIdx.x & 15;
      const float v = sinkhorn_warp4(__fadd_rn(__fmul_rn(scale[2], cm[k]), base[2 * hc + k]), hc_eps, iters);
      if (threadIdx.x < 16) co[k] = v;
      u_threads = 0;  // warp 0 forms no u columns
    } else {
      u_tid -= 32;
      u_threads -= 32;
    }
  } else if (threadIdx.x == 0) {
    for (int i = 0; i < hc; ++i) {
      pre[i] = __fadd_rn(sigmoid_dev(__fadd_rn(__fmul_rn(scale[0], mix[i]), base[i])), hc_eps);
      po[i] = __fmul_rn(2.0f, sigmoid_dev(__fadd_rn(__fmul_rn(scale[1], mix[hc + i]), base[hc + i])));
    }
    float c[k_max_hc * k_max_hc];
    for (int k = 0; k < hc * hc; ++k) c[k] = __fadd_rn(__fmul_rn(scale[2], cm[k]), base[2 * hc + k]);
    sinkhorn_dev(c, hc, hc_eps, iters);
    for (int k = 0; k < hc * hc; ++k) co[k] = c[k];
  }
  if (hc != 4) __syncthreads();  // pre from thread 0
  if (regs) {                    // every thread (warp 0 after Sinkhorn) forms its columns of u, then the norm
    float ur[k_norm_reg];
#pragma unroll
    for (int k = 0; k < k_norm_reg; ++k) {
      const int64_t d = threadIdx.x + k * static_cast<int64_t>(blockDim.x);
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) s = __fadd_rn(s, __fmul_rn(pre[i], xr[i][k]));
      ur[k] = s;
      if (d < D) u[t * D + d] = s;
    }
    if (xn) {
      __shared__ double red_r[33];
      block_rms_norm_regs(xn + t * D, ur, wr, xn_w != nullptr, D, xn_eps, red_r, xq8 ? xq8 + t * D : nullptr);
    }
    return;
  }
  // u = sum_i pre_i X_i: four columns per thread per step, their 4 x hc loads
  // issued together (a plain loop waits for each column's loads in turn).
  constexpr int kCols = 4;
  for (int64_t d0 = u_tid; u_threads > 0 && d0 < D; d0 += kCols * u_threads) {
    float xv[kCols][k_max_hc];
#pragma unroll
    for (int q = 0; q < kCols; ++q) {
      const int64_t d = d0 + q * u_threads;
#pragma unroll
      for (int i = 0; i < k_max_hc; ++i) xv[q][i] = (i < hc && d < D) ? X[i * D + d] : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < kCols; ++q) {
      const int64_t d = d0 + q * u_threads;
      if (d >= D) break;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < k_max_hc; ++i)
        if (i < hc) s = __fadd_rn(s, __fmul_rn(pre[i], xv[q][i]));
      u[t * D + d] = s;
    }
  }
  if (xn) {  // the fused input norm: rms_norm_kernel's row code on the u just written
    __shared__ double red[33];
    __syncthreads();  // u (and, with hc = 4, nothing else is pending: comb is written by warp 0 alone)
    block_rms_norm_row(xn + t * D, u + t * D, xn_w, D, xn_eps, red, xq8 ? xq8 + t * D : nullptr);
  }
}

#define DSV4_HC_FINALIZE_PARAMS                                                                                   \
  const float *state, int64_t D, int hc, int S, const float *part_dot, const double *part_ss, const float *scale, \
      const float *base, float norm_eps, float hc_eps, int iters, float *u, float *post, float *comb, float *xn,  \
      const float *xn_w, float xn_eps, float *xq8
#define DSV4_HC_FINALIZE_ARGS \
  state, D, hc, S, part_dot, part_ss, scale, base, norm_eps, hc_eps, iters, u, post, comb, xn, xn_w, xn_eps, xq8

// Small batches (a decode step: latency): the register path.
__global__ void hc_pre_finalize_kernel(DSV4_HC_FINALIZE_PARAMS) {
  pdl_enter();
  hc_pre_finalize_body<false, true>(DSV4_HC_FINALIZE_ARGS);
}

// Larger batches (throughput): the loop path, at most 85 registers (3 blocks
// of 256 threads per SM; ptxas: 80 registers, 64 / 96 bytes of spill stores /
// loads with the norm's quantiser compiled in).
__global__ void __launch_bounds__(256, 3) hc_pre_finalize_loop_kernel(DSV4_HC_FINALIZE_PARAMS) {
  pdl_enter();
  hc_pre_finalize_body<true, false>(DSV4_HC_FINALIZE_ARGS);
}

#undef DSV4_HC_FINALIZE_PARAMS
#undef DSV4_HC_FINALIZE_ARGS

template <bool Tr>
__global__ void hc_head_finalize_kernel(const float* state, int64_t D, int hc, int S, const float* part_dot,
                                        const double* part_ss, const float* scale, const float* base, float norm_eps,
                                        float hc_eps, float* h) {
  pdl_enter();
  extern __shared__ unsigned char fin_sm[];
  __shared__ float mix[k_max_hc];
  __shared__ float rho;
  const int64_t t = blockIdx.x;
  combine_mix<Tr>(part_dot, part_ss, t, S, hc, hc * D, norm_eps, mix, &rho, fin_sm);
  if (threadIdx.x == 0) {
    for (int i = 0; i < hc; ++i)
      mix[i] = __fadd_rn(sigmoid_dev(__fadd_rn(__fmul_rn(scale[0], mix[i]), base[i])), hc_eps);
  }
  __syncthreads();
  const float* X = state + t * hc * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < hc; ++i) acc = __fadd_rn(acc, __fmul_rn(mix[i], X[i * D + d]));
    h[t * D + d] = acc;
  }
}

__global__ void hc_post_kernel(float* state, const float* y, const float* y2, const float* post, const float* comb,
                               int64_t D, int hc, int64_t n, bool round_bf16) {
  pdl_enter();
  const int64_t total = n * D;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float* X = state + t * hc * D;
    float xi[k_max_hc];
#pragma unroll
    for (int k = 0; k < k_max_hc; ++k) xi[k] = k < hc ? X[k * D + d] : 0.0f;
    const float yv = y2 ? __fadd_rn(y[t * D + d], y2[t * D + d]) : y[t * D + d];
    const float* po = post + t * hc;
    const float* co = comb + t * hc * hc;
#pragma unroll
    for (int j = 0; j < k_max_hc; ++j) {
      if (j >= hc) break;
      float s = __fmul_rn(po[j], yv);
#pragma unroll
      for (int k = 0; k < k_max_hc; ++k)
        if (k < hc) s = __fadd_rn(s, __fmul_rn(co[k * hc + j], xi[k]));
      X[j * D + d] = round_bf16 ? bf16_round_dev(s) : s;
    }
  }
}

// hc_post_kernel for hc = 4 and D % 4 == 0 (DeepSeek V4): one thread per
// (token, 4 consecutive d) with 16-byte loads and stores, the token's post and
// comb loaded once per 4 elements (the same addresses across a warp), no
// 64-bit division per element (the generic kernel's t = i / D). Per element
// the same operations as hc_post_kernel: the same bits. Grid: x over D / 4,
// y over tokens (strided past 65,535).
__global__ void hc_post4_kernel(float* state, const float* y, const float* y2, const float* post, const float* comb,
                                int64_t D, int64_t n, bool round_bf16) {
  pdl_enter();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (4 * c >= D) return;
  for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
    float* X = state + t * 4 * D + 4 * c;
    float4 xi[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) xi[k] = *reinterpret_cast<const float4*>(X + k * D);
    float4 yv = *reinterpret_cast<const float4*>(y + t * D + 4 * c);
    if (y2) {  // HcPostOp::y2: y + y2, the addition AddOp made
      const float4 v2 = *reinterpret_cast<const float4*>(y2 + t * D + 4 * c);
      yv = make_float4(__fadd_rn(yv.x, v2.x), __fadd_rn(yv.y, v2.y), __fadd_rn(yv.z, v2.z), __fadd_rn(yv.w, v2.w));
    }
    const float* po = post + t * 4;
    const float* co = comb + t * 16;
    float pj[4], cm[16];
#pragma unroll
    for (int j = 0; j < 4; ++j) pj[j] = po[j];
#pragma unroll
    for (int k = 0; k < 16; ++k) cm[k] = co[k];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float4 s =
          make_float4(__fmul_rn(pj[j], yv.x), __fmul_rn(pj[j], yv.y), __fmul_rn(pj[j], yv.z), __fmul_rn(pj[j], yv.w));
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s.x = __fadd_rn(s.x, __fmul_rn(cm[k * 4 + j], xi[k].x));
        s.y = __fadd_rn(s.y, __fmul_rn(cm[k * 4 + j], xi[k].y));
        s.z = __fadd_rn(s.z, __fmul_rn(cm[k * 4 + j], xi[k].z));
        s.w = __fadd_rn(s.w, __fmul_rn(cm[k * 4 + j], xi[k].w));
      }
      if (round_bf16)
        s = make_float4(bf16_round_dev(s.x), bf16_round_dev(s.y), bf16_round_dev(s.z), bf16_round_dev(s.w));
      *reinterpret_cast<float4*>(X + j * D) = s;
    }
  }
}

// Runs the partial kernel for n tokens and returns the number of slices; the
// partials land in ctx scratch: [n][S][n_mix] floats, then [n][S] doubles.
int run_mix_partials(const CudaContext& ctx, const Tensor& state, const Tensor& fn, int n_mix, float** part_dot,
                     double** part_ss) {
  const int64_t D = state.ne[0], hc = state.ne[1], n = state.ne[2];
  const int64_t len = hc * D;
  DSV4_ASSERT(fn.type == GgmlType::F32 || fn.type == GgmlType::F16 || fn.type == GgmlType::BF16,
              "hc: mix weights of type %s (F32, F16 or BF16)", ggml_type_name(fn.type));
  DSV4_ASSERT(reinterpret_cast<uintptr_t>(state.data) % 16 == 0, "hc: state not 16-byte aligned");
  DSV4_ASSERT(len % 8 == 0, "hc: state width %lld (a multiple of 8)", static_cast<long long>(len));
  const int S = static_cast<int>((len + k_mix_slice - 1) / k_mix_slice);
  // The kernel by batch size (the results do not depend on the choice).
  const bool lanes = n >= k_mix_lanes_min && (n_mix == 24 || n_mix == 8);
  const bool tokens = !lanes && n > k_mix_tokens_min;
  const int64_t warps = tokens ? S * ((n + k_mix_tt - 1) / k_mix_tt) : n * S * ((n_mix + k_mix_pre - 1) / k_mix_pre);
  DSV4_ASSERT(S <= 65535 && warps / 4 < 0x7fffffff, "hc: state of %lld x %lld too large", static_cast<long long>(n),
              static_cast<long long>(len));
  const size_t dot_bytes = (static_cast<size_t>(n) * S * n_mix * sizeof(float) + 255) / 256 * 256;
  auto* base =
      static_cast<uint8_t*>(ctx.scratch->get(dot_bytes + static_cast<size_t>(n) * S * sizeof(double), ctx.stream));
  *part_dot = reinterpret_cast<float*>(base);
  *part_ss = reinterpret_cast<double*>(base + dot_bytes);
  auto go = [&](auto kernel) {
    launch_kernel(kernel, ceil_div(warps, 4), 128, 0, ctx.stream, state.f32(), n, len,
                  static_cast<const uint8_t*>(fn.data), fn.row_bytes(), n_mix, S, *part_dot, *part_ss, ctx.tables);
    CUDA_CHECK_LAUNCH();
  };
  auto go_type = [&](auto type_tag) {
    constexpr GgmlType T = decltype(type_tag)::value;
    if (lanes) {
      const dim3 grid(static_cast<unsigned>(ceil_div(n, int64_t{k_mix_lanes_tokens})), static_cast<unsigned>(S));
      auto go_lanes = [&](auto nm_tag) {
        constexpr int NM = decltype(nm_tag)::value;
        auto* kernel = hc_mix_partial_lanes_kernel<T, NM>;
        allow_smem(kernel, mix_lanes_smem<NM>());
        launch_kernel(kernel, grid, k_mix_lanes_threads, mix_lanes_smem<NM>(), ctx.stream, state.f32(), n, len,
                      static_cast<const uint8_t*>(fn.data), fn.row_bytes(), S, *part_dot, *part_ss, ctx.tables);
        CUDA_CHECK_LAUNCH();
      };
      if (n_mix == 24)
        go_lanes(std::integral_constant<int, 24>{});
      else
        go_lanes(std::integral_constant<int, 8>{});
    } else if (tokens)
      go(hc_mix_partial_tokens_kernel<T>);
    else
      go(hc_mix_partial_kernel<T>);
  };
  if (fn.type == GgmlType::F32)
    go_type(std::integral_constant<GgmlType, GgmlType::F32>{});
  else if (fn.type == GgmlType::F16)
    go_type(std::integral_constant<GgmlType, GgmlType::F16>{});
  else
    go_type(std::integral_constant<GgmlType, GgmlType::BF16>{});
  return S;
}

}  // namespace

void launch_embed(const CudaContext& ctx, const EmbedOp& op) {
  const int64_t n = op.ids.ne[0], hc = op.out.ne[1], D = op.out.ne[0];
  DSV4_ASSERT(op.table.ne[0] == D, "embed: width mismatch");
  DSV4_ASSERT(op.out.ne[2] >= n, "embed: output holds fewer tokens than ids");
  if (n == 0) return;
  dispatch_weight_type(op.table.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    DSV4_ASSERT(D % WeightUnit<T>::U == 0, "embed: width %lld", static_cast<long long>(D));
    launch_kernel(embed_kernel<T>, static_cast<unsigned>(n), 128, 0, ctx.stream, op.out.f32(),
                  static_cast<const uint8_t*>(op.table.data), op.table.row_bytes(), op.table.n_rows(), op.ids.i32(), hc,
                  D, ctx.tables);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_hc_pre(const CudaContext& ctx, const HcPreOp& op) {
  const int64_t D = op.state.ne[0], hc = op.state.ne[1], n = op.state.ne[2];
  const int n_mix = static_cast<int>((2 + hc) * hc);
  DSV4_ASSERT(hc >= 1 && hc <= k_max_hc, "hc_pre: %lld streams (at most %d)", static_cast<long long>(hc), k_max_hc);
  DSV4_ASSERT(op.fn.ne[0] == hc * D && op.fn.ne[1] == n_mix, "hc_pre: fn shape");
  DSV4_ASSERT(!op.norm_out || (op.norm_out.ne[0] == D && op.norm_out.n_rows() >= n), "hc_pre: norm output shape");
  DSV4_ASSERT(!op.norm_w || op.norm_w.ne[0] == D, "hc_pre: norm weight length");
  const bool quant = op.norm_out && op.norm_quant != ActQuant::NONE;
  DSV4_ASSERT(!quant || (op.norm_q.ne[0] == D && op.norm_q.n_rows() >= n), "hc_pre: quantised norm output shape");
  if (n == 0) return;
  // INT8_32 inside the finalize's norm (rows its 256 threads hold in registers): in the loop kernel (larger
  // batches) whenever quantisation is fused (ctx.fuse_act_quant), in the register kernel (decode) only with
  // every norm's quantiser fused (ctx.fuse_act_quant_norms: slower at decode); otherwise an act_quant launch
  // after it.
  const bool loop = n > k_finalize_tr_min;
  float* xq8 = quant && op.norm_quant == ActQuant::INT8_32 && (loop ? ctx.fuse_act_quant : ctx.fuse_act_quant_norms) &&
                       D <= k_norm_reg * 256
                   ? op.norm_q.f32()
                   : nullptr;
  float* part_dot;
  double* part_ss;
  const int S = run_mix_partials(ctx, op.state, op.fn, n_mix, &part_dot, &part_ss);
  const size_t smem = finalize_smem(S, n_mix);
  auto go = [&](auto kernel) {
    allow_smem(kernel, smem);
    launch_kernel(kernel, static_cast<unsigned>(n), 256, smem, ctx.stream, op.state.f32(), D, static_cast<int>(hc), S,
                  part_dot, part_ss, op.scale.f32(), op.base.f32(), op.norm_eps, op.hc_eps, op.sinkhorn_iters,
                  op.u.f32(), op.post.f32(), op.comb.f32(), op.norm_out ? op.norm_out.f32() : nullptr,
                  op.norm_w ? op.norm_w.f32() : nullptr, op.norm_rms_eps, xq8);
  };
  // The same bits either way (combine_mix; u and the norm per column).
  if (loop)
    go(hc_pre_finalize_loop_kernel);
  else
    go(hc_pre_finalize_kernel);
  CUDA_CHECK_LAUNCH();
  if (quant && !xq8) launch_act_quant(ctx.stream, op.norm_q.f32(), op.norm_out.f32(), D, n, op.norm_quant);
}

void launch_hc_head(const CudaContext& ctx, const HcHeadOp& op) {
  const int64_t D = op.state.ne[0], hc = op.state.ne[1], n = op.state.ne[2];
  DSV4_ASSERT(hc >= 1 && hc <= k_max_hc, "hc_head: %lld streams (at most %d)", static_cast<long long>(hc), k_max_hc);
  DSV4_ASSERT(op.fn.ne[0] == hc * D && op.fn.ne[1] == hc, "hc_head: fn shape");
  if (n == 0) return;
  float* part_dot;
  double* part_ss;
  const int S = run_mix_partials(ctx, op.state, op.fn, static_cast<int>(hc), &part_dot, &part_ss);
  const size_t smem = finalize_smem(S, static_cast<int>(hc));
  auto go = [&](auto kernel) {
    allow_smem(kernel, smem);
    launch_kernel(kernel, static_cast<unsigned>(n), 256, smem, ctx.stream, op.state.f32(), D, static_cast<int>(hc), S,
                  part_dot, part_ss, op.scale.f32(), op.base.f32(), op.norm_eps, op.hc_eps, op.h.f32());
  };
  if (n > k_finalize_tr_min)
    go(hc_head_finalize_kernel<true>);
  else
    go(hc_head_finalize_kernel<false>);
  CUDA_CHECK_LAUNCH();
}

void launch_hc_post(const CudaContext& ctx, const HcPostOp& op) {
  const int64_t D = op.state.ne[0], hc = op.state.ne[1], n = op.state.ne[2];
  DSV4_ASSERT(hc >= 1 && hc <= k_max_hc, "hc_post: %lld streams (at most %d)", static_cast<long long>(hc), k_max_hc);
  const int64_t total = n * D;
  if (total == 0) return;
  DSV4_ASSERT(!op.y2 || (op.y2.ne[0] == D && op.y2.n_rows() >= n), "hc_post: y2 shape");
  const float* y2 = op.y2 ? op.y2.f32() : nullptr;
  const bool aligned = reinterpret_cast<uintptr_t>(op.state.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(op.y.data) % 16 == 0 && reinterpret_cast<uintptr_t>(y2) % 16 == 0;
  if (hc == 4 && D % 4 == 0 && aligned) {
    const int64_t quads = D / 4;
    const unsigned threads = quads >= 256 ? 256 : 128;
    const dim3 grid(static_cast<unsigned>((quads + threads - 1) / threads),
                    static_cast<unsigned>(std::min<int64_t>(n, 65535)));
    launch_kernel(hc_post4_kernel, grid, threads, 0, ctx.stream, op.state.f32(), op.y.f32(), y2, op.post.f32(),
                  op.comb.f32(), D, n, op.round_bf16);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65536));
  launch_kernel(hc_post_kernel, blocks, 256, 0, ctx.stream, op.state.f32(), op.y.f32(), y2, op.post.f32(),
                op.comb.f32(), D, static_cast<int>(hc), n, op.round_bf16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
