// KV compressor step (model-spec.md §5.5/§5.6) for n consecutive tokens.
//
// Layout: frontier state_a/state_g [R, w] (R = 2m with overlap, else m;
// w = c*d), projections kv/gate [n, w], APE [m, w] (any weight type; read as
// F32/F16 in place, others decoded to f32 scratch first), output rows [cap_rows, d].
//
// Launch plan (four kernels, in stream order):
//   1. APE rows of a type other than F32/F16 (GGUF: F16): dequantized to f32
//      scratch (cuda_matmul.cu); F32/F16 rows are read in place (ApeView).
//   The batch's positions are consecutive (p_t = p_0 + t; checked), so every
//   frontier entry the sequential update would hold at any token is known up
//   front: position q's entry is (a, g + APE[q mod m]) from token q - p_0 when
//   q >= p_0, else the frontier row it had before the batch. Hence:
//   2. pool: grid (channel blocks of 128, windows completing in the batch):
//      thread (c, window k) gathers the R candidates (lane A = column c of
//      window k - 1 and lane B = column c + d of window k with overlap; else
//      column c of window k), softmax-pools them in double in the CPU's order
//      and writes the raw pooled value to scratch row t (the completing token).
//      (Batches of <= 16 tokens, i.e. decode, take one kernel instead, whose
//      thread per channel walks the batch in order; for a 2048-token batch
//      that walk took 3.2 ms per call. The single-token sequences of a
//      batched decode step share that kernel and the post-process:
//      grid y = sequence, its state from a table, launch_compress_seqs.)
//   3. frontier: one thread per (row < m, column) writes what the sequential
//      update would leave after the last token (rows that cannot change are
//      not written: a decode step writes one row).
//   4. post-process: one 128-thread block per token; blocks of emitting
//      tokens take their scratch row: optional bf16 round, RMSNorm (norm_w),
//      RoPE at position k*m, simulation (cuda_rowops.cuh), in place; then
//      store it as row k = p div m in the rows' format (cuda_kv_rows.cuh).
// All sums run in the CPU's order (the pooling sums exactly as cpu::compress,
// in double), so the frontier is bit-identical to the CPU's and the rows
// differ only through exp() and sin/cos rounding.
//
// CPU reference: cpu::compress (src/backend/cpu/cpu_attention.cpp).
#include <algorithm>

#include "backend/cuda/cuda_compress.cuh"
#include "backend/cuda/cuda_kv_rows.cuh"
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/cuda_rowops.cuh"
#include "backend/cuda/cuda_seqs.cuh"

namespace dsv4::cuda {

namespace {

// The APE rows as the kernels read them: F32 or F16 straight from the weight
// (the f16 -> f32 conversion is exact, dequantize_row's value), other types
// from an f32 copy in scratch (launch_dequantize_rows; a launch per call).
struct ApeView {
  const void* p;
  bool f16;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return f16 ? __half2float(static_cast<const __half*>(p)[i]) : static_cast<const float*>(p)[i];
  }
};

// A sequence's compressor state and its tokens [t0, t0 + n) of the launch
// (CompressOp: state_a, state_g, rows); compress_seq_kernel and
// compress_post_kernel take one entry per sequence (grid y).
struct CompressSeq {
  float* sa;
  float* sg;
  void* rows;
  int64_t cap_rows;
  int64_t t0, n;
};

// Small batches (decode): one thread per output channel c walks the batch's
// tokens in order, updating the frontier columns it owns and pooling each
// window that completes (one launch; the parallel pool + frontier kernels
// below give the same bits and win from ~a few windows per batch).
__global__ void compress_seq_kernel(SeqTable<CompressSeq> tab, float* pooled, int64_t d, int64_t w, int m, bool overlap,
                                    const float* kv, const float* gate, ApeView ape, const int32_t* pos) {
  pdl_enter();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= d) return;
  const CompressSeq& seq = tab.at[blockIdx.y];
  float* sa = seq.sa;
  float* sg = seq.sg;
  const int64_t cap_rows = seq.cap_rows;
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t prev = overlap ? m : 0;  // first row of the "current" window
  const int64_t R = overlap ? 2 * m : m;
  for (int64_t t = seq.t0; t < seq.t0 + seq.n; ++t) {
    const int32_t p = pos[t];
    const int64_t slot = prev + p % m;
    const float* a = kv + t * w;
    const float* g = gate + t * w;
    const int64_t ap = (p % m) * w;  // the position's APE row
    sa[slot * w + c] = a[c];
    sg[slot * w + c] = __fadd_rn(g[c], ape[ap + c]);
    if (overlap) {
      sa[slot * w + c + d] = a[c + d];
      sg[slot * w + c + d] = __fadd_rn(g[c + d], ape[ap + c + d]);
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

// One frontier candidate (value a, score g) for position q in column col:
// from the batch when q >= P0 (token q - P0; score = gate + APE[q mod m]),
// else from the frontier as it was before the batch: `old_row` (-1: empty).
__device__ __forceinline__ void compress_cand(int64_t q, int64_t col, int64_t old_row, int64_t P0, int m, int64_t w,
                                              const float* kv, const float* gate, ApeView ape, const float* sa,
                                              const float* sg, float& av, float& gv) {
  if (q >= P0) {
    const int64_t t = q - P0;
    av = kv[t * w + col];
    gv = __fadd_rn(gate[t * w + col], ape[(q % m) * w + col]);
  } else if (old_row >= 0) {
    av = sa[old_row * w + col];
    gv = sg[old_row * w + col];
  } else {
    av = 0.0f;
    gv = -__int_as_float(0x7f800000);
  }
}

// The raw pooled value of window k = P0/m + blockIdx.y (when it completes in
// the batch, at position p = km + m - 1), channel c. The candidates are the
// ones the sequential frontier would hold when p arrives: the positions of
// window k (lane B with overlap), and with overlap those of window k - 1
// (lane A); each from the batch or the frontier before it. Softmax pooling in
// the CPU's order, in double.
__global__ void compress_pool_kernel(float* pooled, int64_t cap_rows, int64_t d, const float* sa, const float* sg,
                                     int64_t w, int m, bool overlap, const float* kv, const float* gate, ApeView ape,
                                     const int32_t* pos, int64_t n) {
  pdl_enter();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= d) return;
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t P0 = pos[0], PL = P0 + n - 1, k0 = P0 / m;
  const int64_t k = k0 + blockIdx.y, p = k * m + m - 1;
  if (p > PL) return;
  const int64_t R = overlap ? 2 * m : m;
  // Candidate r: overlap and r < m: position (k-1)m + r, column c, old frontier row r (window k0 - 1)
  // or m + r (window k0); else position km + r', r' = r - (overlap ? m : 0), column c (+ d with
  // overlap), old frontier row (overlap ? m : 0) + r' (window k0).
  auto cand = [&](int64_t r, float& av, float& gv) {
    if (overlap && r < m) {  // k = 0: q < 0 <= P0 and no old row: empty
      const int64_t old_row = k == 0 ? -1 : (k - 1 == k0 - 1 ? r : m + r);
      compress_cand((k - 1) * m + r, c, old_row, P0, m, w, kv, gate, ape, sa, sg, av, gv);
    } else {
      const int64_t rr = overlap ? r - m : r;
      compress_cand(k * m + rr, overlap ? c + d : c, (overlap ? m : 0) + rr, P0, m, w, kv, gate, ape, sa, sg, av, gv);
    }
  };
  float mx = neg_inf;
  for (int64_t r = 0; r < R; ++r) {
    float av, gv;
    cand(r, av, gv);
    mx = mx < gv ? gv : mx;
  }
  double num = 0.0, den = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    float av, gv;
    cand(r, av, gv);
    if (gv == neg_inf) continue;
    const double e = exp(static_cast<double>(__fsub_rn(gv, mx)));
    den = __dadd_rn(den, e);
    num = __dadd_rn(num, __dmul_rn(e, static_cast<double>(av)));
  }
  DEVICE_CHECK(k < cap_rows);
  pooled[(p - P0) * d + c] = static_cast<float>(num / den);
}

// The frontier after the batch, thread (column col, row r < m): what the
// sequential update leaves. kc = the window in progress after the last token
// (kL + 1 when the last token completes window kL). Its rows hold positions
// kc*m + r <= PL (from the batch, or the old frontier when kc is still the
// window k0 the batch started in), empty beyond; with overlap the previous
// rows hold window kc - 1. Rows that cannot have changed are not written
// (a decode step writes one row). Runs after compress_pool_kernel, which reads
// the old frontier; each thread reads its rows before writing them.
__global__ void compress_state_kernel(float* sa, float* sg, int64_t w, int m, bool overlap, const float* kv,
                                      const float* gate, ApeView ape, const int32_t* pos, int64_t n) {
  pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(m) * w) return;
  const int64_t r = i / w, col = i % w;
  const int64_t P0 = pos[0], PL = P0 + n - 1, k0 = P0 / m, kL = PL / m;
  const int64_t kc = (PL + 1) % m == 0 ? kL + 1 : kL;
  const int64_t cur = (overlap ? m : 0) + r;  // this thread's current-window row
  const int64_t q = kc * m + r;
  const bool write_cur = kc != k0 || (q >= P0 && q <= PL);
  const bool write_prev = overlap && kc != k0;
  float ca = 0.0f, cg = -__int_as_float(0x7f800000), pa = 0.0f, pg = 0.0f;
  if (write_cur && q <= PL) compress_cand(q, col, cur, P0, m, w, kv, gate, ape, sa, sg, ca, cg);
  if (write_prev) compress_cand((kc - 1) * m + r, col, cur, P0, m, w, kv, gate, ape, sa, sg, pa, pg);
  if (write_prev) {
    sa[r * w + col] = pa;
    sg[r * w + col] = pg;
  }
  if (write_cur) {
    sa[cur * w + col] = ca;
    sg[cur * w + col] = cg;
  }
}

// Grid (tokens, sequences): block (i, j) post-processes token t0 + i of sequence j.
__global__ void compress_post_kernel(SeqTable<CompressSeq> tab, GgmlType type, float* pooled, int64_t d,
                                     const int32_t* pos, int m, const float* norm_w, float eps, RopeTable rt,
                                     KvQuantSim sim, int n_quant, bool round_bf16) {
  pdl_enter();
  __shared__ double red[33];
  const CompressSeq& seq = tab.at[blockIdx.y];
  if (blockIdx.x >= seq.n) return;
  const int64_t t = seq.t0 + blockIdx.x;
  const int32_t p = pos[t];
  DEVICE_CHECK(p == pos[seq.t0] + static_cast<int32_t>(
                                      blockIdx.x));  // consecutive positions (the pool and state kernels assume them)
  if ((p + 1) % m != 0) return;                      // uniform over the block
  const int64_t k = p / m;
  float* row = pooled + t * d;
  if (round_bf16)
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) row[i] = bf16_round_dev(row[i]);
  __syncthreads();
  block_rms_norm_row(row, row, norm_w, d, eps, red);
  __syncthreads();
  block_rope_row(row, d, rt, static_cast<int32_t>(k * m), false);
  __syncthreads();
  block_quant_sim_row(row, d, sim, n_quant);  // ends with a barrier
  block_store_kv_row(kv_row_ptr(seq.rows, type, d, k), row, d, type);
}

// Batches up to this size take compress_seq_kernel.
constexpr int64_t k_compress_seq_max = 16;

// Sequences' entries for the kernels above: ops (each of <= max_n tokens) whose
// kv/gate/pos rows are consecutive, entry j's tokens from the sum of the earlier ops' counts.
SeqTable<CompressSeq> compress_table(std::span<const CompressOp> ops) {
  SeqTable<CompressSeq> tab{};
  int64_t t0 = 0;
  for (size_t j = 0; j < ops.size(); ++j) {
    const CompressOp& op = ops[j];
    const int64_t n = op.kv.n_rows();
    tab.at[j] = {op.state_a.f32(), op.state_g.f32(), op.rows.data, op.rows.n_rows(), t0, n};
    t0 += n;
  }
  return tab;
}

void launch_compress_post(const CudaContext& ctx, const CompressOp& op, const SeqTable<CompressSeq>& tab, float* pooled,
                          const RopeTable& rt, int64_t max_n, size_t seqs) {
  launch_kernel(compress_post_kernel, dim3(static_cast<unsigned>(max_n), static_cast<unsigned>(seqs)), 128, 0,
                ctx.stream, tab, op.rows.type, pooled, op.norm_w.ne[0], op.pos.i32(), op.ratio, op.norm_w.f32(), op.eps,
                rt, op.sim, op.n_quant, op.round_pooled_bf16);
  CUDA_CHECK_LAUNCH();
}

// The checks of launch_compress; returns the APE view (decoded into scratch
// after `pooled_floats` floats when not F32/F16) and sets *pooled.
ApeView compress_prepare(const CudaContext& ctx, const CompressOp& op, int64_t pooled_floats, float** pooled) {
  const int m = op.ratio;
  const int64_t d = op.norm_w.ne[0];
  const int64_t w = op.kv.ne[0];
  const int64_t n = op.kv.n_rows();
  const int64_t R = op.state_a.n_rows();
  DSV4_ASSERT(m >= 1, "compress: ratio %d", m);
  DSV4_ASSERT(w == (op.overlap ? 2 : 1) * d, "compress: width %lld for row width %lld", static_cast<long long>(w),
              static_cast<long long>(d));
  DSV4_ASSERT(R == (op.overlap ? 2 * m : m) && op.state_a.ne[0] == w && op.state_g.ne[0] == w,
              "compress: frontier shape");
  DSV4_ASSERT(op.ape.ne[0] == w && op.ape.n_rows() == m, "compress: APE shape");
  DSV4_ASSERT(op.gate.ne[0] == w && op.gate.n_rows() == n && op.rows.ne[0] == d, "compress: projection/row shapes");
  DSV4_ASSERT(op.sim != KvQuantSim::HADAMARD_FP4 || (d & (d - 1)) == 0,
              "compress: Hadamard needs a power-of-two width");
  DSV4_ASSERT(n <= 0x7fffffff, "compress: batch too large");
  check_kv_rows(op.rows, "compress");
  // Scratch: the raw pooled rows [n, d] (row t: the window token t completes),
  // then, for APE types other than F32/F16, the APE rows [m, w] as f32.
  const bool ape_direct = op.ape.type == GgmlType::F32 || op.ape.type == GgmlType::F16;
  const size_t ape_floats = ape_direct ? 0 : static_cast<size_t>(m) * static_cast<size_t>(w);
  *pooled = static_cast<float*>(
      ctx.scratch->get((static_cast<size_t>(pooled_floats) + ape_floats) * sizeof(float), ctx.stream));
  ApeView ape{op.ape.data, op.ape.type == GgmlType::F16};
  if (!ape_direct) {
    float* ape_f32 = *pooled + pooled_floats;
    launch_dequantize_rows(ctx, op.ape, ape_f32);
    ape = ApeView{ape_f32, false};
  }
  return ape;
}

// Sequences of <= k_compress_seq_max tokens each, consecutive rows, shared
// weights and shapes: compress_seq_kernel + compress_post_kernel over all.
void launch_compress_small(const CudaContext& ctx, std::span<const CompressOp> ops) {
  const CompressOp& op = ops.front();
  int64_t total = 0, max_n = 0;
  for (const CompressOp& o : ops) {
    total += o.kv.n_rows();
    max_n = std::max(max_n, o.kv.n_rows());
  }
  const int64_t d = op.norm_w.ne[0], w = op.kv.ne[0];
  float* pooled = nullptr;
  const ApeView ape = compress_prepare(ctx, op, total * d, &pooled);
  const RopeTable rt = make_rope_table(op.rope);
  DSV4_ASSERT(rt.n_rot <= d, "compress: n_rot > row width");
  const SeqTable<CompressSeq> tab = compress_table(ops);
  launch_kernel(compress_seq_kernel, dim3(ceil_div(d, 128), static_cast<unsigned>(ops.size())), 128, 0, ctx.stream, tab,
                pooled, d, w, op.ratio, op.overlap, op.kv.f32(), op.gate.f32(), ape, op.pos.i32());
  CUDA_CHECK_LAUNCH();
  launch_compress_post(ctx, op, tab, pooled, rt, max_n, ops.size());
}

}  // namespace

void launch_compress(const CudaContext& ctx, const CompressOp& op) {
  const int m = op.ratio;
  const int64_t d = op.norm_w.ne[0];
  const int64_t w = op.kv.ne[0];
  const int64_t n = op.kv.n_rows();
  if (n == 0) return;
  if (n <= k_compress_seq_max) {
    launch_compress_small(ctx, std::span<const CompressOp>(&op, 1));
    return;
  }
  float* pooled = nullptr;
  const ApeView ape = compress_prepare(ctx, op, n * d, &pooled);
  const RopeTable rt = make_rope_table(op.rope);
  DSV4_ASSERT(rt.n_rot <= d, "compress: n_rot > row width");
  // Windows completing in the batch: at most n / m + 1.
  const int64_t n_win = n / m + 1;
  DSV4_ASSERT(n_win <= 65535, "compress: batch of %lld tokens too large for ratio %d", static_cast<long long>(n), m);
  launch_kernel(compress_pool_kernel, dim3(ceil_div(d, 128), static_cast<unsigned>(n_win)), 128, 0, ctx.stream, pooled,
                op.rows.n_rows(), d, op.state_a.f32(), op.state_g.f32(), w, m, op.overlap, op.kv.f32(), op.gate.f32(),
                ape, op.pos.i32(), n);
  CUDA_CHECK_LAUNCH();
  launch_kernel(compress_state_kernel, ceil_div(static_cast<int64_t>(m) * w, 256), 256, 0, ctx.stream, op.state_a.f32(),
                op.state_g.f32(), w, m, op.overlap, op.kv.f32(), op.gate.f32(), ape, op.pos.i32(), n);
  CUDA_CHECK_LAUNCH();
  launch_compress_post(ctx, op, compress_table(std::span<const CompressOp>(&op, 1)), pooled, rt, n, 1);
}

namespace {
bool same_rope(const RopeParams& a, const RopeParams& b) {
  return a.n_rot == b.n_rot && a.theta == b.theta && a.yarn == b.yarn && a.factor == b.factor &&
         a.orig_ctx == b.orig_ctx && a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow;
}
}  // namespace

void launch_compress_seqs(const CudaContext& ctx, std::span<const CompressOp> ops) {
  auto fits = [](const CompressOp& op, const CompressOp& first, size_t k) {
    return op.kv.n_rows() == 1 && op.kv.ne[0] == first.kv.ne[0] && op.ratio == first.ratio &&
           op.overlap == first.overlap && op.ape.data == first.ape.data && op.norm_w.data == first.norm_w.data &&
           op.rows.type == first.rows.type && op.rows.ne[0] == first.rows.ne[0] && op.sim == first.sim &&
           op.n_quant == first.n_quant && op.round_pooled_bf16 == first.round_pooled_bf16 && op.eps == first.eps &&
           same_rope(op.rope, first.rope) && rows_follow(first.kv, op.kv, k, first.kv.row_bytes()) &&
           rows_follow(first.gate, op.gate, k, first.gate.row_bytes()) &&
           rows_follow(first.pos, op.pos, k, sizeof(int32_t));
  };
  seq_runs(
      ops, fits, [&](std::span<const CompressOp> run) { launch_compress_small(ctx, run); },
      [&](const CompressOp& op) { launch_compress(ctx, op); });
}

}  // namespace dsv4::cuda
