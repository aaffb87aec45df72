// Core attention (model-spec.md §5.7): for query t at position p and head h,
// keys = window rows of positions max(0, p-W+1) .. p (ring slot = position %
// cap_w), then compressed rows (all k < visible, or the listed sel[t, :]
// entries that are >= 0 and < visible); l_s = (q_h · K_s) * scale;
// o_h = sum_s exp(l_s - M) K_s / (exp(sink_h - M) + sum_s exp(l_s - M)); K = V.
//
// Layout: q/out [n, H, d], ring [cap_w, d], comp [cap_rows, d] (F32 or
// compact KV_FP8 rows, unpacked into shared memory as they are fetched:
// cuda_kv_rows.cuh), sel [n, k] (i32), sinks [H], pos [n] (i32, read on the device).
//
// Launch plan (split over keys, "flash decoding"): tokens go in groups of
// k_att_tok_group; for each group, kernel 1 has grid (tokens, H / HG,
// k_att_splits), 256 threads (8 warps), HG = the largest of 8, 4, 2, 1
// dividing H: one block per (token, group of HG heads, key split), so the
// heads of a group share every key load and a decode step keeps
// H/HG * k_att_splits blocks busy. Split s of a token with n_keys keys walks
// keys [s*c, (s+1)*c), c = n_keys / splits rounded up to the tile, and writes
// its running max m, denominator l and unnormalised accumulator to scratch;
// kernel 2 (grid (tokens, H), 128 threads) merges the splits in split order:
// M = max m_s, o = sum_s e^(m_s-M) acc_s, den = e^(sink-M) + sum_s e^(m_s-M) l_s.
// The split geometry depends only on the token's own key count, never on the
// batch, so batched and single-token results are bitwise equal. Each token of
// a launch reads its keys through its own AttKeySource (a by-value table,
// cuda_seqs.cuh), so the single-token sequences of a batched decode step
// share the launch pair (launch_attention_seqs). Shared memory: q of the group
// [HG][d], a key tile [8][d], logits [HG][8]. Keys are walked in tiles of 8:
//   1. warp w fetches key k0 + w (unpacked to f32) into the tile and computes
//      its HG logits (lane-strided partial dots + warp sums); missing or
//      invalid keys get logit -inf and a zero row;
//   2. every warp owns one head and a d / (8 / HG) slice of the output and
//      applies the online softmax update (running max M, running
//      denominator, rescaled accumulators in registers).
// The window is always non-empty and comes first, so M is finite after the
// first tile of split 0 (later splits may hold only invalid selections: their
// m stays -inf and they weigh 0). f32 throughout (the CPU accumulates in
// double: the results agree to f32 rounding).
//
// CPU reference: cpu::attention (src/backend/cpu/cpu_attention.cpp).
#include <algorithm>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_seqs.cuh"

namespace dsv4::cuda {

namespace {

constexpr int k_att_warps = 8;
constexpr int k_att_tile = k_att_warps;        // keys per tile, one per warp
constexpr int k_att_max_epl = 32;              // accumulator floats per lane
constexpr int k_att_splits = 16;               // key splits per (token, head group)
constexpr int k_att_tok_group = k_seq_tokens;  // tokens per launch pair (bounds the scratch; one key source each)

// Partial attention of one key split. Outputs (token t of the group, head h, split s):
// part_ml[((t*H + h)*S + s)*2 + {0,1}] = {m, l}; part_acc[((t*H + h)*S + s)*d + e].
// HG (heads per block) is a template argument so that the per-head loops
// unroll: the HG logits' warp sums of a key are independent shuffle chains the
// warp interleaves (a run-time HG serialised them: 8 x 5 dependent shuffles).
template <int HG>
__global__ void __launch_bounds__(256)
    attention_split_kernel(float* part_acc, float* part_ml, const float* q, SeqTable<AttKeySource> srcs,
                           const int32_t* pos, int H, int64_t d, float scale) {
  pdl_enter();
  extern __shared__ float sm[];
  float* qs = sm;                   // [HG][d]
  float* ks = qs + HG * d;          // [tile][d]
  float* lg = ks + k_att_tile * d;  // [HG][tile]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t t = blockIdx.x;
  const int h0 = blockIdx.y * HG;
  const AttKeySource& src = srcs.at[t];  // sel: this token's row
  const AttQueryKeys qk = att_query_keys(src, pos[t]);
  const int64_t n_keys = qk.n_keys();
  const int S = static_cast<int>(gridDim.z), split = static_cast<int>(blockIdx.z);
  const int64_t chunk = ((n_keys + S - 1) / S + k_att_tile - 1) / k_att_tile * k_att_tile;
  const int64_t k_begin = min(n_keys, split * chunk), k_end = min(n_keys, k_begin + chunk);

  const float* qt = q + (t * H + h0) * d;
  for (int64_t i = threadIdx.x; i < HG * d; i += blockDim.x) qs[i] = qt[i];

  // This warp's share of the output: head hl, elements e_base + lane + 32*i for i < epl.
  constexpr int wph = k_att_warps / HG;
  const int hl = warp / wph;
  const int64_t span = d / wph, e_base = (warp % wph) * span;
  const int epl = static_cast<int>(span / 32);
  float acc[k_att_max_epl];
#pragma unroll
  for (int i = 0; i < k_att_max_epl; ++i) acc[i] = 0.0f;
  float m_run = neg_inf, l_run = 0.0f;
  __syncthreads();

  for (int64_t k0 = k_begin; k0 < k_end; k0 += k_att_tile) {
    // 1. Key k0 + warp into the tile, and its logits for the group's heads.
    const int64_t i = k0 + warp;
    GgmlType key_type = src.ring_type;
    const uint8_t* key = i < k_end ? att_key_row(src, qk, 0, i, d, key_type) : nullptr;
    float* kr = ks + warp * d;
    if (key) {
      warp_load_kv_row(kr, key, d, key_type);
      __syncwarp();
      float part[HG];
#pragma unroll
      for (int h = 0; h < HG; ++h) part[h] = 0.0f;
      for (int64_t e = lane; e < d; e += 32) {
        const float kv = kr[e];
#pragma unroll
        for (int h = 0; h < HG; ++h) part[h] = fmaf(qs[h * d + e], kv, part[h]);
      }
#pragma unroll
      for (int h = 0; h < HG; ++h) part[h] = warp_sum(part[h]);
      if (lane == 0)
#pragma unroll
        for (int h = 0; h < HG; ++h) lg[h * k_att_tile + warp] = part[h] * scale;
    } else {
      for (int64_t e = lane; e < d; e += 32) kr[e] = 0.0f;
      if (lane < HG) lg[lane * k_att_tile + warp] = neg_inf;
    }
    __syncthreads();

    // 2. Online softmax update of this warp's head and slice.
    float mt = neg_inf;
#pragma unroll
    for (int kk = 0; kk < k_att_tile; ++kk) mt = fmaxf(mt, lg[hl * k_att_tile + kk]);
    const float m_new = fmaxf(m_run, mt);
    const float alpha = m_run == neg_inf ? 0.0f : expf(m_run - m_new);
    float pk[k_att_tile];
    float psum = 0.0f;
#pragma unroll
    for (int kk = 0; kk < k_att_tile; ++kk) {
      const float l = lg[hl * k_att_tile + kk];
      pk[kk] = (l == neg_inf || m_new == neg_inf) ? 0.0f : expf(l - m_new);
      psum += pk[kk];
    }
    l_run = l_run * alpha + psum;
#pragma unroll
    for (int ii = 0; ii < k_att_max_epl; ++ii) {
      if (ii < epl) {
        const int64_t e = e_base + lane + 32 * ii;
        float a = acc[ii] * alpha;
#pragma unroll
        for (int kk = 0; kk < k_att_tile; ++kk) a = fmaf(pk[kk], ks[kk * d + e], a);
        acc[ii] = a;
      }
    }
    m_run = m_new;
    __syncthreads();
  }

  const int64_t slot = (t * H + h0 + hl) * S + split;
  if (warp % wph == 0 && lane == 0) {
    part_ml[2 * slot] = m_run;
    part_ml[2 * slot + 1] = l_run;
  }
  float* o = part_acc + slot * d;
#pragma unroll
  for (int ii = 0; ii < k_att_max_epl; ++ii)
    if (ii < epl) o[e_base + lane + 32 * ii] = acc[ii];
}

// Merges the S splits of (token t, head h) in split order and normalises with
// the sink. The split weights e^(m_s - M) and the denominator are computed once
// per block (thread 0, in split order) and shared; each element then sums its
// S partials in split order. A thread's partials (k_comb_elems elements x S
// splits) are loaded together, the first pass's before thread 0's serial part:
// one global round trip per pass (a load per split inside the sum made S
// dependent round trips per element: 18 us per decode call at d = 512, S = 16).
constexpr int k_comb_elems = 4;
__global__ void __launch_bounds__(128) attention_combine_kernel(float* out, const float* part_acc, const float* part_ml,
                                                                const float* sinks, int H, int S, int64_t d) {
  pdl_enter();
  __shared__ float f[k_att_splits];  // e^(m_s - M); 0 marks a split without keys (m_s = -inf)
  __shared__ unsigned char valid[k_att_splits];
  __shared__ float den_s;
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t t = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int64_t base = (t * H + h) * S;
  float p[k_comb_elems][k_att_splits];
  auto load = [&](int64_t e0) {
#pragma unroll
    for (int q = 0; q < k_comb_elems; ++q) {
      const int64_t e = e0 + q * static_cast<int64_t>(blockDim.x);
#pragma unroll
      for (int s = 0; s < k_att_splits; ++s) p[q][s] = (s < S && e < d) ? part_acc[(base + s) * d + e] : 0.0f;
    }
  };
  load(threadIdx.x);
  if (threadIdx.x == 0) {
    float m[k_att_splits], ls[k_att_splits];
    float M = neg_inf;
#pragma unroll
    for (int s = 0; s < k_att_splits; ++s)
      if (s < S) {  // all loads first (independent), then the chains
        m[s] = part_ml[2 * (base + s)];
        ls[s] = part_ml[2 * (base + s) + 1];
      }
#pragma unroll
    for (int s = 0; s < k_att_splits; ++s)
      if (s < S) M = fmaxf(M, m[s]);
    float l = 0.0f;
#pragma unroll
    for (int s = 0; s < k_att_splits; ++s)
      if (s < S) {
        const bool v = m[s] != neg_inf;
        const float fs = v ? expf(m[s] - M) : 0.0f;
        valid[s] = v;
        f[s] = fs;
        if (v) l = fmaf(fs, ls[s], l);
      }
    den_s = l + expf(sinks[h] - M);
  }
  __syncthreads();
  const float den = den_s;
  float* o = out + (t * H + h) * d;
  for (int64_t e0 = threadIdx.x; e0 < d; e0 += k_comb_elems * static_cast<int64_t>(blockDim.x)) {
    if (e0 != threadIdx.x) load(e0);
#pragma unroll
    for (int q = 0; q < k_comb_elems; ++q) {
      const int64_t e = e0 + q * static_cast<int64_t>(blockDim.x);
      if (e >= d) break;
      float a = 0.0f;
#pragma unroll
      for (int s = 0; s < k_att_splits; ++s)
        if (s < S && valid[s]) a = fmaf(f[s], p[q][s], a);
      o[e] = a / den;
    }
  }
}

}  // namespace

void launch_attention_combine(const CudaContext& ctx, float* out, const float* part_acc, const float* part_ml,
                              const float* sinks, int64_t n, int H, int S, int64_t d) {
  DSV4_ASSERT(S >= 1 && S <= k_att_splits, "attention: %d key splits (at most %d)", S, k_att_splits);
  launch_kernel(attention_combine_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(H)), 128, 0, ctx.stream,
                out, part_acc, part_ml, sinks, H, S, d);
  CUDA_CHECK_LAUNCH();
}

namespace {

// The checks of launch_attention; returns the heads per block HG of the FFMA kernel.
int attention_check(const AttentionOp& op) {
  const int64_t d = op.q.ne[0], H = op.q.ne[1], n = op.q.ne[2];
  const int64_t cap_w = op.ring.n_rows();
  DSV4_ASSERT(cap_w >= op.window, "attention: ring smaller than the window");
  DSV4_ASSERT(op.window >= 1, "attention: window %d", op.window);
  DSV4_ASSERT(op.out.ne[0] == d && op.out.ne[1] == H && op.out.ne[2] == n, "attention: output shape");
  DSV4_ASSERT(op.ring.ne[0] == d && (!op.comp || op.comp.ne[0] == d), "attention: key width");
  check_kv_rows(op.ring, "attention");
  if (op.comp) check_kv_rows(op.comp, "attention");
  DSV4_ASSERT(op.sinks.ne[0] >= H, "attention: %lld sinks for %lld heads", static_cast<long long>(op.sinks.ne[0]),
              static_cast<long long>(H));
  int HG = 8;
  while (H % HG != 0) HG /= 2;
  const int wph = k_att_warps / HG;
  DSV4_ASSERT(d % 128 == 0 && d % (32 * wph) == 0 && d / wph <= 32 * k_att_max_epl,
              "attention: head width %lld unsupported (a multiple of 128, at most %d)", static_cast<long long>(d),
              32 * k_att_max_epl * wph);
  DSV4_ASSERT(n <= 0x7fffffff && H / HG <= 65535, "attention: %lld tokens x %lld heads too many",
              static_cast<long long>(n), static_cast<long long>(H));
  return HG;
}

// Split + combine for nt <= k_att_tok_group tokens: q/out rows and positions
// from q, out, pos; token j's keys from srcs.at[j]; `like` gives the shapes,
// sinks and scale.
void attention_group(const CudaContext& ctx, const AttentionOp& like, int HG, const float* q, float* out,
                     const int32_t* pos, const SeqTable<AttKeySource>& srcs, int64_t nt) {
  const int64_t d = like.q.ne[0], H = like.q.ne[1];
  const size_t smem =
      (static_cast<size_t>(HG) * d + static_cast<size_t>(k_att_tile) * d + static_cast<size_t>(HG) * k_att_tile) *
      sizeof(float);
  const int S = k_att_splits;
  const size_t acc_floats = static_cast<size_t>(nt) * H * S * d, ml_floats = static_cast<size_t>(nt) * H * S * 2;
  float* part_acc = static_cast<float*>(ctx.scratch->get((acc_floats + ml_floats) * sizeof(float), ctx.stream));
  float* part_ml = part_acc + acc_floats;
  auto split = [&](auto kernel) {
    allow_smem(kernel, smem);
    launch_kernel(kernel, dim3(static_cast<unsigned>(nt), static_cast<unsigned>(H / HG), static_cast<unsigned>(S)), 256,
                  smem, ctx.stream, part_acc, part_ml, q, srcs, pos, static_cast<int>(H), d, like.scale);
  };
  if (HG == 8)
    split(attention_split_kernel<8>);
  else if (HG == 4)
    split(attention_split_kernel<4>);
  else if (HG == 2)
    split(attention_split_kernel<2>);
  else
    split(attention_split_kernel<1>);
  CUDA_CHECK_LAUNCH();
  launch_attention_combine(ctx, out, part_acc, part_ml, like.sinks.f32(), nt, static_cast<int>(H), S, d);
}

}  // namespace

void launch_attention(const CudaContext& ctx, const AttentionOp& op) {
  const int HG = attention_check(op);
  const int64_t d = op.q.ne[0], H = op.q.ne[1], n = op.q.ne[2];
  if (n == 0) return;
  if (attention_uses_mma(ctx, op)) {
    launch_attention_mma(ctx, op);
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += k_att_tok_group) {
    const int64_t nt = std::min<int64_t>(k_att_tok_group, n - t0);
    SeqTable<AttKeySource> srcs{};
    for (int64_t j = 0; j < nt; ++j) srcs.at[j] = att_key_source(op, t0 + j);
    attention_group(ctx, op, HG, op.q.f32() + t0 * H * d, op.out.f32() + t0 * H * d, op.pos.i32() + t0, srcs, nt);
  }
}

void launch_attention_seqs(const CudaContext& ctx, std::span<const AttentionOp> ops) {
  // A run shares one kernel (tensor cores or FFMA) and, for the tensor-core kernel's staging, the row formats.
  auto fits = [&](const AttentionOp& op, const AttentionOp& first, size_t k) {
    return op.q.ne[2] == 1 && op.q.ne[0] == first.q.ne[0] && op.q.ne[1] == first.q.ne[1] &&
           op.sinks.data == first.sinks.data && op.scale == first.scale &&
           attention_uses_mma(ctx, op) == attention_uses_mma(ctx, first) && op.ring.type == first.ring.type &&
           static_cast<bool>(op.comp) == static_cast<bool>(first.comp) &&
           (!op.comp || op.comp.type == first.comp.type) &&
           rows_follow(first.q, op.q, k, first.q.row_bytes() * static_cast<size_t>(first.q.ne[1])) &&
           rows_follow(first.out, op.out, k, first.out.row_bytes() * static_cast<size_t>(first.out.ne[1])) &&
           rows_follow(first.pos, op.pos, k, sizeof(int32_t));
  };
  auto batch = [&](std::span<const AttentionOp> run) {
    const AttentionOp& first = run.front();
    SeqTable<AttKeySource> srcs{};
    int HG = 0;
    for (size_t j = 0; j < run.size(); ++j) {
      HG = attention_check(run[j]);
      srcs.at[j] = att_key_source(run[j], 0);
    }
    const int64_t n = static_cast<int64_t>(run.size());
    if (attention_uses_mma(ctx, first))
      launch_attention_mma_tokens(ctx, first, srcs, true, first.q.f32(), first.out.f32(), first.pos.i32(), n);
    else
      attention_group(ctx, first, HG, first.q.f32(), first.out.f32(), first.pos.i32(), srcs, n);
  };
  seq_runs(ops, fits, batch, [&](const AttentionOp& op) { launch_attention(ctx, op); });
}

}  // namespace dsv4::cuda
