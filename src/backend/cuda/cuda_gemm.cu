// Prefill matmuls as one f16 tensor-core GEMM through cuBLAS.
//
//   out[t, r] (+)= sum_c W[r, c] x[t, g(r) cols + c]      W [rows, cols] block-quantised or F16, G groups
//
// Why: the hand-written tensor-core tile (cuda_mma.cuh) applies each 32-element
// unit's scale in f32 after two MMAs, so it issues ~12 instructions per MMA and
// runs the Flash prefill matmuls at ~70 TFLOP/s (bench_cuda_ops --n 2048, one
// H200). Decoded to plain numbers, W and x can go through cuBLAS's tensor-core
// GEMM, whose K loop is all MMAs.
//
// Exact splits. A decoded weight w (an f32 value, exactly quant::dequantize_row's)
// and an x value are each scaled by a power of two and split into two f16s:
//   per weight row r: e_r with max_c |W[r, c]| 2^e_r in [2^14, 2^15);  w' = w 2^e_r
//   per token t:      e_t with max_i |x[t, i]| 2^e_t in [2^14, 2^15);  x' = x 2^e_t
//   hi = f16(v'), lo = f16(v' - hi)     (v' - hi is exact in f32; v' = hi + lo to ~22 bits)
// The GEMM sums three products over K' = 3 cols, as
//   A'[r] = [w_hi | w_lo | w_hi],  B'[t, g] = [x_hi | x_hi | x_lo]
//   C[t, r] = sum_c (w_hi x_hi + w_lo x_hi + w_hi x_lo)     (w_lo x_lo, ~2^-22 relative, dropped)
// and the epilogue undoes the scales exactly: out = ldexp(C, -(e_r + e_t)) (+ out).
// When x is an activation quantiser's output (MatmulOp::x_quant, `fast` numerics) x_lo is 0: the GEMM runs
// over the first two thirds only, K' = 2 cols (A' and B' keep their layout; lda/ldb stay 3 cols): one
// third fewer MMAs, the same sums.
// Accuracy: products within ~2^-21 of f32's. The tensor cores add into their
// f32 accumulators with truncation (round toward zero), a bias that grows
// with the length of the accumulation chain: one GEMM over K' = 12,288
// (Flash attn_output_a, 256 tokens) measured NMSE 4.4e-10 against the CPU, 2e-12
// at K' = 768. So K' is cut into S slices of at most k_gemm_slice (2,048) and
// the slices run as S GEMMs in order, each adding its product into C with one
// correctly rounded f32 addition (cuBLAS's beta = 1): chains of <= 128 MMA
// steps. Results agree with the CPU's f32 dot products to k_thr_f32
// (test_cuda_ops), not bitwise with the matvec or the tile: the tensor-core
// contract of CudaBackendOptions::tensor_cores. Scaling per row and per token (not per
// 32-element unit, as the tile does) keeps values down to 2^-28 of their
// row's largest in normal f16; smaller ones lose bits gradually (f16
// subnormals), e.g. a unit 10^-9 of its row's largest value.
//
// Launch plan (one matmul):
//   1. gemm_split_w_kernel: one warp per weight row: decode the row twice (max,
//      then the scaled halves), A' [rows, 3 cols] f16 and e_r.
//   2. gemm_split_x_kernel: one block per token: B' [n, G, 3 cols] f16 and e_t.
//   3. Blas::gemm_tn_f16 per K' slice, batched over the G groups: C [n, rows] f32.
//   4. gemm_scale_out_kernel: out[t, r] = ldexp(C[t, r], -(e_r + e_t)) (+ out).
// A MatmulsOp (several matrices reading one x: launch_matmuls_gemm) runs step 2
// once and steps 1, 3, 4 per matrix.
// Traffic beyond the GEMM: W once (+ 6 bytes per weight written, read by the
// GEMM), x (+ 6 bytes per value), C (8 bytes per output and slice). Worth it from about
// a hundred tokens (ctx.gemm_min_tokens, default 128: --gemm-min-tokens).
// With ctx.gemm_cache (GemmWeightCache, the default where memory allows:
// --no-gemm-weight-cache), step 1 runs once per weight: its A' and e_r are kept
// (a prefill batch's gemm_split_w was 4.9% of its kernel time; ncu, H200).
//
// CPU reference: cpu::matmul (quant::dequantize_row + f32 dot products).
#include "backend/cuda/cuda_gemm.cuh"

#include <algorithm>
#include <climits>

#include "backend/cuda/cuda_blas.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "core/log.h"

namespace dsv4::cuda {

namespace {

template <GgmlType T>
constexpr bool gemm_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::Q2_K || T == GgmlType::Q4_K || T == GgmlType::IQ2_XXS ||
         T == GgmlType::F16;
}

// One warp per weight row r (8 rows per 256-thread block): lanes take units
// u = lane, lane + 32, ...; pass 1 finds the row's largest magnitude, pass 2
// decodes again and writes A'[r] = [hi | lo | hi] (16-byte stores) and e_r.
template <GgmlType T>
__global__ void __launch_bounds__(256)
    gemm_split_w_kernel(const uint8_t* __restrict__ w, size_t row_bytes, int64_t rows, int64_t n_units,
                        __half* __restrict__ a, int* __restrict__ row_exp, QuantTables tab) {
  pdl_enter();
  constexpr int U = WeightUnit<T>::U;
  static_assert(U % 8 == 0, "units of whole 16-byte f16 groups");
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (r >= rows) return;
  const uint8_t* row = w + r * static_cast<int64_t>(row_bytes);
  float m = 0.0f;
  for (int64_t u = lane; u < n_units; u += 32) {
    float v[U];
    WeightUnit<T>::decode(row, u, v, tab);
#pragma unroll
    for (int j = 0; j < U; ++j) m = fmaxf(m, fabsf(v[j]));
  }
  const int e = split_exponent(warp_max_all(m));
  if (lane == 0) row_exp[r] = e;
  const int64_t cols = n_units * U;
  uint4* hi0 = reinterpret_cast<uint4*>(a + r * 3 * cols);
  uint4* lo1 = reinterpret_cast<uint4*>(a + r * 3 * cols + cols);
  uint4* hi2 = reinterpret_cast<uint4*>(a + r * 3 * cols + 2 * cols);
  for (int64_t u = lane; u < n_units; u += 32) {
    float v[U];
    WeightUnit<T>::decode(row, u, v, tab);
#pragma unroll
    for (int q = 0; q < U / 8; ++q) {
      uint32_t h[4], l[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        __half h0, l0, h1, l1;
        split_f16(ldexpf(v[8 * q + 2 * p], e), h0, l0);
        split_f16(ldexpf(v[8 * q + 2 * p + 1], e), h1, l1);
        h[p] = half2_bits(h0, h1);
        l[p] = half2_bits(l0, l1);
      }
      const int64_t k = u * (U / 8) + q;
      hi0[k] = make_uint4(h[0], h[1], h[2], h[3]);
      lo1[k] = make_uint4(l[0], l[1], l[2], l[3]);
      hi2[k] = make_uint4(h[0], h[1], h[2], h[3]);
    }
  }
}

// One 256-thread block per token t: e_t over the whole row (all groups), then
// B'[t, g] = [hi | hi | lo] of x[t, g cols .. (g + 1) cols), two values per thread step.
__global__ void __launch_bounds__(256)
    gemm_split_x_kernel(const float* __restrict__ x, int64_t x_stride, int groups, int64_t cols, __half* __restrict__ b,
                        int* __restrict__ tok_exp) {
  pdl_enter();
  __shared__ float red[33];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * x_stride;
  const int64_t width = cols * groups;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
  const int e = split_exponent(block_max_nonneg(m, red));
  if (threadIdx.x == 0) tok_exp[t] = e;
  for (int g = 0; g < groups; ++g) {
    const float* xg = xr + static_cast<int64_t>(g) * cols;
    uint32_t* dst = reinterpret_cast<uint32_t*>(b + (t * groups + g) * 3 * cols);  // half pairs
    for (int64_t c = 2 * threadIdx.x; c < cols; c += 2 * blockDim.x) {
      __half h0, l0, h1, l1;
      split_f16(ldexpf(xg[c], e), h0, l0);
      split_f16(ldexpf(xg[c + 1], e), h1, l1);
      const uint32_t h = half2_bits(h0, h1);
      dst[c / 2] = h;
      dst[(cols + c) / 2] = h;
      dst[(2 * cols + c) / 2] = half2_bits(l0, l1);
    }
  }
}

// out[t, r] = ldexp(C[t, r], -(e_r + e_t)) (+ out[t, r]); grid (rows / (256 V), n).
// V = 4: four consecutive rows per thread with 16-byte accesses (rows % 4 == 0,
// out 16-byte aligned; C and e_r are in scratch, 256-byte aligned), the same
// operations per element as V = 1 (a 2,048-token batch's scale-outs were 3.5%
// of its kernel time at 1.4 TB/s with one element per thread; ncu, H200).
template <int V>
__global__ void __launch_bounds__(256)
    gemm_scale_out_kernel(const float* __restrict__ c, const int* __restrict__ row_exp, const int* __restrict__ tok_exp,
                          int64_t rows, float* __restrict__ out, bool acc) {
  pdl_enter();
  const int64_t t = blockIdx.y;
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (r >= rows) return;
  const int et = tok_exp[t];
  if constexpr (V == 4) {
    const float4 cv = *reinterpret_cast<const float4*>(c + t * rows + r);
    const int4 er = *reinterpret_cast<const int4*>(row_exp + r);
    float4 v = make_float4(ldexpf(cv.x, -(er.x + et)), ldexpf(cv.y, -(er.y + et)), ldexpf(cv.z, -(er.z + et)),
                           ldexpf(cv.w, -(er.w + et)));
    auto* o = reinterpret_cast<float4*>(out + t * rows + r);
    if (acc) {
      const float4 p = *o;
      v = make_float4(p.x + v.x, p.y + v.y, p.z + v.z, p.w + v.w);
    }
    *o = v;
  } else {
    const float v = ldexpf(c[t * rows + r], -(row_exp[r] + et));
    float& o = out[t * rows + r];
    o = acc ? o + v : v;
  }
}

// Largest K' per GEMM call (see the accuracy note above).
constexpr int64_t k_gemm_slice = 2048;

// Slices of K' (3 cols, or 2): the fewest S with K' / S <= k_gemm_slice, K' / S a whole
// number of 8 halves (16-byte aligned slice starts).
int64_t gemm_slices(int64_t k3) {
  for (int64_t s = (k3 + k_gemm_slice - 1) / k_gemm_slice;; ++s)
    if (k3 % s == 0 && (k3 / s) % 8 == 0) return s;
}

// The scratch regions of one GEMM-path matmul, 256-byte aligned, in order:
// A' [rows, 3 cols] f16, B' [n, G, 3 cols] f16, C [n, rows] f32, e_r [rows], e_t [n].
struct GemmScratch {
  size_t a = 0, b = 0, c = 0, row_exp = 0, tok_exp = 0, bytes = 0;  // byte offsets, total
  GemmScratch(int64_t rows, int64_t cols, int groups, int64_t n) {
    auto take = [&](size_t len) {
      const size_t at = bytes;
      bytes += (len + 255) / 256 * 256;
      return at;
    };
    a = take(static_cast<size_t>(rows) * 3 * cols * sizeof(__half));
    b = take(static_cast<size_t>(n) * groups * 3 * cols * sizeof(__half));
    c = take(static_cast<size_t>(n) * rows * sizeof(float));
    row_exp = take(static_cast<size_t>(rows) * sizeof(int));
    tok_exp = take(static_cast<size_t>(n) * sizeof(int));
  }
};

}  // namespace

GemmWeightCache::~GemmWeightCache() {
  for (auto& [w, e] : map_)
    if (e.mem) (void)cudaFree(e.mem);
}

GemmWeightCache::Entry* GemmWeightCache::find_or_make(const void* w, int64_t rows, int64_t cols, GgmlType type,
                                                      cudaStream_t stream) {
  auto it = map_.find(w);
  if (it != map_.end()) {
    Entry& e = it->second;
    return e.rows == rows && e.cols == cols && e.type == type ? &e : nullptr;
  }
  if (released_) return nullptr;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) return nullptr;  // no allocation inside a recording
  const size_t a_bytes = (static_cast<size_t>(rows) * 3 * static_cast<size_t>(cols) * sizeof(__half) + 255) / 256 * 256;
  const size_t bytes = a_bytes + static_cast<size_t>(rows) * sizeof(int);
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < bytes + reserve_) {
    if (refused_++ == 0)
      log_info(
          "cuda: the split-weight cache holds %.2f GiB in %zu matrices; further prefill matmul weights are split "
          "per call (%.2f GiB free, %.2f GiB kept free)",
          static_cast<double>(bytes_) / (1 << 30), map_.size(), static_cast<double>(free_b) / (1 << 30),
          static_cast<double>(reserve_) / (1 << 30));
    return nullptr;
  }
  void* mem = nullptr;
  if (cudaMalloc(&mem, bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    ++refused_;
    return nullptr;
  }
  Entry e;
  e.mem = mem;
  e.bytes = bytes;
  e.exp_offset = a_bytes;
  e.rows = rows;
  e.cols = cols;
  e.type = type;
  bytes_ += bytes;
  return &map_.emplace(w, e).first->second;
}

void GemmWeightCache::drop_range(const void* begin, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(begin);
  for (auto it = map_.begin(); it != map_.end();) {
    const auto* k = static_cast<const uint8_t*>(it->first);
    if (k >= b && k < b + bytes) {
      CUDA_CHECK(cudaFree(it->second.mem));
      bytes_ -= it->second.bytes;
      it = map_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t GemmWeightCache::release_all(cudaStream_t stream) {
  if (map_.empty()) return 0;
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &cap));
  if (cap != cudaStreamCaptureStatusNone) return 0;
  CUDA_CHECK(cudaDeviceSynchronize());  // queued GEMMs (either stream) may still read the splits
  const size_t freed = bytes_;
  for (auto& [w, e] : map_) CUDA_CHECK(cudaFree(e.mem));
  map_.clear();
  bytes_ = 0;
  released_ = true;
  log_info(
      "cuda: the device ran out of memory: released the split-weight cache (%.2f GiB); prefill matmul weights "
      "are split per call from now on",
      static_cast<double>(freed) / (1 << 30));
  return freed;
}

cudaError_t malloc_evicting(void** p, size_t bytes, GemmWeightCache* cache, cudaStream_t stream) {
  cudaError_t e = cudaMalloc(p, bytes);
  if (e == cudaErrorMemoryAllocation && cache && cache->release_all(stream) > 0) {
    (void)cudaGetLastError();
    e = cudaMalloc(p, bytes);
  }
  return e;
}

namespace {

// Whether a matmul of this shape takes the GEMM path (cuBLAS, tensor cores, enough tokens, int-sized).
bool gemm_applies(const CudaContext& ctx, GgmlType type, int64_t rows, int64_t cols, int groups, int64_t n) {
  bool typed = false;
  dispatch_weight_type(type, [&](auto tag) { typed = gemm_type<decltype(tag)::value>(); });
  return typed && ctx.blas && ctx.tensor_cores && !ctx.capturing && n >= ctx.gemm_min_tokens && n >= 2 &&
         cols % 32 == 0 && rows <= INT_MAX && n <= 65535 && 3 * cols * groups <= INT_MAX &&
         GemmScratch(rows, cols, groups, n).bytes <= k_gemm_max_scratch;
}

// Steps 1, 3 and 4 of one matrix on an x already split into b / tok_exp (step 2):
// A' and e_r from the cache or split into `own_a` / `own_exp` (scratch), the
// sliced GEMMs into c, the epilogue into out.
void gemm_matrix(const CudaContext& ctx, const Tensor& w, int groups, int64_t n, const __half* b, const int* tok_exp,
                 float* c, __half* own_a, int* own_exp, float* out, bool accumulate, bool x_exact) {
  const int64_t cols = w.ne[0], rows = w.n_rows(), rows_g = rows / groups;
  dispatch_weight_type(w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    if constexpr (gemm_type<T>()) {
      constexpr int U = WeightUnit<T>::U;
      GemmWeightCache::Entry* cached =
          ctx.gemm_cache ? ctx.gemm_cache->find_or_make(w.data, rows, cols, T, ctx.stream) : nullptr;
      __half* a = cached ? static_cast<__half*>(cached->mem) : own_a;
      int* row_exp = cached ? reinterpret_cast<int*>(static_cast<uint8_t*>(cached->mem) + cached->exp_offset) : own_exp;
      if (!cached || !cached->filled) {  // the split of W (once per weight with the cache)
        launch_kernel(gemm_split_w_kernel<T>, ceil_div(rows, 8), 256, 0, ctx.stream,
                      static_cast<const uint8_t*>(w.data), w.row_bytes(), rows, cols / U, a, row_exp, ctx.tables);
        CUDA_CHECK_LAUNCH();
        if (cached) cached->filled = true;
      }
      // K' = 3 cols, or the first 2 cols' worth when x_lo is 0 (x_exact); the layout's stride stays 3 cols.
      const int64_t k3 = 3 * cols, kk = (x_exact ? 2 : 3) * cols, slices = gemm_slices(kk), ks = kk / slices;
      for (int64_t sl = 0; sl < slices; ++sl)
        ctx.blas->gemm_tn_f16(ctx.stream, static_cast<int>(rows_g), static_cast<int>(n), static_cast<int>(ks),
                              a + sl * ks, static_cast<int>(k3), rows_g * k3, b + sl * ks,
                              static_cast<int>(k3 * groups), k3, c, static_cast<int>(rows), rows_g, groups, sl > 0);
      if (rows % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0)
        launch_kernel(gemm_scale_out_kernel<4>, dim3(ceil_div(rows, 1024), static_cast<unsigned>(n)), 256, 0,
                      ctx.stream, c, row_exp, tok_exp, rows, out, accumulate);
      else
        launch_kernel(gemm_scale_out_kernel<1>, dim3(ceil_div(rows, 256), static_cast<unsigned>(n)), 256, 0, ctx.stream,
                      c, row_exp, tok_exp, rows, out, accumulate);
      CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

bool launch_matmul_gemm(const CudaContext& ctx, const MatmulOp& op) {
  const int64_t cols = op.w.ne[0], rows = op.w.n_rows(), n = op.x.n_rows();
  const int groups = op.groups;
  if (!gemm_applies(ctx, op.w.type, rows, cols, groups, n)) return false;
  const GemmScratch layout(rows, cols, groups, n);
  auto* base = static_cast<uint8_t*>(ctx.scratch->get(layout.bytes, ctx.stream));
  auto* b = reinterpret_cast<__half*>(base + layout.b);
  auto* tok_exp = reinterpret_cast<int*>(base + layout.tok_exp);
  launch_kernel(gemm_split_x_kernel, static_cast<unsigned>(n), 256, 0, ctx.stream, op.x.f32(), cols * groups, groups,
                cols, b, tok_exp);
  CUDA_CHECK_LAUNCH();
  gemm_matrix(ctx, op.w, groups, n, b, tok_exp, reinterpret_cast<float*>(base + layout.c),
              reinterpret_cast<__half*>(base + layout.a), reinterpret_cast<int*>(base + layout.row_exp), op.out.f32(),
              op.accumulate, op.x_quant != ActQuant::NONE);
  return true;
}

bool launch_matmuls_gemm(const CudaContext& ctx, const MatmulsOp& op) {
  const int64_t n = op.x.n_rows(), cols = op.count > 0 ? op.w[0].ne[0] : 0;
  if (op.count < 2 || op.x.ne[0] != cols || op.x.type != GgmlType::F32) return false;
  size_t most = 0;  // the largest matrix's scratch (A', C, e_r are reused matrix after matrix, in stream order)
  for (int i = 0; i < op.count; ++i) {
    if (op.w[i].ne[0] != cols || !gemm_applies(ctx, op.w[i].type, op.w[i].n_rows(), cols, 1, n) ||
        op.out[i].type != GgmlType::F32 || op.out[i].ne[0] != op.w[i].n_rows() || op.out[i].n_rows() != n)
      return false;
    most = std::max(most, GemmScratch(op.w[i].n_rows(), cols, 1, n).bytes);
  }
  // x split once (step 2) for every matrix: B' and e_t first, then the largest matrix's layout.
  const GemmScratch xl(0, cols, 1, n);
  auto* base = static_cast<uint8_t*>(ctx.scratch->get(xl.bytes + most, ctx.stream));
  auto* b = reinterpret_cast<__half*>(base + xl.b);
  auto* tok_exp = reinterpret_cast<int*>(base + xl.tok_exp);
  launch_kernel(gemm_split_x_kernel, static_cast<unsigned>(n), 256, 0, ctx.stream, op.x.f32(), cols, 1, cols, b,
                tok_exp);
  CUDA_CHECK_LAUNCH();
  for (int i = 0; i < op.count; ++i) {
    const GemmScratch l(op.w[i].n_rows(), cols, 1, n);
    uint8_t* m = base + xl.bytes;
    gemm_matrix(ctx, op.w[i], 1, n, b, tok_exp, reinterpret_cast<float*>(m + l.c), reinterpret_cast<__half*>(m + l.a),
                reinterpret_cast<int*>(m + l.row_exp), op.out[i].f32(), false, op.x_quant != ActQuant::NONE);
  }
  return true;
}

}  // namespace dsv4::cuda
