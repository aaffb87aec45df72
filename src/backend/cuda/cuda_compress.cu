// KV compressor step (model-spec.md §5.5/§5.6) for n consecutive tokens.
//
// Layout: frontier state_a/state_g [R, w] (R = 2m with overlap, else m;
// w = c*d), projections kv/gate [n, w], APE [m, w] (any weight type, decoded
// to f32 scratch first), output rows [cap_rows, d].
//
// Launch plan (three kernels, in stream order):
//   1. dequantize the APE rows to f32 scratch (cuda_matmul.cu).
//   2. pool: one thread per output channel c (128-thread blocks), walking the
//      batch's tokens in order — the frontier update is sequential per
//      channel, the channels are independent. For each token: store (a,
//      g + APE[p mod m]) in slot (overlap ? m : 0) + p mod m; when (p+1) mod m
//      == 0, softmax-pool the R candidates (lane A of rows < m, lane B of rows
//      >= m with overlap) in double, write the raw pooled value to scratch
//      row t, then shift (overlap) or clear the frontier columns of c.
//   3. post-process: one 128-thread block per token; blocks of emitting
//      tokens take their scratch row: optional bf16 round, RMSNorm (norm_w),
//      RoPE at position k*m, simulation (cuda_rowops.cuh), in place; then
//      store it as row k = p div m in the rows' format (cuda_kv_rows.cuh).
// All sums run in the CPU's order (the pooling sums exactly as cpu::compress,
// in double), so the frontier is bit-identical to the CPU's and the rows
// differ only through exp() and sin/cos rounding.
//
// CPU reference: cpu::compress (src/backend/cpu/cpu_attention.cpp).
#include "backend/cuda/cuda_compress.cuh"
#include "backend/cuda/cuda_kv_rows.cuh"
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/cuda_rowops.cuh"

namespace dsv4::cuda {

namespace {

__global__ void compress_pool_kernel(float* pooled, int64_t cap_rows, int64_t d, float* sa, float* sg, int64_t w, int m,
                                     bool overlap, const float* kv, const float* gate, const float* ape,
                                     const int32_t* pos, int64_t n) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= d) return;
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t prev = overlap ? m : 0;  // first row of the "current" window
  const int64_t R = overlap ? 2 * m : m;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t p = pos[t];
    const int64_t slot = prev + p % m;
    const float* a = kv + t * w;
    const float* g = gate + t * w;
    const float* ap = ape + (p % m) * w;
    sa[slot * w + c] = a[c];
    sg[slot * w + c] = __fadd_rn(g[c], ap[c]);
    if (overlap) {
      sa[slot * w + c + d] = a[c + d];
      sg[slot * w + c + d] = __fadd_rn(g[c + d], ap[c + d]);
    }
    if ((p + 1) % m != 0) continue;
    float mx = neg_inf;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t col = overlap && r >= m ? c + d : c;
      const float gv = sg[r * w + col];
      mx = mx < gv ? gv : mx;
    }
    double num = 0.0, den = 0.0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t col = overlap && r >= m ? c + d : c;
      const float gv = sg[r * w + col];
      if (gv == neg_inf) continue;
      const double e = exp(static_cast<double>(__fsub_rn(gv, mx)));
      den = __dadd_rn(den, e);
      num = __dadd_rn(num, __dmul_rn(e, static_cast<double>(sa[r * w + col])));
    }
    const int64_t k = p / m;
    DEVICE_CHECK(k < cap_rows);
    pooled[t * d + c] = static_cast<float>(num / den);
    if (overlap) {
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t col = c; col <= c + d; col += d) {
          sa[r * w + col] = sa[(r + m) * w + col];
          sg[r * w + col] = sg[(r + m) * w + col];
          sa[(r + m) * w + col] = 0.0f;
          sg[(r + m) * w + col] = neg_inf;
        }
      }
    } else {
      for (int64_t r = 0; r < m; ++r) {
        sa[r * w + c] = 0.0f;
        sg[r * w + c] = neg_inf;
      }
    }
  }
}

__global__ void compress_post_kernel(void* rows, GgmlType type, float* pooled, int64_t d, const int32_t* pos, int m,
                                     const float* norm_w, float eps, RopeTable rt, KvQuantSim sim, int n_quant,
                                     bool round_bf16) {
  __shared__ double red[33];
  const int32_t p = pos[blockIdx.x];
  if ((p + 1) % m != 0) return;  // uniform over the block
  const int64_t k = p / m;
  float* row = pooled + static_cast<int64_t>(blockIdx.x) * d;
  if (round_bf16)
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) row[i] = bf16_round_dev(row[i]);
  __syncthreads();
  block_rms_norm_row(row, row, norm_w, d, eps, red);
  __syncthreads();
  block_rope_row(row, d, rt, static_cast<int32_t>(k * m), false);
  __syncthreads();
  block_quant_sim_row(row, d, sim, n_quant);  // ends with a barrier
  block_store_kv_row(kv_row_ptr(rows, type, d, k), row, d, type);
}

}  // namespace

void launch_compress(const CudaContext& ctx, const CompressOp& op) {
  const int m = op.ratio;
  const int64_t d = op.norm_w.ne[0];
  const int64_t w = op.kv.ne[0];
  const int64_t n = op.kv.n_rows();
  const int64_t R = op.state_a.n_rows();
  DSV4_ASSERT(m >= 1, "compress: ratio %d", m);
  DSV4_ASSERT(w == (op.overlap ? 2 : 1) * d, "compress: width %lld for row width %lld", static_cast<long long>(w),
              static_cast<long long>(d));
  DSV4_ASSERT(R == (op.overlap ? 2 * m : m) && op.state_a.ne[0] == w && op.state_g.ne[0] == w, "compress: frontier shape");
  DSV4_ASSERT(op.ape.ne[0] == w && op.ape.n_rows() == m, "compress: APE shape");
  DSV4_ASSERT(op.gate.ne[0] == w && op.gate.n_rows() == n && op.rows.ne[0] == d, "compress: projection/row shapes");
  DSV4_ASSERT(op.sim != KvQuantSim::HADAMARD_FP4 || (d & (d - 1)) == 0, "compress: Hadamard needs a power-of-two width");
  if (n == 0) return;
  DSV4_ASSERT(n <= 0x7fffffff, "compress: batch too large");
  const RopeTable rt = make_rope_table(op.rope);
  DSV4_ASSERT(rt.n_rot <= d, "compress: n_rot > row width");
  check_kv_rows(op.rows, "compress");
  // Scratch: APE rows [m, w] then the raw pooled rows [n, d] (row t: the window token t completes).
  const size_t ape_floats = static_cast<size_t>(m) * static_cast<size_t>(w);
  auto* ape = static_cast<float*>(ctx.scratch->get((ape_floats + static_cast<size_t>(n * d)) * sizeof(float), ctx.stream));
  float* pooled = ape + ape_floats;
  launch_dequantize_rows(ctx, op.ape, ape);
  compress_pool_kernel<<<ceil_div(d, 128), 128, 0, ctx.stream>>>(pooled, op.rows.n_rows(), d, op.state_a.f32(),
                                                                op.state_g.f32(), w, m, op.overlap, op.kv.f32(),
                                                                op.gate.f32(), ape, op.pos.i32(), n);
  CUDA_CHECK_LAUNCH();
  compress_post_kernel<<<static_cast<unsigned>(n), 128, 0, ctx.stream>>>(op.rows.data, op.rows.type, pooled, d, op.pos.i32(), m,
                                                                        op.norm_w.f32(), op.eps, rt, op.sim, op.n_quant,
                                                                        op.round_pooled_bf16);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
