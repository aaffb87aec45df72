// Matmul: out[t, r] = sum_c W[r, c] x[t, g(r)*cols + c] for any weight type
// (F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS), optionally grouped (block-
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
//   coalesced 16-byte loads — straight into registers for F32/F16/BF16 (8 / R
//   units per lane in flight) and Q4_K, through per-warp double-buffered
//   shared-memory chunks (cp.async, the next chunk in flight while this one is
//   decoded) for Q8_0/Q2_K (16-byte) and IQ2_XXS (8-byte), whose blocks are not
//   16-byte aligned — and decodes in registers. x: the block first copies its
//   group's x into shared memory, units padded to U + 4 floats (XShared of
//   cuda_quant.cuh; overlapping the first weight loads), when that fits in 64 KiB
//   and the block's rows share one group — read from global memory, a lane's
//   32-float unit is 128 bytes away from its neighbour's and the Q8_0 matvecs
//   were L1-bound at ~1.3 TB/s. Grid: ceil(rows / 8R) blocks.
// * tensor cores (n > 1, Q8_0/Q2_K/Q4_K/IQ2_XXS, and F16 with rows of whole
//   32-element units; CudaBackendOptions::tensor_cores,
//   the default): x split once into f16 hi/lo (mma_split_x), then mma_tile of
//   cuda_mma.cuh, 256 rows x 32/16/8 tokens per block (the most tokens that still
//   give every SM a block). Within ~1e-13 NMSE of the f32 dot products, but not
//   bitwise equal to the matvec. Grid: (ceil(rows_per_group / 256), G, ceil(n / BN)).
// * tiled FFMA (n > 1: the other weight types, or tensor cores off): weight_tile
//   of cuda_tile.cuh, 32 rows x 8 tokens per 256-thread block, x staged in shared
//   memory; each decoded weight unit is reused for 8 tokens. Same summation
//   order as the matvec (bitwise batch-invariant).
//   Grid: (ceil(rows_per_group / 32), G, ceil(n / 8)).
//
// Also: dequantize_rows (one block per row, units decoded to f32), used for
// small weights other kernels want as plain floats (the compressor's APE).
//
// CPU reference: cpu::matmul (src/backend/cpu/cpu_dense.cpp), quant::dequantize_row.
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "backend/cuda/cuda_tile.cuh"

namespace dsv4::cuda {

namespace {

constexpr int k_mv_warps = 8;  // rows per matvec block

template <GgmlType T, int R, bool Staged, bool XS>
__global__ void __launch_bounds__(256) matvec_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows,
                                                     int64_t rows_per_group, int64_t n_units, int64_t cols,
                                                     const float* __restrict__ x, float* __restrict__ out,
                                                     QuantTables tab) {
  // Dynamic shared memory: [x copy: x_shared_floats<U>(n_units) floats, XS][k_mv_warps x stage_bytes_per_warp<T, R>(), Staged]
  extern __shared__ __align__(16) unsigned char mv_smem[];
  constexpr int U = WeightUnit<T>::U;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const size_t x_bytes = XS ? static_cast<size_t>(x_shared_floats<U>(n_units)) * sizeof(float) : 0;
  auto* stage = reinterpret_cast<typename UnitStaging<T>::Vec*>(mv_smem + x_bytes + (Staged ? warp * stage_bytes_per_warp<T, R>() : 0));
  const int64_t r_blk = static_cast<int64_t>(blockIdx.x) * k_mv_warps * R;
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
  const int nr = static_cast<int>(rows - r0 < R ? rows - r0 : R);
  const uint8_t* rp[R];
#pragma unroll
  for (int i = 0; i < R; ++i) rp[i] = w + (r0 + (i < nr ? i : 0)) * row_bytes;
  float s[R];
  if constexpr (XS)
    warp_rows_dot<T, R, Staged>(rp, n_units, XShared{reinterpret_cast<const float*>(mv_smem)}, lane, tb, stage, s, prologue);
  else
    warp_rows_dot<T, R, Staged>(rp, n_units, XGlobal{xr}, lane, tb, stage, s, prologue);
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < R; ++i)
      if (i < nr) out[r0 + i] = s[i];
}

// The matvec launch for one weight type: R rows per warp (more loads in flight,
// x reused) when the matrix still fills every SM with blocks; staged when the
// layout allows it; x copied to shared memory when the block's rows share one
// group and the copy fits.
template <GgmlType T, int R>
void launch_matvec_r(const CudaContext& ctx, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t rows_per_group,
                     int64_t n_units, int64_t cols, const float* x, float* out) {
  constexpr int U = WeightUnit<T>::U;
  const dim3 grid(ceil_div(rows, k_mv_warps * R), 1);
  const size_t x_bytes = static_cast<size_t>(x_shared_floats<U>(n_units)) * sizeof(float);
  const bool xs = (rows_per_group == rows || rows_per_group % (k_mv_warps * R) == 0) && x_bytes <= k_max_x_shared_bytes;
  auto run = [&](auto staged_tag, auto xs_tag) {
    constexpr bool Staged = decltype(staged_tag)::value, XS = decltype(xs_tag)::value;
    const size_t smem = (XS ? x_bytes : 0) + (Staged ? static_cast<size_t>(k_mv_warps) * stage_bytes_per_warp<T, R>() : 0);
    allow_smem(matvec_kernel<T, R, Staged, XS>, smem);
    launch_kernel(matvec_kernel<T, R, Staged, XS>, grid, 256, smem, ctx.stream, w, row_bytes, rows, rows_per_group, n_units, cols, x, out,
        ctx.tables);
  };
  using yes = std::true_type;
  using no = std::false_type;
  if constexpr (UnitStaging<T>::chunk_bytes > 0) {
    if (can_stage<T>(w, row_bytes)) {
      if (xs) run(yes{}, yes{});
      else run(yes{}, no{});
      return;
    }
  }
  if (xs) run(no{}, yes{});
  else run(no{}, no{});
}

template <GgmlType T>
void launch_matvec(const CudaContext& ctx, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t rows_per_group,
                   int64_t n_units, int64_t cols, const float* x, float* out) {
  const int64_t sms = ctx.sm_count > 0 ? ctx.sm_count : 132;
  auto fits = [&](int64_t r) { return rows_per_group % r == 0 && ceil_div(rows, k_mv_warps * r) >= sms; };
  if (fits(4)) launch_matvec_r<T, 4>(ctx, w, row_bytes, rows, rows_per_group, n_units, cols, x, out);
  else if (fits(2)) launch_matvec_r<T, 2>(ctx, w, row_bytes, rows, rows_per_group, n_units, cols, x, out);
  else launch_matvec_r<T, 1>(ctx, w, row_bytes, rows, rows_per_group, n_units, cols, x, out);
}

template <GgmlType T>
__global__ void __launch_bounds__(256) matmul_tile_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows,
                                                          int64_t rows_per_group, int64_t n_units, int64_t cols,
                                                          const float* __restrict__ x, int64_t x_stride, int64_t n,
                                                          bool x_vec4, float* __restrict__ out, QuantTables tab) {
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
                 [&](int64_t r, int tt, float s) { out[(t0 + tt) * rows + r] = s; });
}

// The tensor-core tile (cuda_mma.cuh): 256 rows x BN tokens per block; x split
// beforehand (mma_split_x: token t = split row t, group g = units from g * n_units).
template <GgmlType T, int BN>
__global__ void __launch_bounds__(256, 2) matmul_mma_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows,
                                                         int64_t rows_per_group, int64_t n_units, MmaX xs, int64_t n,
                                                         float* __restrict__ out, QuantTables tab) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char mma_smem[];
  auto& sm = *reinterpret_cast<MmaSmem<BN>*>(mma_smem);
  const int64_t g = blockIdx.y;
  const int64_t r0 = g * rows_per_group + static_cast<int64_t>(blockIdx.x) * k_mma_rows;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * BN;
  const int nt = static_cast<int>(n - t0 < BN ? n - t0 : BN);
  if (threadIdx.x < BN) sm.xrow[threadIdx.x] = t0 + (static_cast<int>(threadIdx.x) < nt ? threadIdx.x : 0);
  const MmaTables st = mma_smem_tables(sm, tab);
  mma_tile<T, BN>(w, row_bytes, r0, (g + 1) * rows_per_group, n_units, xs, g * n_units, sm, nt, st,
                  [&](int64_t r, int tt, float s) { out[(t0 + tt) * rows + r] = s; });
}

template <GgmlType T, int BN>
void launch_matmul_mma(const CudaContext& ctx, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t rows_per_group,
                       int groups, int64_t n_units, const MmaX& xs, int64_t n, float* out) {
  DSV4_ASSERT((n + BN - 1) / BN <= 65535, "matmul: batch of %lld tokens too large", static_cast<long long>(n));
  allow_smem(matmul_mma_kernel<T, BN>, sizeof(MmaSmem<BN>));
  launch_kernel(matmul_mma_kernel<T, BN>, dim3(ceil_div(rows_per_group, k_mma_rows), static_cast<unsigned>(groups), ceil_div(n, BN)), 256, sizeof(MmaSmem<BN>), ctx.stream, w, row_bytes, rows, rows_per_group, n_units, xs, n, out, ctx.tables);
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
    DSV4_ASSERT(w.ne[0] % U == 0, "dequantize_rows: %s row of %lld elements", ggml_type_name(T), static_cast<long long>(w.ne[0]));
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

void launch_matmul(const CudaContext& ctx, const MatmulOp& op) {
  const int64_t cols = op.w.ne[0], rows = op.w.n_rows();
  const int64_t n = op.x.n_rows();
  const int groups = op.groups;
  DSV4_ASSERT(groups >= 1 && op.x.ne[0] == cols * groups, "matmul: input width %lld != %lld x %d",
              static_cast<long long>(op.x.ne[0]), static_cast<long long>(cols), groups);
  DSV4_ASSERT(op.out.ne[0] == rows && op.out.n_rows() == n, "matmul: output shape");
  DSV4_ASSERT(rows % groups == 0, "matmul: rows not divisible by groups");
  DSV4_ASSERT(op.x.type == GgmlType::F32 && op.out.type == GgmlType::F32, "matmul: activations must be F32");
  if (n == 0 || rows == 0) return;
  const int64_t rows_per_group = rows / groups;
  const int64_t x_stride = cols * groups;
  const bool x_aligned = reinterpret_cast<uintptr_t>(op.x.data) % 16 == 0 && cols % 4 == 0 && x_stride % 4 == 0;
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
    if (n == 1 && x_aligned) {
      launch_matvec<T>(ctx, w, op.w.row_bytes(), rows, rows_per_group, n_units, cols, x, out);
    } else if (mma_tile_type<T>() && ctx.tensor_cores && cols % 32 == 0) {
      if constexpr (mma_tile_type<T>()) {
        // x split once (all groups), then tokens per block: 32, unless that leaves SMs idle (then 16, 8).
        // The tile walks units of 32 elements (F16: four of its 8-element decode units).
        const int64_t units = x_stride / 32, n_units32 = cols / 32;
        DSV4_ASSERT(x_stride % 32 == 0, "matmul: input width %lld", static_cast<long long>(x_stride));
        void* buf = ctx.scratch->get(mma_split_bytes(n, units), ctx.stream);
        const MmaX xs = mma_split_x<T>(ctx.stream, x, x_stride, n, units, buf);
        CUDA_CHECK_LAUNCH();
        const int64_t sms = ctx.sm_count > 0 ? ctx.sm_count : 132;
        const int64_t row_blocks = static_cast<int64_t>(ceil_div(rows_per_group, k_mma_rows)) * groups;
        const size_t rb = op.w.row_bytes();
        if (n > 16 && row_blocks * ceil_div(n, 32) >= sms)
          launch_matmul_mma<T, 32>(ctx, w, rb, rows, rows_per_group, groups, n_units32, xs, n, out);
        else if (n > 8 && row_blocks * ceil_div(n, 16) >= sms)
          launch_matmul_mma<T, 16>(ctx, w, rb, rows, rows_per_group, groups, n_units32, xs, n, out);
        else
          launch_matmul_mma<T, 8>(ctx, w, rb, rows, rows_per_group, groups, n_units32, xs, n, out);
      }
    } else {
      DSV4_ASSERT((n + k_tile_tokens - 1) / k_tile_tokens <= 65535, "matmul: batch of %lld tokens too large",
                  static_cast<long long>(n));
      launch_kernel(matmul_tile_kernel<T>, dim3(ceil_div(rows_per_group, k_tile_rows), static_cast<unsigned>(groups),
          ceil_div(n, k_tile_tokens)), 256, 0, ctx.stream, w, op.w.row_bytes(), rows, rows_per_group, n_units, cols, x,
          x_stride, n, x_aligned, out, ctx.tables);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dsv4::cuda
