// The DSpark drafter (ds4-variants-mtp-dspark.md §4.2): one pass over a block of 1 + B rows gives B
// proposals.
//
//   target features  f_j = mean over the hc streams of main layer target[j]'s output state, of the
//                    last fed token (Model::block captures them; T target layers)
//   main_x           = RMSNorm(W_main · [f_0 | ... | f_{T-1}]; main_norm)                     [D]
//   block rows       row 0 = main_x in every stream (the target row, at position L);
//                    rows 1..B = embed[t_L], embed[noise] x (B - 1), at positions L .. L + B - 1
//   stage S          an ordinary block (mHC, attention, MoE with biased top-k) whose attention is
//                    window-only over the block's own rows, every row seeing all 1 + B (non-causal;
//                    the stage's ring holds just them); row 0 is main_x again before each stage
//   head             hc_head of the last stage → RMSNorm(norm) → hidden_i (rows 1..B), and
//                    logits_i = W_out · hidden_i (the main output matrix)
//   Markov           sequentially, prev_0 = t_L, prev_i = proposal_{i-1}: m_i = W1[prev_i] (R values),
//                    logits_i += W2 · m_i, proposal_i = argmax logits_i
//   confidence       c_i = sigmoid(w_c · [hidden_i | m_i]); the proposals are the longest prefix
//                    with c_i >= threshold
// Proposal i stands for the token at L + 1 + i: the first one duplicates the model's own next token.
//
// The support window of earlier target rows (§4.4) is not kept: as the reference's own reading notes,
// its rollback leaves the drafter attending to the current block only, which is what this does.
#include <algorithm>
#include <cmath>

#include "model/forward.h"
#include "model/scratch.h"

namespace dsv4 {

int Model::dspark_target(uint32_t il) const {
  const auto& t = dspark_meta_.target_layers;
  const auto it = std::find(t.begin(), t.end(), il);
  return it == t.end() ? -1 : static_cast<int>(it - t.begin());
}

void Model::average_streams(const Tensor& state, int64_t r, const Tensor& dst_row) {
  const int64_t D = spec_.n_embd, hc = spec_.hc_count;
  const Tensor rows = state.reshape(D, hc * (state.n_elements() / (D * hc)));
  backend_.copy(dst_row, rows.rows(r * hc, 1));
  for (int64_t i = 1; i < hc; ++i) backend_.add({dst_row, rows.rows(r * hc + i, 1)});
  backend_.scale({dst_row, 1.0f / static_cast<float>(hc)});
}

Status Model::attach_dspark(const DSparkWeights& d, DSparkHost host) {
  if (has_dspark_) return make_error("a DSpark drafter is attached already");
  if (first_ > 0 || !has_head())
    return make_error("DSpark runs only with every layer on one backend (this stage has layers %u .. %u)", first_,
                      end_ - 1);
  const DSparkMeta& m = d.meta;
  if (static_cast<int64_t>(m.block_size + 1) * spec_.hc_count > options_.max_batch)
    return make_error("DSpark: a block of %u rows needs a batch of at least %u tokens (--batch)", m.block_size + 1,
                      (m.block_size + 1) * spec_.hc_count);
  auto up = [&](const TensorRef& r, Tensor& dst) -> Status {
    if (!r) return {};
    const int64_t ne[4] = {static_cast<int64_t>(r.ne[0]), static_cast<int64_t>(r.ne[1]), static_cast<int64_t>(r.ne[2]),
                           static_cast<int64_t>(r.ne[3])};
    DSV4_TRY_ASSIGN(dst, backend_.upload_weight(r.data, r.type, ne));
    return {};
  };
  dspark_stages_.resize(d.stages.size());
  for (size_t st = 0; st < d.stages.size(); ++st)
    for (size_t i = 0; i < d.stages[st].t.size(); ++i) DSV4_TRY(up(d.stages[st].t[i], dspark_stages_[st].t[i]));
  for (size_t i = 0; i < d.head.size(); ++i) DSV4_TRY(up(d.head[i], dspark_head_[i]));
  for (const TensorRef& r : d.head) placement_.dense_bytes += r.n_bytes;
  for (const LayerWeights& l : d.stages)
    for (const TensorRef& r : l.t) placement_.dense_bytes += r.n_bytes;
  if (!host.markov_row || host.confidence.size() != static_cast<size_t>(spec_.n_embd + m.markov_rank))
    return make_error("DSpark: the host's Markov rows and confidence projection are missing");
  dspark_host_ = std::move(host);
  const int64_t rows = m.block_size + 1;
  std::vector<int32_t> pos(static_cast<size_t>(2 * rows));
  for (int64_t i = 0; i < rows; ++i) {
    pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);                // ring slots
    pos[static_cast<size_t>(rows + i)] = static_cast<int32_t>(rows - 1);  // every row sees the whole block
  }
  dspark_pos_ = backend_.alloc(GgmlType::I32, 2 * rows);
  backend_.write(dspark_pos_, pos.data(), pos.size() * sizeof(int32_t));
  dspark_x_ = backend_.alloc(GgmlType::F32, spec_.n_embd);
  dspark_state_ = backend_.alloc(GgmlType::F32, m.markov_rank);
  dspark_logit_ = backend_.alloc(GgmlType::F32, spec_.n_vocab);
  dspark_meta_ = m;
  has_dspark_ = true;
  return {};
}

expected<std::vector<int32_t>> Model::dspark_draft(KvState& st, int32_t t_last, int64_t L, float confidence) {
  using DT = DSparkTensor;
  using GT = GlobalTensor;
  if (!has_dspark_) return make_error("no DSpark drafter loaded (use --dspark FILE)");
  if (st.dspark.empty()) return make_error("DSpark: this session was made before the drafter was attached");
  const ModelSpec& P = spec_;
  const DSparkMeta& m = dspark_meta_;
  const int64_t D = P.n_embd, hc = P.hc_count, V = P.n_vocab, R = m.markov_rank, B = m.block_size, n = B + 1;
  if (L < 0 || L + B >= static_cast<int64_t>(st.ctx)) return std::vector<int32_t>{};  // no room to propose
  Scratch& s = *sc_;
  auto head = [&](DT t) { return dspark_head_[static_cast<size_t>(t)]; };

  // main_x from the target features.
  const int64_t T = static_cast<int64_t>(m.target_layers.size());
  backend_.matmul({dspark_x_.reshape(D, 1), head(DT::MAIN_PROJ), st.dspark_feat.reshape(D * T, 1)});
  backend_.rms_norm(
      {.out = dspark_x_.reshape(D, 1), .x = dspark_x_.reshape(D, 1), .w = head(DT::MAIN_NORM), .eps = P.rms_eps});

  // The block: positions L, L, L+1, ..., L+B-1; ids t_L then noise (row 0's id is unused).
  std::vector<int32_t> pos(static_cast<size_t>(n)), ids(static_cast<size_t>(n), static_cast<int32_t>(m.noise_token_id));
  pos[0] = static_cast<int32_t>(L);
  for (int64_t i = 1; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(L + i - 1);
  ids[0] = ids[1] = t_last;
  backend_.write(s.pos, pos.data(), pos.size() * 4);
  backend_.write(s.ids, ids.data(), ids.size() * 4);
  Tensor state = stage_state(n);
  const Tensor flat = state.reshape(D, hc * n);
  backend_.embed({state, global_[static_cast<size_t>(GT::TOKEN_EMBD)], s.ids.head(n)});
  const Segment seg{&st, 0, n};
  for (uint32_t stage = 0; stage < m.stage_count; ++stage) {
    for (int64_t i = 0; i < hc; ++i) backend_.copy(flat.rows(i, 1), dspark_x_.reshape(D, 1));  // the target row
    block(dspark_stages_[stage], std::span<const Segment>(&seg, 1), -2 - static_cast<int>(stage), 0, P.n_layer, false,
          n);
  }

  // Head over the draft rows.
  Tensor h = s.h.rows(0, B), hn = s.hn.rows(0, B), lg = s.logits.rows(0, B);
  backend_.hc_head({.h = h,
                    .state = flat.rows(hc, hc * B).reshape(D, hc, B),
                    .fn = head(DT::HC_HEAD_FN),
                    .scale = head(DT::HC_HEAD_SCALE),
                    .base = head(DT::HC_HEAD_BASE),
                    .norm_eps = P.rms_eps,
                    .hc_eps = P.hc_eps});
  backend_.rms_norm({.out = hn, .x = h, .w = head(DT::NORM), .eps = P.rms_eps});
  backend_.matmul({lg, global_[static_cast<size_t>(GT::OUTPUT)], hn});
  std::vector<float> logits(static_cast<size_t>(B * V)), hidden(static_cast<size_t>(B * D));
  backend_.read(lg, logits.data(), logits.size() * sizeof(float));
  backend_.read(hn, hidden.data(), hidden.size() * sizeof(float));

  // Markov correction and confidence, row by row.
  std::vector<int32_t> out;
  std::vector<float> mstate(static_cast<size_t>(R)), corr(static_cast<size_t>(V));
  int32_t prev = t_last;
  for (int64_t i = 0; i < B; ++i) {
    dspark_host_.markov_row(prev, mstate.data());
    if (confidence > 0) {
      double c = 0;
      const std::vector<float>& w = dspark_host_.confidence;
      for (int64_t k = 0; k < D; ++k)
        c += static_cast<double>(w[static_cast<size_t>(k)]) * hidden[static_cast<size_t>(i * D + k)];
      for (int64_t k = 0; k < R; ++k)
        c += static_cast<double>(w[static_cast<size_t>(D + k)]) * mstate[static_cast<size_t>(k)];
      if (1.0 / (1.0 + std::exp(-c)) < confidence) break;
    }
    backend_.write(dspark_state_, mstate.data(), mstate.size() * sizeof(float));
    backend_.matmul({dspark_logit_.reshape(V, 1), head(DT::MARKOV_W2), dspark_state_.reshape(R, 1)});
    backend_.read(dspark_logit_, corr.data(), corr.size() * sizeof(float));
    float* row = logits.data() + i * V;
    int32_t best = 0;
    for (int64_t v = 0; v < V; ++v) {
      row[v] += corr[static_cast<size_t>(v)];
      if (row[v] > row[best]) best = static_cast<int32_t>(v);
    }
    out.push_back(best);
    prev = best;
  }
  return out;
}

}  // namespace dsv4
