// Matmul: out[t, r] = sum_c W[r, c] x[t, g(r)*cols + c] for any weight type
// (F32, F16, BF16, Q8_0, Q2_K, Q4_K, IQ2_XXS), optionally grouped (block-
// diagonal W: row r belongs to group g = r / (rows / G)).
//
// Layout: W [rows, cols] in its GGUF block layout (row r at r * row_bytes),
// x [n, cols * G] f32, out [n, rows] f32.
//
// Two kernels, one summation order. Both give every output element exactly
// the same float operations, so results do not depend on the batch size (a
// chunked prefill, a whole prefill and token-by-token decoding agree bitwise):
//   per lane l: units u = l, l+32, ... (cuda_quant.cuh), elements in order,
//   acc = fma(w, x, acc); then the warp tree sum (16, 8, 4, 2, 1).
//
// * matvec (n == 1, decode): memory-bound. One warp per weight row, 8 rows per
//   256-thread block; the warp streams 32 units per step (one per lane) with
//   coalesced 16-byte loads — straight into registers for F32/F16/BF16/Q4_K,
//   through a per-warp shared-memory chunk for Q8_0/Q2_K (16-byte) and IQ2_XXS
//   (8-byte), whose blocks are not 16-byte aligned — decodes in registers, and
//   reads x straight from global memory (16-byte loads, L1-resident).
//   Grid: ceil(rows / 8) blocks.
// * tiled (n > 1, prefill): each 256-thread block computes 32 rows (4 per
//   warp) x 8 tokens. x is staged per chunk of 32 units in shared memory
//   ([8][32][U+1] floats, the +1 pad keeps lanes on distinct banks); each
//   decoded weight unit is reused for 8 tokens and each staged x value for 4
//   rows. Plain FFMA, no tensor cores: correct and batch-invariant, about an
//   order of magnitude below a tensor-core GEMM (part 2 of issue #5).
//   Grid: (ceil(rows_per_group / 32), G, ceil(n / 8)).
//
// Also: dequantize_rows (one block per row, units decoded to f32), used for
// small weights other kernels want as plain floats (the compressor's APE).
//
// CPU reference: cpu::matmul (src/backend/cpu/cpu_dense.cpp), quant::dequantize_row.
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace dsv4::cuda {

namespace {

constexpr int k_mv_warps = 8;      // rows per matvec block
constexpr int k_tile_tokens = 8;   // tokens per tiled block
constexpr int k_tile_rpw = 4;      // rows per warp in the tiled kernel
constexpr int k_tile_rows = 8 * k_tile_rpw;

template <GgmlType T, bool Staged>
__global__ void __launch_bounds__(256) matvec_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows,
                                                     int64_t rows_per_group, int64_t n_units, int64_t cols,
                                                     const float* __restrict__ x, int64_t x_stride,
                                                     float* __restrict__ out, QuantTables tab) {
  __shared__ typename UnitStaging<T>::Vec stage[k_mv_warps][Staged ? stage_vecs<T>() : 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * k_mv_warps + warp;
  const int64_t t = blockIdx.y;
  if (r >= rows) return;  // whole warps only: the shuffles below need all 32 lanes
  const int64_t g = r / rows_per_group;
  const float* xr = x + t * x_stride + g * cols;
  float s;
  if constexpr (Staged) s = warp_row_dot_staged<T>(w + r * row_bytes, n_units, xr, lane, tab, stage[warp]);
  else s = warp_row_dot<T>(w + r * row_bytes, n_units, xr, lane, tab);
  if (lane == 0) out[t * rows + r] = s;
}

// The matvec launch for one weight type, staged when the layout allows it.
template <GgmlType T>
void launch_matvec(const CudaContext& ctx, const uint8_t* w, size_t row_bytes, int64_t rows, int64_t rows_per_group,
                   int64_t n_units, int64_t cols, const float* x, int64_t x_stride, float* out) {
  const dim3 grid(ceil_div(rows, k_mv_warps), 1);
  if constexpr (UnitStaging<T>::chunk_bytes > 0) {
    if (can_stage<T>(w, row_bytes)) {
      matvec_kernel<T, true><<<grid, 256, 0, ctx.stream>>>(w, row_bytes, rows, rows_per_group, n_units, cols, x, x_stride,
                                                           out, ctx.tables);
      return;
    }
  }
  matvec_kernel<T, false><<<grid, 256, 0, ctx.stream>>>(w, row_bytes, rows, rows_per_group, n_units, cols, x, x_stride, out,
                                                        ctx.tables);
}

template <GgmlType T>
__global__ void __launch_bounds__(256) matmul_tile_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows,
                                                          int64_t rows_per_group, int64_t n_units, int64_t cols,
                                                          const float* __restrict__ x, int64_t x_stride, int64_t n,
                                                          float* __restrict__ out, QuantTables tab) {
  constexpr int U = WeightUnit<T>::U;
  constexpr int UP = U + 1;
  constexpr int NT = k_tile_tokens, RW = k_tile_rpw;
  constexpr int CH = 32 * U;  // elements per chunk (one unit per lane)
  __shared__ float xs[NT][32 * UP];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t g = blockIdx.y;
  const int64_t g_end = (g + 1) * rows_per_group;
  const int64_t r0 = g * rows_per_group + static_cast<int64_t>(blockIdx.x) * k_tile_rows + warp * RW;
  const int64_t t0 = static_cast<int64_t>(blockIdx.z) * NT;
  const float* xg = x + g * cols;

  float acc[RW][NT];
#pragma unroll
  for (int a = 0; a < RW; ++a)
#pragma unroll
    for (int b = 0; b < NT; ++b) acc[a][b] = 0.0f;

  const int64_t n_chunks = (n_units + 31) / 32;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t e0 = c * CH;
    for (int i = threadIdx.x; i < NT * CH; i += blockDim.x) {
      const int tt = i / CH, e = i % CH;
      float v = 0.0f;
      if (t0 + tt < n && e0 + e < cols) v = xg[(t0 + tt) * x_stride + e0 + e];
      xs[tt][(e / U) * UP + e % U] = v;
    }
    __syncthreads();
    const int64_t u = c * 32 + lane;
    if (u < n_units) {
#pragma unroll
      for (int rr = 0; rr < RW; ++rr) {
        const int64_t r = r0 + rr;
        if (r < g_end) {
          float wv[U];
          WeightUnit<T>::decode(w + r * row_bytes, u, wv, tab);
#pragma unroll
          for (int tt = 0; tt < NT; ++tt) {
            const float* xp = &xs[tt][lane * UP];
#pragma unroll
            for (int j = 0; j < U; ++j) acc[rr][tt] = fmaf(wv[j], xp[j], acc[rr][tt]);
          }
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int rr = 0; rr < RW; ++rr)
#pragma unroll
    for (int tt = 0; tt < NT; ++tt) {
      const float s = warp_sum(acc[rr][tt]);
      const int64_t r = r0 + rr, t = t0 + tt;
      if (lane == 0 && r < g_end && t < n) out[t * rows + r] = s;
    }
}

template <GgmlType T>
__global__ void dequantize_rows_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t n_units,
                                       float* __restrict__ dst, QuantTables tab) {
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
    dequantize_rows_kernel<T><<<static_cast<unsigned>(rows), 128, 0, ctx.stream>>>(
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
      launch_matvec<T>(ctx, w, op.w.row_bytes(), rows, rows_per_group, n_units, cols, x, x_stride, out);
    } else {
      DSV4_ASSERT((n + k_tile_tokens - 1) / k_tile_tokens <= 65535, "matmul: batch of %lld tokens too large",
                  static_cast<long long>(n));
      matmul_tile_kernel<T><<<dim3(ceil_div(rows_per_group, k_tile_rows), static_cast<unsigned>(groups),
                                   ceil_div(n, k_tile_tokens)),
                              256, 0, ctx.stream>>>(w, op.w.row_bytes(), rows, rows_per_group, n_units, cols, x,
                                                    x_stride, n, out, ctx.tables);
    }
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace dsv4::cuda
