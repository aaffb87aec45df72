// Matmul: out[t, r] = sum_c W[r, c] x[t, g(r)*cols + c] (accumulate: out[t, r] +=) for any weight type
// (F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS, MXFP4), optionally grouped (block-
// diagonal W: row r belongs to group g = r / (rows / G)).
//
// Layout: W [rows, cols] in its GGUF block layout (row r at r * row_bytes),
// x [n, cols * G] f32, out [n, rows] f32.
//
// The matvec and the FFMA tile share one summation order: they give every output
// element exactly the same float operations, so with them results do not depend
// on the batch size (a chunked prefill, a whole prefill and token-by-token
// decoding agree bitwise); the tensor-core tile trades that for speed:
//   per lane l: units u = l, l+32, ... (cuda_quant.cuh), elements in order,
//   acc = fma(w, x, acc); then the warp tree sum (16, 8, 4, 2, 1).
//
// * matvec (n == 1, decode): memory-bound. One warp per R weight rows (R = 4,
//   2 or 1: the largest that still gives every SM a block), 8 warps per
//   256-thread block; the warp streams 32 units per row per step (one per lane) with
//   coalesced 16-byte loads — straight into registers for F32/F16/BF16 (16 / R
//   units per lane in flight) and Q4_K, through a per-warp ring of S
//   shared-memory chunks (cp.async, the next S - 1 chunks in flight while this
//   one is decoded; S per shape, launch_matvec_r) for Q8_0/Q2_K/MXFP4 (16-byte)
//   and IQ2_XXS (8-byte), whose blocks are not 16-byte aligned — and decodes in
//   registers. MatmulsOp (several matrices of one type and width, one x): one
//   launch whose blocks are split between the matrices (MvSet). x: the block first copies its
//   group's x into shared memory, units padded to U + 4 floats (XShared of
//   cuda_quant.cuh; overlapping the first weight loads), when that fits in 64 KiB
//   and the block's rows share one group — read from global memory, a lane's
//   32-float unit is 128 bytes away from its neighbour's and the Q8_0 matvecs
//   were L1-bound at ~1.3 TB/s. Grid: ceil(rows / 8R) blocks.
// * int8 matvec (n == 1, Q8_0 weights, x an INT8_32 activation quantiser's
//   output: MatmulOp::x_quant, `fast` numerics; CudaContext::int8_matvec): the
//   same warps, rows and staged ring, x copied as int8 codes and per-unit
//   scales and every unit's dot product as 8 dp4a (matvec_i8_kernel below).
//   MatmulOp::x_quantise (x not yet quantised: wo_b's input): the same kernel
//   quantises x while it stages it; other kernels read x after an act_quant
//   launch in place.
// * token matvec (2 <= n <= 4; Q8_0 rows of whole 8-unit chunks, F32/F16/BF16:
//   a verify pass of k <= 3, a small batched decode step; matvec_tokens_kernel): the
//   matvec's warps (Q8_0: and staged ring) with each weight applied to every token's x, so
//   the weights are read once and every token's outputs are bitwise the
//   single-token matvec's (tensor cores on or off). MatmulsOp sets too.
// * tensor cores (n > 1, Q8_0/Q2_K/Q4_K/IQ2_XXS/MXFP4, and F16 with rows of whole
//   32-element units; CudaBackendOptions::tensor_cores,
//   the default): x split once into f16 hi/lo (mma_split_x), then mma_tile of
//   cuda_mma.cuh, 256 rows x BN tokens per block: BN = 8/16/32, the one block
//   that holds a batch of <= 32 tokens (a batched decode step reads each weight
//   once), else 32 (16, 8 when that leaves SMs idle). When the grid gives the
//   SMs fewer than two blocks each, the units of a row are cut into K slices
//   (whole chunks of 8 units, at most 16) whose partial sums a second kernel
//   adds in slice order. Within ~1e-13 NMSE of the f32 dot products, but not
//   bitwise equal to the matvec. Grid: (ceil(rows_per_group / 256), G,
//   ceil(n / BN) x slices).
// * tiled FFMA (n > 1: the other weight types, tensor cores off, or batches of at
//   most CudaContext::ffma_max_tokens tokens): weight_tile
//   of cuda_tile.cuh, 32 rows x 8 tokens per 256-thread block, x staged in shared
//   memory; each decoded weight unit is reused for 8 tokens. Same summation
//   order as the matvec (bitwise batch-invariant).
//   Grid: (ceil(rows_per_group / 32), G, ceil(n / 8)).
//
// Also: dequantize_rows (one block per row, units decoded to f32), used for
// small weights other kernels want as plain floats (the compressor's APE).
//
// CPU reference: cpu::matmul (src/backend/cpu/cpu_dense.cpp), quant::dequantize_row.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/cuda_dense.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_mma_tile.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/cuda_tile.cuh"

namespace dsv4::cuda {

namespace {

constexpr int k_mv_warps = 8;  // rows per matvec block

// The matrices of one matvec launch: one (grouped or not) matrix, or up to
// MatmulsOp::k_max ungrouped ones of one type and width that read the same x
// (MatmulsOp); blocks [first[i], first[i + 1]) compute matrix i.
struct MvSet {
  const uint8_t* w[MatmulsOp::k_max];
  float* out[MatmulsOp::k_max];
  int64_t rows[MatmulsOp::k_max];
  unsigned first[MatmulsOp::k_max + 1];
  int count;
};

// This block's matrix of the set, selected with constant indices only (a
// run-time index into the parameter arrays would copy them to local memory).
struct MvMatrix {
  const uint8_t* w;
  float* out;
  int64_t rows;
  unsigned first;  // its first block
};
__device__ __forceinline__ MvMatrix mv_matrix(const MvSet& set) {
  MvMatrix m{set.w[0], set.out[0], set.rows[0], 0};
#pragma unroll
  for (int i = 1; i < MatmulsOp::k_max; ++i)
    if (i < set.count && blockIdx.x >= set.first[i]) m = {set.w[i], set.out[i], set.rows[i], set.first[i]};
  return m;
}

// A warp's R row pointers from row r0 (rows past the matrix repeat row r0, so
// that every lane runs the same code); returns how many are real.
template <int R>
__device__ __forceinline__ int mv_warp_rows(const uint8_t* w, int64_t r0, int64_t rows, size_t row_bytes,
                                            const uint8_t* (&rp)[R]) {
  const int nr = static_cast<int>(rows - r0 < R ? rows - r0 : R);
#pragma unroll
  for (int i = 0; i < R; ++i) rp[i] = w + (r0 + (i < nr ? i : 0)) * row_bytes;
  return nr;
}

// Host side of a set's launch with R rows per warp (k_mv_warps * R rows per
// block). mv_fills: R divides every matrix's rows (a single matrix: its rows
// per group, so a warp's rows share one group) and the blocks give every SM
// one. mv_layout: fills set.first and returns whether each block's rows share
// one x group (a set's matrices all read group 0: rows_per_group >= every
// matrix's rows).
bool mv_fills(const MvSet& set, int64_t rows_per_group, int64_t r, int64_t sms) {
  int64_t blocks = 0;
  for (int i = 0; i < set.count; ++i) {
    if ((set.count == 1 ? rows_per_group : set.rows[i]) % r != 0) return false;
    blocks += ceil_div(set.rows[i], k_mv_warps * r);
  }
  return blocks >= sms;
}
bool mv_layout(MvSet& set, int64_t rows_per_group, int r) {
  set.first[0] = 0;
  for (int i = 0; i < set.count; ++i) set.first[i + 1] = set.first[i] + ceil_div(set.rows[i], k_mv_warps * r);
  return set.count > 1 || rows_per_group == set.rows[0] || rows_per_group % (k_mv_warps * r) == 0;
}

template <GgmlType T, int R, int S, bool XS>
__global__ void __launch_bounds__(256)
    matvec_kernel(MvSet set, size_t row_bytes, int64_t rows_per_group, int64_t n_units, int64_t cols,
                  const float* __restrict__ x, bool acc, QuantTables tab) {
  // Dynamic shared memory: [x copy: x_shared_floats<U>(n_units) floats, XS][k_mv_warps x stage_bytes_per_warp<T, R,
  // S>()]
  extern __shared__ __align__(16) unsigned char mv_smem[];
  constexpr int U = WeightUnit<T>::U;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const size_t x_bytes = XS ? static_cast<size_t>(x_shared_floats<U>(n_units)) * sizeof(float) : 0;
  auto* stage =
      reinterpret_cast<typename UnitStaging<T>::Vec*>(mv_smem + x_bytes + warp * stage_bytes_per_warp<T, R, S>());
  const auto [w, out, rows, first] = mv_matrix(set);
  const int64_t r_blk = static_cast<int64_t>(blockIdx.x - first) * k_mv_warps * R;
  const int64_t r0 = r_blk + warp * R;
  // XS: every row of the block is in one group (the launcher checks); else the
  // warp's R rows share one group (rows_per_group % R == 0).
  const float* xr = x + ((XS ? r_blk : r0) / rows_per_group) * cols;
  QuantTables tb = tab;
  // The block prologue (x copy, IQ2_XXS grid), overlapping the first weight loads.
  auto prologue = [&] { matvec_block_prologue<T, XS>(reinterpret_cast<float*>(mv_smem), xr, n_units, tab, tb); };
  if (r0 >= rows) {  // whole warps only (the shuffles below need all 32 lanes); they still join the prologue
    prologue();
    return;
  }
  const uint8_t* rp[R];
  const int nr = mv_warp_rows(w, r0, rows, row_bytes, rp);
  float s[R];
  if constexpr (XS)
    warp_rows_dot<T, R, S>(rp, n_units, XShared{reinterpret_cast<const float*>(mv_smem)}, lane, tb, stage, s, prologue);
  else
    warp_rows_dot<T, R, S>(rp, n_units, XGlobal{xr}, lane, tb, stage, s, prologue);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (i < nr) out[r0 + i] = acc ? out[r0 + i] + s[i] : s[i];
}

// The int8 matvec (`fast` numerics): Q8_0 weights, x an INT8_32 activation
// quantiser's output, i.e. x_j = q_j s per 32-value unit with |q_j| <= 127
// (MatmulOp::x_quant). With the weight unit d c_j,
//   sum_j w_j x_j = (d s) sum_j c_j q_j,
// the inner sum exact in int32: 8 dp4a per unit where the float matvec decodes
// and multiplies 32 floats. The block recovers the codes from x itself
// (block_stage_x_i8, while its first weight loads are in flight):
// int8_codes_scale gives the quantiser's s from the unit's largest |x|
// (core/act_quant.h).
// A unit holding a non-finite value gets a NaN scale (its dot products are NaN).
// Per lane: units lane, lane + 32, ... of each row through the float matvec's
// staged ring, acc = fma(float(isum), d s, acc) (one rounding per unit),
// then warp_sum: a different summation order from the float matvec (the fast
// contract: within f32 rounding of the CPU's dot products).
// Shared memory: [unit u's 32 codes at k_x8_stride u bytes][n_units float
// scales][k_mv_warps x stage_bytes_per_warp<Q8_0, R, S>()]; 16-byte code loads
// at 48-byte strides hit 32 distinct banks in each quarter warp.
constexpr int k_x8_stride = 48;
__host__ __device__ constexpr size_t x8_shared_bytes(int64_t n_units) {
  return (static_cast<size_t>(n_units) * (k_x8_stride + sizeof(float)) + 15) / 16 * 16;
}

// dst = the int8 copy of x (n_units units of 32 floats, 16-byte aligned) in
// matvec_i8_kernel's layout: one thread per 4 values, 8 threads per unit (the
// unit's max by 3 shuffles); int8_codes_scale's scale s and codes (a zero
// unit: codes 0).
// quantise (MatmulOp::x_quantise: x is not yet quantised): the quantiser's own
// scale instead, act_int8_block_scale(max(amax, 1e-4)), and codes rint(x fl(1 / s)) (|code| <=
// 127: the unit of act_quant_row's INT8_32, whose product with the weights is
// then exactly the one of the quantised x above).
// One round of block_stage_x_i8: float4s i0 + b blockDim.x + threadIdx.x (b < NB) of the n4, their loads in
// flight together and their scale chains interleaved.
template <int NB>
__device__ __forceinline__ void stage_x_i8_round(unsigned char* dst, float* scale, const float* x, int64_t n4,
                                                 int64_t i0, bool quantise) {
  float4 v[NB];
  float m[NB];
  int finite[NB];
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const int64_t i = i0 + b * blockDim.x + threadIdx.x;
    v[b] = i < n4 ? reinterpret_cast<const float4*>(x)[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    finite[b] = isfinite(v[b].x) && isfinite(v[b].y) && isfinite(v[b].z) && isfinite(v[b].w);
    m[b] = fmaxf(fmaxf(fabsf(v[b].x), fabsf(v[b].y)), fmaxf(fabsf(v[b].z), fabsf(v[b].w)));
  }
#pragma unroll
  for (int o = 4; o > 0; o >>= 1)
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      m[b] = fmaxf(m[b], __shfl_xor_sync(k_full_mask, m[b], o));
      finite[b] &= __shfl_xor_sync(k_full_mask, finite[b], o);
    }
#pragma unroll
  for (int b = 0; b < NB; ++b) {
    const int64_t i = i0 + b * blockDim.x + threadIdx.x;
    if (i >= n4) continue;
    // The unit's scale: the quantiser's (quantising) or the one its codes come back with (a non-finite unit
    // gets the NaN scale below either way).
    const Int8Step sc = quantise ? act_int8_block_scale(fminf(fmaxf(m[b], 1e-4f), 3.0e38f)) : int8_codes_scale(m[b]);
    const float inv = sc.inv;
    // Quantising, the block's largest value may round to 128 at the lower of two scales: clamped (as
    // act_quant_row clamps); recovered codes are within +-127 already.
    auto code = [inv](float f) {
      return static_cast<uint32_t>(min(127, max(-127, __float2int_rn(__fmul_rn(f, inv)))));
    };
    const uint32_t q =
        (code(v[b].x) & 0xff) | (code(v[b].y) & 0xff) << 8 | (code(v[b].z) & 0xff) << 16 | code(v[b].w) << 24;
    const int64_t u = i >> 3;
    *reinterpret_cast<uint32_t*>(dst + u * k_x8_stride + (i & 7) * 4) = q;
    if ((i & 7) == 0) scale[u] = finite[b] ? sc.scale : __int_as_float(0x7fc00000);
  }
}

// Every thread of the block calls it (blockDim.x a multiple of 32); the caller synchronises. WIDE (x longer
// than one float4 per thread): a round takes four float4s per thread while more than two are left, two
// while more than one is (the slots past the end are masked) (wo_b's 8,192 values, 8 float4s per thread of a
// 256-thread block: 2 rounds of independent loads and scale chains instead of 8 dependent ones; the shared
// expert's down, 2,048 values: one round of two). Without WIDE one
// float4 per thread per round: the kernels for x of <= 4 blockDim.x values (q_b, the indexer's wq_b) keep
// that code alone — with the wide rounds compiled in and never taken they measured 3-4% slower (H200).
template <bool WIDE>
__device__ __forceinline__ void block_stage_x_i8(unsigned char* dst, const float* x, int64_t n_units, bool quantise) {
  auto* scale = reinterpret_cast<float*>(dst + n_units * k_x8_stride);
  const int64_t n4 = n_units * 8;  // whole units per 8 lanes: a lane group is all in or all out
  const int64_t bd = blockDim.x;
  for (int64_t i0 = 0; i0 < n4;) {
    if constexpr (WIDE) {
      if (n4 - i0 > 2 * bd) {
        stage_x_i8_round<4>(dst, scale, x, n4, i0, quantise);
        i0 += 4 * bd;
        continue;
      }
      if (n4 - i0 > bd) {
        stage_x_i8_round<2>(dst, scale, x, n4, i0, quantise);
        i0 += 2 * bd;
        continue;
      }
    }
    stage_x_i8_round<1>(dst, scale, x, n4, i0, quantise);
    i0 += bd;
  }
}

// sum_j c_j q_j of Q8_0 unit l of a 4-byte aligned staged chunk with the x
// codes xw (4 per word), and the unit's scale d.
__device__ __forceinline__ int q8_unit_dot_i8(const uint8_t* base, int l, const int (&xw)[8], float& d) {
  uint32_t c[8];
  WeightUnit<GgmlType::Q8_0>::unit_words(base, l, d, c);
  int s = 0;
#pragma unroll
  for (int m = 0; m < 8; ++m) s = __dp4a(static_cast<int>(c[m]), xw[m], s);
  return s;
}

// The int8 matvec; parameters as matvec_kernel's (tab unused), x always staged (XS); Q: x is quantised while
// staged (block_stage_x_i8's quantise).
template <int R, int S, bool Q>
__global__ void __launch_bounds__(256)
    matvec_i8_kernel(MvSet set, size_t row_bytes, int64_t rows_per_group, int64_t n_units, int64_t cols,
                     const float* __restrict__ x, bool acc, QuantTables) {
  constexpr GgmlType T = GgmlType::Q8_0;
  extern __shared__ __align__(16) unsigned char mv_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto* stage = reinterpret_cast<uint4*>(mv_smem + x8_shared_bytes(n_units) + warp * stage_bytes_per_warp<T, R, S>());
  const auto [w, out, rows, first] = mv_matrix(set);
  const int64_t r_blk = static_cast<int64_t>(blockIdx.x - first) * k_mv_warps * R;
  const int64_t r0 = r_blk + warp * R;
  const float* xr = x + (r_blk / rows_per_group) * cols;  // every row of the block is in one group (the launcher)
  auto prologue = [&] {
    pdl_enter();
    block_stage_x_i8<(S > 1)>(mv_smem, xr, n_units, Q);  // S = 1: x of <= 32 units (the launcher's depth)
    __syncthreads();
  };
  if (r0 >= rows) {  // whole warps only; they still join the prologue
    prologue();
    return;
  }
  const uint8_t* rp[R];
  const int nr = mv_warp_rows(w, r0, rows, row_bytes, rp);
  const auto* xscale = reinterpret_cast<const float*>(mv_smem + n_units * k_x8_stride);
  float a[R];
#pragma unroll
  for (int i = 0; i < R; ++i) a[i] = 0.0f;
  warp_rows_staged<T, R, S>(rp, n_units, lane, stage, prologue, [&](int64_t u, auto&& row_buf) {
    const auto* xc = reinterpret_cast<const int4*>(mv_smem + u * k_x8_stride);
    const int4 lo = xc[0], hi = xc[1];
    const int xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const float sx = xscale[u];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float d;
      const int s = q8_unit_dot_i8(row_buf(i), lane, xw, d);
      a[i] = fmaf(__int2float_rn(s), d * sx, a[i]);
    }
  });
#pragma unroll
  for (int i = 0; i < R; ++i) a[i] = warp_sum(a[i]);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (i < nr) out[r0 + i] = acc ? out[r0 + i] + a[i] : a[i];
}

// The token matvec: a batch of 2 <= nt <= NT tokens (a verify pass, a small
// batched decode step) against Q8_0 or 16-byte-unit (F32/F16/BF16) weights
// through the matvec's warps and rows, so each weight is read once for every
// token. Per row, token and lane the float matvec's summation order (units
// lane, lane + 32, ..., elements in order, acc = fma(w, x, acc), then
// warp_sum) and its weights: every output element is bitwise the one a
// single-token matvec of that token gives. Q8_0: through the staged ring; per
// unit and lane the R rows' scale and code words, then per word m the R x 4
// weights (word_floats, as decode_words). 16-byte units: 4 units of the R rows
// per lane in flight in registers (warp_rows_vec, as the single-token matvec). Each group of
// R x 4 weights is reused for every token's 4 x values (one 16-byte load from
// token t's XShared copy, or from global memory). Out: out[t * rows + r] (each
// matrix of the set its own rows). Tokens >= nt are skipped (a warp-uniform
// branch).
// Dynamic shared memory: [XS: nt x-copies of x_shared_floats<U>(n_units)
// floats][Q8_0: k_mv_warps x stage_bytes_per_warp<Q8_0, R, S>()].
template <GgmlType T>
constexpr bool token_matvec_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::F32 || T == GgmlType::F16 || T == GgmlType::BF16;
}
template <GgmlType T, int R, int S, bool XS, int NT>
__global__ void __launch_bounds__(256)
    matvec_tokens_kernel(MvSet set, size_t row_bytes, int64_t rows_per_group, int64_t n_units, int64_t cols,
                         const float* __restrict__ x, int64_t x_stride, int nt, bool acc) {
  constexpr int U = WeightUnit<T>::U;
  extern __shared__ __align__(16) unsigned char mv_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t xf = XS ? x_shared_floats<U>(n_units) : 0;  // floats of one token's copy
  const auto [w, out, rows, first] = mv_matrix(set);
  const int64_t r_blk = static_cast<int64_t>(blockIdx.x - first) * k_mv_warps * R;
  const int64_t r0 = r_blk + warp * R;
  // XS: every row of the block is in one group (the launcher checks); else the warp's R rows share one group.
  const float* xg = x + ((XS ? r_blk : r0) / rows_per_group) * cols;
  auto* xs = reinterpret_cast<float*>(mv_smem);
  auto prologue = [&] {
    pdl_enter();
    if constexpr (XS) {
      for (int t = 0; t < nt; ++t) block_stage_x<U>(xs + t * xf, xg + t * x_stride, n_units);
      __syncthreads();
    }
  };
  if (r0 >= rows) {  // whole warps only (the shuffles below need all 32 lanes); they still join the prologue
    prologue();
    return;
  }
  const uint8_t* rp[R];
  const int nr = mv_warp_rows(w, r0, rows, row_bytes, rp);
  float a[NT][R];
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int i = 0; i < R; ++i) a[t][i] = 0.0f;
  // a[t][i] += the weights w4[i][0..3] (elements e0 .. e0 + 3 of unit u of row i) times token t's x there.
  auto fma4 = [&](int64_t u, int e0, const float(&w4)[R][4]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (t >= nt) break;
      const float4 xv = XS ? *reinterpret_cast<const float4*>(xs + t * xf + u * (U + 4) + e0)
                           : ld(reinterpret_cast<const float4*>(xg + t * x_stride + u * U + e0));
#pragma unroll
      for (int i = 0; i < R; ++i) {
        a[t][i] = fmaf(w4[i][0], xv.x, a[t][i]);
        a[t][i] = fmaf(w4[i][1], xv.y, a[t][i]);
        a[t][i] = fmaf(w4[i][2], xv.z, a[t][i]);
        a[t][i] = fmaf(w4[i][3], xv.w, a[t][i]);
      }
    }
  };
  if constexpr (T == GgmlType::Q8_0) {
    auto* stage = reinterpret_cast<uint4*>(mv_smem + static_cast<size_t>(nt * xf) * sizeof(float) +
                                           warp * stage_bytes_per_warp<T, R, S>());
    warp_rows_staged<T, R, S>(rp, n_units, lane, stage, prologue, [&](int64_t u, auto&& row_buf) {
      float d[R];
      uint32_t q[R][8];
#pragma unroll
      for (int i = 0; i < R; ++i) WeightUnit<T>::unit_words(row_buf(i), lane, d[i], q[i]);
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        float wm[R][4];
#pragma unroll
        for (int i = 0; i < R; ++i) WeightUnit<T>::word_floats(d[i], q[i][m], wm[i]);
        fma4(u, 4 * m, wm);
      }
    });
  } else {
    warp_rows_vec<4, R>(rp, n_units, lane, prologue, [&](int64_t u, const uint4(&raw)[R]) {
      float wf[R][U];
#pragma unroll
      for (int i = 0; i < R; ++i) WeightUnit<T>::decode_vec(raw[i], wf[i]);
#pragma unroll
      for (int e0 = 0; e0 < U; e0 += 4) {
        float w4[R][4];
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) w4[i][j] = wf[i][e0 + j];
        fma4(u, e0, w4);
      }
    });
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t >= nt) break;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float v = warp_sum(a[t][i]);
      if (lane == 0 && i < nr) {
        float& o = out[t * rows + r0 + i];
        o = acc ? o + v : v;
      }
    }
  }
}

// Calls f(std::integral_constant<int, S>{}) for a staging depth S in 1..4
// (1..2 unless Deep: the instances that are launched).
template <bool Deep, class F>
void with_stages(int st, F&& f) {
  if (st <= 1)
    f(std::integral_constant<int, 1>{});
  else if (!Deep || st == 2)
    f(std::integral_constant<int, 2>{});
  else if constexpr (Deep) {
    if (st == 3)
      f(std::integral_constant<int, 3>{});
    else
      f(std::integral_constant<int, 4>{});
  }
}

// The matvec launch for one weight type: R rows per warp (more loads in flight,
// x reused) when the matrix still fills every SM with blocks; x copied to
// shared memory when the block's rows share one group and the copy fits;
// staged through S buffers per warp when the layout allows it:
//   Q8_0: S = the row's chunks (of 32 units) when they are <= 4 (the whole row
//   in flight at once), else 3; then fewer, down to 2, while the grid would not
//   be resident in one wave (shared memory per block grows with S). Q2_K,
//   IQ2_XXS, MXFP4 (experts; their matvec is used by small models and tests): 2, or
//   1 for rows of one chunk.
// Measured on the H200 (bench_cuda_ops, every R x S): Q8_0 4096x8192
// 17.2 -> 14.2 us (S = 3), 1024x4096 3.75 -> 3.11 and 512x4096 3.31 -> 2.79
// (S = 4), 32768x1024 14.4 -> 14.0 (S = 1: one chunk per row); 8192x4096 g8
// stays at S = 2 (12.6 us; S = 3 or 4 halves the blocks per SM: 15+ us).
// The int8 matvec (matvec_i8_kernel) instead when xq says x is an int8-32
// quantiser's output, the weights are Q8_0 and staged, ctx.int8_matvec, and
// the launch has at least k_i8_min_rows rows. Measured on the H200
// (bench_cuda_ops --filter x-int8, µs int8 / float): 32768x1024 11.14 / 14.16,
// 8192x1024 3.52 / 3.89, 4096x8192 14.25 / 14.43, 4096x2048 4.05 / 4.25,
// 2048+2048x4096 6.81 / 8.09; but 1024x4096 3.67 / 3.07 and 1024+512x4096
// 4.29 / 3.97: with few blocks the per-block x conversion is not amortised.
constexpr int64_t k_i8_min_rows = 4096;
// quantise_x (MatmulOp::x_quantise INT8_32, one matrix; x itself, xq INT8_32): the int8 kernel quantises x while
// staging it; any other kernel reads x after an act_quant launch in place.
template <GgmlType T, int R>
void launch_matvec_r(const CudaContext& ctx, MvSet set, size_t row_bytes, int64_t rows_per_group, int64_t n_units,
                     int64_t cols, const float* x, bool acc, ActQuant xq, float* quantise_x) {
  constexpr int U = WeightUnit<T>::U;
  const bool one_group = mv_layout(set, rows_per_group, R);
  const dim3 grid(set.first[set.count], 1);
  const size_t x_bytes = static_cast<size_t>(x_shared_floats<U>(n_units)) * sizeof(float);
  const bool xs = one_group && x_bytes <= k_max_x_shared_bytes;
  bool stageable = UnitStaging<T>::chunk_bytes > 0;
  for (int i = 0; i < set.count; ++i) stageable = stageable && can_stage<T>(set.w[i], row_bytes);
  int64_t total_rows = 0;
  for (int i = 0; i < set.count; ++i) total_rows += set.rows[i];
  const bool i8 = T == GgmlType::Q8_0 && xq == ActQuant::INT8_32 && ctx.int8_matvec && stageable && one_group &&
                  total_rows >= k_i8_min_rows && x8_shared_bytes(n_units) <= k_max_x_shared_bytes;
  if (quantise_x) {
    DSV4_ASSERT(set.count == 1 && xq == ActQuant::INT8_32 && quantise_x == x, "matvec: x quantised in place");
    if (!i8) launch_act_quant(ctx.stream, quantise_x, x, cols * (set.rows[0] / rows_per_group), 1, xq);
  }
  // kernel<T, R, S, xs> (or the int8 one) and its dynamic shared memory, for f(kernel, smem).
  auto with_kernel = [&](auto stages_tag, auto&& f) {
    constexpr int S = decltype(stages_tag)::value;
    const size_t stage = static_cast<size_t>(k_mv_warps) * stage_bytes_per_warp<T, R, S>();
    if constexpr (T == GgmlType::Q8_0 && S > 0)
      if (i8)
        return quantise_x ? f(matvec_i8_kernel<R, S, true>, x8_shared_bytes(n_units) + stage)
                          : f(matvec_i8_kernel<R, S, false>, x8_shared_bytes(n_units) + stage);
    if (xs)
      f(matvec_kernel<T, R, S, true>, x_bytes + stage);
    else
      f(matvec_kernel<T, R, S, false>, stage);
  };
  auto launch = [&](auto kernel, size_t smem) {
    allow_smem(kernel, smem, k_block_tables_smem);
    launch_kernel(kernel, grid, 256, smem, ctx.stream, set, row_bytes, rows_per_group, n_units, cols, x, acc,
                  ctx.tables);
  };
  if constexpr (UnitStaging<T>::chunk_bytes > 0) {
    if (stageable) {
      const int64_t chunks = ceil_div(n_units, 32);
      const int64_t sms = ctx.sm_count > 0 ? ctx.sm_count : 132;
      // Depths 3 and 4 (measured for Q8_0) only for Q8_0: fewer kernel instances.
      int st = chunks <= 4 ? static_cast<int>(chunks) : 3;
      if constexpr (T != GgmlType::Q8_0) st = chunks <= 1 ? 1 : 2;
      for (; st > 2; --st) {
        int per_sm = 0;
        with_stages<T == GgmlType::Q8_0>(st, [&](auto stages_tag) {
          with_kernel(stages_tag, [&](auto kernel, size_t smem) {
            allow_smem(kernel, smem, k_block_tables_smem);
            CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, smem));
          });
        });
        if (static_cast<int64_t>(per_sm) * sms >= static_cast<int64_t>(grid.x)) break;
      }
      with_stages<T == GgmlType::Q8_0>(st, [&](auto stages_tag) { with_kernel(stages_tag, launch); });
      return;
    }
  }
  with_kernel(std::integral_constant<int, 0>{}, launch);
}

// R: the largest of 4, 2, 1 that divides every matrix's rows (or rows per
// group) and still gives every SM a block.
template <GgmlType T>
void launch_matvec(const CudaContext& ctx, const MvSet& set, size_t row_bytes, int64_t rows_per_group, int64_t n_units,
                   int64_t cols, const float* x, bool acc, ActQuant xq, float* quantise_x = nullptr) {
  const int64_t sms = ctx.sm_count > 0 ? ctx.sm_count : 132;
  if (mv_fills(set, rows_per_group, 4, sms))
    launch_matvec_r<T, 4>(ctx, set, row_bytes, rows_per_group, n_units, cols, x, acc, xq, quantise_x);
  else if (mv_fills(set, rows_per_group, 2, sms))
    launch_matvec_r<T, 2>(ctx, set, row_bytes, rows_per_group, n_units, cols, x, acc, xq, quantise_x);
  else
    launch_matvec_r<T, 1>(ctx, set, row_bytes, rows_per_group, n_units, cols, x, acc, xq, quantise_x);
}

// The token matvec's launch (matvec_tokens_kernel) for a batch of 2 .. k_tokens_max tokens:
// NT = 2 or 4 (the smallest that holds n), R = 2 rows per warp when every
// matrix's rows (per group) are even and that still gives every SM a block,
// else 1; Q8_0: S = 2 staged chunks per warp; x copied to shared memory (n
// copies) when the block's rows share one group, else (rare: groups not
// aligned to blocks) read from global memory; either way each token's sums are
// the single-token matvec's. Returns false (nothing launched) when the copies
// and the ring (counted at R = 2) would pass k_max_token_smem (Hopper's 227 KiB
// a block; past 113 KiB one block per SM, as Flash's wo_b, x of 8,192 columns,
// from 3 tokens), when the weights cannot be staged (Q8_0) or are not 16-byte
// aligned, x is not, or ctx.token_matvec is off: the caller takes another
// kernel (longer x from global memory measured 2.6-3.4x slower than the tile).
// Measured on the H200 (bench_cuda_ops --filter matmul --n 3 [--no-token-matvec],
// µs token matvec / tensor-core tile): 32768x1024 21.4 / 25.3, 2048x4096 10.6 /
// 16.7, 4096x2048 7.7 / 16.5, 8192x4096 g8 25.3 / 30.1, the wq_a+wkv set 8.8 /
// 23.9, the shared gate+up set 11.6 / 33.3, the F16 compressor+indexer set
// 11.5 / 48.3; at n = 4 faster or within 5% (F16 64x4096 8.2 / 7.8). wo_b
// 4096x8192 with x from global memory: 80.7 / 30.4 at n = 3, 104.1 / 30.8 at
// n = 4 (x re-read through L1/L2 by every warp); with shared copies and one
// block per SM (H100): 34.1 / 30.8 at n = 3, 41.0 / 30.8 at n = 4 — kept for
// decode's sums in every row of a pass. At 6 tokens most shapes were slower
// than the tile (6x the FMAs and x loads per weight of the single-token
// matvec): k_tokens_max = 4.
constexpr int k_tokens_max = 4;
constexpr size_t k_max_token_smem = 227 * 1024;
template <GgmlType T>
bool launch_matvec_tokens(const CudaContext& ctx, MvSet set, size_t row_bytes, int64_t rows_per_group, int64_t n_units,
                          int64_t cols, const float* x, int64_t x_stride, int64_t n, bool acc) {
  static_assert(token_matvec_type<T>());
  constexpr int U = WeightUnit<T>::U;
  if (!ctx.token_matvec || n < 2 || n > k_tokens_max || reinterpret_cast<uintptr_t>(x) % 16 != 0 || x_stride % 4 != 0 ||
      cols % U != 0)
    return false;
  for (int i = 0; i < set.count; ++i) {
    if constexpr (T == GgmlType::Q8_0) {
      if (!can_stage<T>(set.w[i], row_bytes)) return false;
    } else if (reinterpret_cast<uintptr_t>(set.w[i]) % 16 != 0 || row_bytes % 16 != 0) {
      return false;
    }
  }
  const int R = mv_fills(set, rows_per_group, 2, ctx.sm_count > 0 ? ctx.sm_count : 132) ? 2 : 1;
  const bool one_group = mv_layout(set, rows_per_group, R);
  const size_t x_bytes = static_cast<size_t>(n * x_shared_floats<U>(n_units)) * sizeof(float);
  constexpr int S = T == GgmlType::Q8_0 ? 2 : 0;
  if (one_group && x_bytes + static_cast<size_t>(k_mv_warps) * stage_bytes_per_warp<T, 2, S>() > k_max_token_smem)
    return false;
  const bool xs = one_group;
  auto go = [&](auto r_tag, auto xs_tag, auto nt_tag) {
    constexpr int Rc = decltype(r_tag)::value, NT = decltype(nt_tag)::value;
    constexpr bool XS = decltype(xs_tag)::value;
    auto kernel = matvec_tokens_kernel<T, Rc, S, XS, NT>;
    const size_t smem = (XS ? x_bytes : 0) + static_cast<size_t>(k_mv_warps) * stage_bytes_per_warp<T, Rc, S>();
    allow_smem(kernel, smem);
    launch_kernel(kernel, dim3(set.first[set.count], 1), 256, smem, ctx.stream, set, row_bytes, rows_per_group, n_units,
                  cols, x, x_stride, static_cast<int>(n), acc);
  };
  auto with_nt = [&](auto r_tag, auto xs_tag) {
    if (n <= 2)
      go(r_tag, xs_tag, std::integral_constant<int, 2>{});
    else
      go(r_tag, xs_tag, std::integral_constant<int, 4>{});
  };
  auto with_xs = [&](auto r_tag) {
    if (xs)
      with_nt(r_tag, std::true_type{});
    else
      with_nt(r_tag, std::false_type{});
  };
  if (R == 2)
    with_xs(std::integral_constant<int, 2>{});
  else
    with_xs(std::integral_constant<int, 1>{});
  return true;
}

template <GgmlType T>
__global__ void __launch_bounds__(256)
    matmul_tile_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t rows_per_group,
                       int64_t n_units, int64_t cols, const float* __restrict__ x, int64_t x_stride, int64_t n,
                       bool x_vec4, float* __restrict__ out, bool acc, QuantTables tab) {
  pdl_enter();
  __shared__ TileSmem<T> sm;
  __shared__ const float* xrow[k_tile_tokens];
  const int warp = threadIdx.x >> 5;
  const int64_t g = blockIdx.y;
  const int64_t r0 = g * rows_per_group + static_cast<int64_t>(blockIdx.x) * k_tile_rows + warp * k_tile_rpw;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * k_tile_tokens;
  const int nt = static_cast<int>(n - t0 < k_tile_tokens ? n - t0 : k_tile_tokens);
  if (threadIdx.x < k_tile_tokens) xrow[threadIdx.x] = x + (t0 + threadIdx.x) * x_stride + g * cols;
  __syncthreads();
  weight_tile<T>(w, row_bytes, r0, (g + 1) * rows_per_group, n_units, cols, xrow, nt, x_vec4, sm, tab,
                 [&](int64_t r, int tt, float s) {
                   float& o = out[(t0 + tt) * rows + r];
                   o = acc ? o + s : s;
                 });
}

// The tensor-core tile (cuda_mma_tile.cuh): 256 rows x BN tokens per block; x split
// beforehand (mma_split_x, or mma_split_x_i8 for the int8 kind I8: token t = split row t,
// group g = units from g * n_units).
// Split K (part != nullptr): blockIdx.z = token block + token_blocks * slice; slice
// sp sums units [sp * slice_units, +slice_units) and stores part[sp][t][r]
// (matmul_slices_sum_kernel adds the slices); else out[t][r] (+)= the whole sum.
template <GgmlType T, int BN, bool I8>
__global__ void __launch_bounds__(256, 2)
    matmul_mma_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t rows_per_group,
                      int64_t n_units, MmaX xs, int64_t n, float* __restrict__ out, bool acc, int64_t slice_units,
                      float* __restrict__ part, QuantTables tab) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char mma_smem[];
  auto& sm = *reinterpret_cast<MmaSmem<BN, I8>*>(mma_smem);
  const int64_t g = blockIdx.y;
  const int64_t r0 = g * rows_per_group + static_cast<int64_t>(blockIdx.x) * k_mma_rows;
  const int64_t token_blocks = (n + BN - 1) / BN;
  const int64_t sp = blockIdx.z / token_blocks;
  const int64_t t0 = (blockIdx.z % token_blocks) * BN;
  const int64_t u_lo = sp * slice_units, u_hi = u_lo + slice_units < n_units ? u_lo + slice_units : n_units;
  const int nt = static_cast<int>(n - t0 < BN ? n - t0 : BN);
  if (threadIdx.x < BN) sm.xrow[threadIdx.x] = t0 + (static_cast<int>(threadIdx.x) < nt ? threadIdx.x : 0);
  const MmaTables st = mma_smem_tables(sm, tab);
  mma_tile<T, BN, I8>(w, row_bytes, r0, (g + 1) * rows_per_group, u_lo, u_hi, xs, g * n_units, sm, nt, st,
                      [&](int64_t r, int tt, float s) {
                        if (part) {
                          part[(sp * n + t0 + tt) * rows + r] = s;
                        } else {
                          float& o = out[(t0 + tt) * rows + r];
                          o = acc ? o + s : s;
                        }
                      });
}

// out[i] = (acc ? out[i] : 0) + (part[0][i] + part[1][i] + ... ), slices in order, i < total = n * rows.
__global__ void matmul_slices_sum_kernel(float* __restrict__ out, const float* __restrict__ part, int64_t total,
                                         int slices, bool acc) {
  pdl_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = part[i];
    for (int k = 1; k < slices; ++k) s = __fadd_rn(s, part[k * total + i]);
    out[i] = acc ? __fadd_rn(out[i], s) : s;
  }
}

// K slices of a tensor-core matmul: 1 while the (row block x token block) grid
// already gives every SM two blocks; else enough slices of whole staged chunks
// (k_mma_uc units) to get there, at most 16. A small-batch matmul (a batched
// decode step: 2..32 tokens) has few row blocks of 256 and each warp walks its
// rows' units one at a time, so without slices most SMs idle and the rest are
// latency-bound.
int64_t mma_slice_units(int64_t blocks, int64_t n_units, int64_t sms) {
  const int64_t chunks = (n_units + k_mma_uc - 1) / k_mma_uc;
  if (blocks >= 2 * sms || chunks < 2) return n_units;
  const int64_t slices = std::min<int64_t>({(2 * sms + blocks - 1) / blocks, chunks, 16});
  return (chunks + slices - 1) / slices * k_mma_uc;
}

template <GgmlType T, int BN, bool I8>
void launch_matmul_mma(const CudaContext& ctx, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t rows_per_group,
                       int groups, int64_t n_units, const MmaX& xs, int64_t n, float* out, bool acc,
                       int64_t slice_units, float* part) {
  const int64_t token_blocks = (n + BN - 1) / BN, slices = (n_units + slice_units - 1) / slice_units;
  DSV4_ASSERT(token_blocks * slices <= 65535, "matmul: batch of %lld tokens too large", static_cast<long long>(n));
  allow_smem(matmul_mma_kernel<T, BN, I8>, sizeof(MmaSmem<BN, I8>));
  launch_kernel(matmul_mma_kernel<T, BN, I8>,
                dim3(ceil_div(rows_per_group, k_mma_rows), static_cast<unsigned>(groups),
                     static_cast<unsigned>(token_blocks * slices)),
                256, sizeof(MmaSmem<BN, I8>), ctx.stream, w, row_bytes, rows, rows_per_group, n_units, xs, n, out, acc,
                slices > 1 ? slice_units : n_units, slices > 1 ? part : nullptr, ctx.tables);
  if (slices > 1) {
    CUDA_CHECK_LAUNCH();
    const int64_t total = n * rows;
    launch_kernel(matmul_slices_sum_kernel, static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 65536)), 256,
                  0, ctx.stream, out, part, total, static_cast<int>(slices), acc);
  }
}

template <GgmlType T>
__global__ void dequantize_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_units,
                                       float* __restrict__ dst, QuantTables tab) {
  pdl_enter();
  constexpr int U = WeightUnit<T>::U;
  const int64_t r = blockIdx.x;
  for (int64_t u = threadIdx.x; u < n_units; u += blockDim.x) {
    float v[U];
    WeightUnit<T>::decode(w + r * row_bytes, u, v, tab);
#pragma unroll
    for (int j = 0; j < U; ++j) dst[(r * n_units + u) * U + j] = v[j];
  }
}

}  // namespace

void launch_dequantize_rows(const CudaContext& ctx, const Tensor& w, float* dst) {
  const int64_t rows = w.n_rows();
  if (rows == 0) return;
  DSV4_ASSERT(rows <= 0x7fffffff, "dequantize_rows: too many rows");
  dispatch_weight_type(w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    constexpr int U = WeightUnit<T>::U;
    DSV4_ASSERT(w.ne[0] % U == 0, "dequantize_rows: %s row of %lld elements", ggml_type_name(T),
                static_cast<long long>(w.ne[0]));
    launch_kernel(dequantize_rows_kernel<T>, static_cast<unsigned>(rows), 128, 0, ctx.stream,
                  static_cast<const uint8_t*>(w.data), w.row_bytes(), w.ne[0] / U, dst, ctx.tables);
    CUDA_CHECK_LAUNCH();
  });
}

int weight_unit_elems(GgmlType t) {
  int u = 0;
  dispatch_weight_type(t, [&](auto tag) { u = WeightUnit<decltype(tag)::value>::U; });
  return u;
}

void launch_matmul(const CudaContext& ctx, const MatmulOp& in) {
  const int64_t cols = in.w.ne[0], rows = in.w.n_rows();
  const int64_t n = in.x.n_rows();
  const int groups = in.groups;
  DSV4_ASSERT(groups >= 1 && in.x.ne[0] == cols * groups, "matmul: input width %lld != %lld x %d",
              static_cast<long long>(in.x.ne[0]), static_cast<long long>(cols), groups);
  DSV4_ASSERT(in.out.ne[0] == rows && in.out.n_rows() == n, "matmul: output shape");
  DSV4_ASSERT(rows % groups == 0, "matmul: rows not divisible by groups");
  DSV4_ASSERT(in.x.type == GgmlType::F32 && in.out.type == GgmlType::F32, "matmul: activations must be F32");
  if (n == 0 || rows == 0) return;
  const int64_t rows_per_group = rows / groups;
  const int64_t x_stride = cols * groups;
  const bool x_aligned = reinterpret_cast<uintptr_t>(in.x.data) % 16 == 0 && cols % 4 == 0 && x_stride % 4 == 0;
  // MatmulOp::x_quantise: the product with x quantised (the x_quant promise from here on) — INT8_32 for one
  // token quantised by the int8 matvec while it stages x (launch_matvec_r, which falls back to the launch
  // below when that kernel does not apply), otherwise by an act_quant launch in place first.
  MatmulOp op = in;
  float* quantise_x = nullptr;
  if (in.x_quantise != ActQuant::NONE) {
    op.x_quant = in.x_quantise;
    op.x_quantise = ActQuant::NONE;
    if (in.x_quantise == ActQuant::INT8_32 && ctx.fuse_act_quant && n == 1 && x_aligned)
      quantise_x = op.x.f32();
    else
      launch_act_quant(ctx.stream, op.x.f32(), op.x.f32(), x_stride, n, in.x_quantise);
  }
  if (n > 1 && launch_matmul_gemm(ctx, op)) return;  // cuBLAS (cuda_gemm.cu) when it applies
  dispatch_weight_type(op.w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    constexpr int U = WeightUnit<T>::U;
    DSV4_ASSERT(cols % U == 0, "matmul: %s rows of %lld elements are not a multiple of %d", ggml_type_name(T),
                static_cast<long long>(cols), U);
    DSV4_ASSERT(reinterpret_cast<uintptr_t>(op.w.data) % 16 == 0, "matmul: weight not 16-byte aligned");
    const int64_t n_units = cols / U;
    const auto* w = static_cast<const uint8_t*>(op.w.data);
    const float* x = op.x.f32();
    float* out = op.out.f32();
    MvSet set{};
    set.w[0] = w;
    set.out[0] = out;
    set.rows[0] = rows;
    set.count = 1;
    // Launches the token matvec when it applies (n in 2 .. k_tokens_max; launch_matvec_tokens).
    auto token_matvec = [&] {
      if constexpr (token_matvec_type<T>())
        return x_aligned && launch_matvec_tokens<T>(ctx, set, op.w.row_bytes(), rows_per_group, n_units, cols, x,
                                                    x_stride, n, op.accumulate);
      return false;
    };
    if (n == 1 && x_aligned) {
      launch_matvec<T>(ctx, set, op.w.row_bytes(), rows_per_group, n_units, cols, x, op.accumulate, op.x_quant,
                       quantise_x);
    } else if (token_matvec()) {
      // (launched)
    } else if (mma_tile_type<T>() && ctx.tensor_cores && cols % 32 == 0 && n > ctx.ffma_max_tokens) {
      if constexpr (mma_tile_type<T>()) {
        // x split once (all groups), then tokens per block: 32, unless that leaves SMs idle (then 16, 8).
        // The tile walks units of 32 elements (F16: four of its 8-element decode units).
        // Batches of <= 32: the one token block that holds them all (each weight read once), the SMs filled by
        // K slices (mma_slice_units). Larger ones: 32 tokens per block, unless that leaves SMs idle (16, 8).
        const int64_t units = x_stride / 32, n_units32 = cols / 32;
        DSV4_ASSERT(x_stride % 32 == 0, "matmul: input width %lld", static_cast<long long>(x_stride));
        const int64_t sms = ctx.sm_count > 0 ? ctx.sm_count : 132;
        const int64_t row_blocks = static_cast<int64_t>(ceil_div(rows_per_group, k_mma_rows)) * groups;
        const int bn = n <= 8                                ? 8
                       : n <= 16                             ? 16
                       : n <= 32                             ? 32
                       : row_blocks * ceil_div(n, 32) >= sms ? 32
                       : row_blocks * ceil_div(n, 16) >= sms ? 16
                                                             : 8;
        const int64_t slice_units = mma_slice_units(row_blocks * ceil_div(n, bn), n_units32, sms);
        const int64_t slices = (n_units32 + slice_units - 1) / slice_units;
        const size_t split_bytes = (mma_split_bytes(n, units) + 15) / 16 * 16;
        const size_t part_bytes = slices > 1 ? static_cast<size_t>(slices * n * rows) * sizeof(float) : 0;
        auto* buf = static_cast<uint8_t*>(ctx.scratch->get(split_bytes + part_bytes, ctx.stream));
        float* part = reinterpret_cast<float*>(buf + split_bytes);
        const size_t rb = op.w.row_bytes();
        // x from an INT8_32 quantiser: the int8 kind (its codes split; mma_split_i8_bytes <= mma_split_bytes).
        auto run = [&](auto i8_tag) {
          constexpr bool I8 = decltype(i8_tag)::value;
          const MmaX xs = I8 ? mma_split_x_i8<T>(ctx.stream, x, x_stride, n, units, buf)
                             : mma_split_x<T>(ctx.stream, x, x_stride, n, units, buf);
          CUDA_CHECK_LAUNCH();
          if (bn == 32)
            launch_matmul_mma<T, 32, I8>(ctx, w, rb, rows, rows_per_group, groups, n_units32, xs, n, out, op.accumulate,
                                         slice_units, part);
          else if (bn == 16)
            launch_matmul_mma<T, 16, I8>(ctx, w, rb, rows, rows_per_group, groups, n_units32, xs, n, out, op.accumulate,
                                         slice_units, part);
          else
            launch_matmul_mma<T, 8, I8>(ctx, w, rb, rows, rows_per_group, groups, n_units32, xs, n, out, op.accumulate,
                                        slice_units, part);
        };
        bool i8 = false;
        if constexpr (mma_i8_type<T>()) {
          i8 = ctx.int8_tiles && op.x_quant == ActQuant::INT8_32;
          if (i8) run(std::true_type{});
        }
        if (!i8) run(std::false_type{});
      }
    } else {
      DSV4_ASSERT((n + k_tile_tokens - 1) / k_tile_tokens <= 65535, "matmul: batch of %lld tokens too large",
                  static_cast<long long>(n));
      launch_kernel(
          matmul_tile_kernel<T>,
          dim3(ceil_div(rows_per_group, k_tile_rows), static_cast<unsigned>(groups), ceil_div(n, k_tile_tokens)), 256,
          0, ctx.stream, w, op.w.row_bytes(), rows, rows_per_group, n_units, cols, x, x_stride, n, x_aligned, out,
          op.accumulate, ctx.tables);
    }
    CUDA_CHECK_LAUNCH();
  });
}

void launch_matmuls(const CudaContext& ctx, const MatmulsOp& op) {
  DSV4_ASSERT(op.count >= 0 && op.count <= MatmulsOp::k_max, "matmuls: %d matrices", op.count);
  if (op.count == 0) return;
  const int64_t cols = op.w[0].ne[0], n = op.x.n_rows();
  // One launch for the set when its matrices share type and width: a single token on the matvec, 2 ..
  // k_tokens_max on the token matvec where it applies; else (and for batches it refuses) separate launches.
  bool one = op.count > 1 && n <= k_tokens_max && op.x.type == GgmlType::F32 &&
             reinterpret_cast<uintptr_t>(op.x.data) % 16 == 0 && cols % 4 == 0 && op.x.ne[0] == cols;
  for (int i = 0; i < op.count && one; ++i)
    one = op.w[i].type == op.w[0].type && op.w[i].ne[0] == cols && op.w[i].row_bytes() == op.w[0].row_bytes() &&
          op.out[i].type == GgmlType::F32 && op.out[i].ne[0] == op.w[i].n_rows() && op.out[i].n_rows() == n &&
          reinterpret_cast<uintptr_t>(op.w[i].data) % 16 == 0;
  if (one) {
    MvSet set{};
    set.count = op.count;
    int64_t max_rows = 1;  // rows_per_group: any value >= every matrix's rows (x is read from row 0 of the one group)
    for (int i = 0; i < op.count; ++i) {
      set.w[i] = static_cast<const uint8_t*>(op.w[i].data);
      set.out[i] = op.out[i].f32();
      set.rows[i] = op.w[i].n_rows();
      max_rows = std::max(max_rows, set.rows[i]);
    }
    bool launched = false;
    dispatch_weight_type(op.w[0].type, [&](auto tag) {
      constexpr GgmlType T = decltype(tag)::value;
      constexpr int U = WeightUnit<T>::U;
      DSV4_ASSERT(cols % U == 0, "matmuls: %s rows of %lld elements are not a multiple of %d", ggml_type_name(T),
                  static_cast<long long>(cols), U);
      if (n == 1) {
        launch_matvec<T>(ctx, set, op.w[0].row_bytes(), max_rows, cols / U, cols, op.x.f32(), false, op.x_quant);
        launched = true;
      } else if constexpr (token_matvec_type<T>()) {
        launched = launch_matvec_tokens<T>(ctx, set, op.w[0].row_bytes(), max_rows, cols / U, cols, op.x.f32(), cols, n,
                                           false);
      }
    });
    if (launched) {
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  // Separate launches (batches, mixed types), each checked by launch_matmul.
  if (n > 1 && launch_matmuls_gemm(ctx, op)) return;  // batches on cuBLAS: x split once for all matrices
  for (int i = 0; i < op.count; ++i)
    launch_matmul(ctx, {.out = op.out[i], .w = op.w[i], .x = op.x, .x_quant = op.x_quant});
}

}  // namespace dsv4::cuda
