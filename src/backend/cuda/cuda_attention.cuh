// Core attention on the device (model-spec.md §5.7): the launcher, and the key
// set of one query shared by its two kernels (cuda_attention.cu: FFMA, split
// over keys, any batch; cuda_attention_mma.cu: tensor cores, prefill batches).
#pragma once

#include <span>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kv_rows.cuh"
#include "backend/cuda/cuda_seqs.cuh"

namespace dsv4::cuda {

void launch_attention(const CudaContext& ctx, const AttentionOp& op);
// The ops of single-token sequences in one launch pair (cuda_seqs.cuh), the others one by one.
void launch_attention_seqs(const CudaContext& ctx, std::span<const AttentionOp> ops);

// True when launch_attention runs `op` (n tokens) on the tensor-core kernel.
bool attention_uses_mma(const CudaContext& ctx, const AttentionOp& op);
void launch_attention_mma(const CudaContext& ctx, const AttentionOp& op);

// out[t, h, :] for t < n from S <= 16 key splits' partial states (split s of (t, h) at
// slot (t H + h) S + s: part_ml[2 slot + {0, 1}] = {m, l}, part_acc[slot d ..] = unnormalised O):
// M = max m_s, o = sum_s e^(m_s - M) O_s / (e^(sink_h - M) + sum_s e^(m_s - M) l_s), splits in order.
void launch_attention_combine(const CudaContext& ctx, float* out, const float* part_acc, const float* part_ml,
                              const float* sinks, int64_t n, int H, int S, int64_t d);

// The KV state an attention call reads (device pointers; sel [n, n_sel] i32 or null).
struct AttKeySource {
  const void* ring;
  GgmlType ring_type;
  int64_t cap_w;
  const void* comp;  // null: window only
  GgmlType comp_type;
  int64_t comp_rows;
  const int32_t* sel;
  int64_t n_sel;
  int window, ratio;
};

// The tensor-core kernel over n tokens: q/out rows and positions from q, out,
// pos; the keys of every token from srcs.at[0] (its sel row = the token's
// index), or with per_token (n <= k_seq_tokens, each token a decode token of
// its own sequence) token j's from srcs.at[j] (sel row 0 of it). `like` gives
// the shapes, row formats, sinks and scale.
void launch_attention_mma_tokens(const CudaContext& ctx, const AttentionOp& like, const SeqTable<AttKeySource>& srcs,
                                 bool per_token, const float* q, float* out, const int32_t* pos, int64_t n);

inline AttKeySource att_key_source(const AttentionOp& op, int64_t t0) {
  const int64_t n_sel = op.sel ? op.sel.ne[0] : 0;
  return {op.ring.data,
          op.ring.type,
          op.ring.n_rows(),
          op.comp ? op.comp.data : nullptr,
          op.comp ? op.comp.type : GgmlType::F32,
          op.comp ? op.comp.n_rows() : 0,
          op.sel ? op.sel.i32() + t0 * n_sel : nullptr,
          n_sel,
          op.window,
          op.ratio};
}

// Keys of the query at position p: index i < n_win is the window row of
// position p_first + i (ring slot = position % cap_w; the window always holds
// p itself, so n_win >= 1), then n_comp compressed rows: all visible rows
// (k < visible = floor((p + 1) / ratio)) or the query's selection.
struct AttQueryKeys {
  int64_t p_first, n_win, visible, n_comp;
  __device__ int64_t n_keys() const { return n_win + n_comp; }
};

__device__ __forceinline__ AttQueryKeys att_query_keys(const AttKeySource& s, int64_t p) {
  AttQueryKeys k;
  k.p_first = p - s.window + 1 > 0 ? p - s.window + 1 : 0;
  k.n_win = p - k.p_first + 1;
  k.visible = 0;
  k.n_comp = 0;
  if (s.ratio > 0 && s.comp) {
    k.visible = min(static_cast<int64_t>((p + 1) / s.ratio), s.comp_rows);
    k.n_comp = s.sel ? s.n_sel : k.visible;
  }
  return k;
}

// Row index of key i (< n_keys) of token t (index into sel): the ring slot
// (i < n_win) or the compressed row; a selection entry is returned as read,
// att_key_present tells whether it names a row (>= 0 and visible).
__device__ __forceinline__ int64_t att_key_index(const AttKeySource& s, const AttQueryKeys& k, int64_t t, int64_t i) {
  if (i < k.n_win) return (k.p_first + i) % s.cap_w;
  return s.sel ? s.sel[t * s.n_sel + (i - k.n_win)] : i - k.n_win;
}
__device__ __forceinline__ bool att_key_present(const AttQueryKeys& k, int64_t i, int64_t idx) {
  return i < k.n_win || (idx >= 0 && idx < k.visible);
}

// Row of key i (< n_keys) of token t and its format; null for a missing key
// (a selection entry < 0 or not visible yet).
__device__ __forceinline__ const uint8_t* att_key_row(const AttKeySource& s, const AttQueryKeys& k, int64_t t,
                                                      int64_t i, int64_t d, GgmlType& type) {
  const int64_t idx = att_key_index(s, k, t, i);
  if (!att_key_present(k, i, idx)) return nullptr;
  const bool win = i < k.n_win;
  type = win ? s.ring_type : s.comp_type;
  return kv_row_ptr(win ? s.ring : s.comp, type, d, idx);
}

}  // namespace dsv4::cuda
