// The forward pass over the op list. Shapes in comments use n = tokens of the
// batch, D = n_embd, H = heads, hd = head_dim, hc = mHC streams.
#include "model/forward.h"
#include "model/scratch.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/kv_rows.h"
#include "model/pipeline.h"
#include "model/shape_fit.h"

namespace dsv4 {

// Activation buffers for one batch of up to max_batch tokens.
namespace {

// Elements [i0, i0 + n) of a 1-D I32 tensor (a segment's positions).
Tensor elems(const Tensor& t, int64_t i0, int64_t n) {
  DSV4_ASSERT(t.type == GgmlType::I32 && t.ne[1] == 1 && t.ne[2] == 1 && t.ne[3] == 1 && i0 >= 0 && i0 + n <= t.ne[0],
              "elems(%lld, %lld) of a vector of %lld", static_cast<long long>(i0), static_cast<long long>(n),
              static_cast<long long>(t.ne[0]));
  Tensor v = t;
  v.data = t.i32() + i0;
  v.ne[0] = n;
  return v;
}

double gib(uint64_t b) { return static_cast<double>(b) / static_cast<double>(uint64_t{1} << 30); }

}  // namespace

Model::Model(Backend& backend, const ModelSpec& spec, ModelOptions options)
    : backend_(backend),
      spec_(spec),
      options_(options),
      first_(options.layer_first),
      end_(options.layer_end > 0 ? options.layer_end : spec.n_layer),
      sc_(std::make_unique<Scratch>()) {}

Model::~Model() {
  if (step_graph_) backend_.drop_replay(step_graph_);
  for (const BatchGraph& g : batch_graphs_) backend_.drop_replay(g.id);
  for (Tensor* t : sc_->all()) backend_.free(*t);
  for (Tensor* t : {&dspark_x_, &dspark_pos_, &dspark_state_, &dspark_logit_}) backend_.free(*t);
}

expected<std::unique_ptr<Model>> Model::create(Backend& backend, const ModelWeights& weights, const MtpWeights* mtp,
                                               ModelOptions options) {
  if (options.max_batch < 1) return make_error("max_batch must be at least 1");
  const uint32_t end = options.layer_end > 0 ? options.layer_end : weights.spec.n_layer;
  if (options.layer_first >= end || end > weights.spec.n_layer)
    return make_error("layers %u .. %u are not a range of this model's %u layers", options.layer_first, end,
                      weights.spec.n_layer);
  if (mtp && (options.layer_first > 0 || end < weights.spec.n_layer))
    return make_error("an MTP block runs only with every layer on one backend (this stage has layers %u .. %u)",
                      options.layer_first, end - 1);
  DSV4_TRY(check_numerics_fit(weights.spec, options.numerics));
  if (backend.kind() == BackendKind::CUDA) DSV4_TRY(check_cuda_fit(weights, mtp, options.numerics));
  std::unique_ptr<Model> m(new Model(backend, weights.spec, options));
  const ModelSpec& S = m->spec_;
  const int64_t n = options.max_batch, D = S.n_embd, hc = S.hc_count, H = S.n_head, hd = S.head_dim;
  const int64_t Fs = static_cast<int64_t>(S.expert_ff) * std::max<uint32_t>(1, S.n_expert_shared);
  Scratch& s = *m->sc_;
  using G = GgmlType;
  s.pos = backend.alloc(G::I32, n);
  s.ids = backend.alloc(G::I32, n);
  s.state = backend.alloc(G::F32, D, hc, n);
  s.u = backend.alloc(G::F32, D, n);
  s.xn = backend.alloc(G::F32, D, n);
  s.y = backend.alloc(G::F32, D, n);
  s.ys = backend.alloc(G::F32, D, n);
  s.sh_y = backend.alloc(G::F32, D, 1);
  s.post = backend.alloc(G::F32, hc, n);
  s.comb = backend.alloc(G::F32, hc, hc, n);
  s.qa = backend.alloc(G::F32, S.q_lora_rank, n);
  s.q = backend.alloc(G::F32, hd, H, n);
  s.kv = backend.alloc(G::F32, hd, n);
  s.o = backend.alloc(G::F32, hd, H, n);
  s.la = backend.alloc(G::F32, static_cast<int64_t>(S.o_groups) * S.o_lora_rank, n);
  s.ckv = backend.alloc(G::F32, 2 * hd, n);
  s.cgate = backend.alloc(G::F32, 2 * hd, n);
  s.iq = backend.alloc(G::F32, std::max<uint32_t>(1, S.indexer_head_dim), std::max<uint32_t>(1, S.indexer_heads), n);
  s.iw = backend.alloc(G::F32, std::max<uint32_t>(1, S.indexer_heads), n);
  s.ikv = backend.alloc(G::F32, 2 * std::max<uint32_t>(1, S.indexer_head_dim), n);
  s.igate = backend.alloc(G::F32, 2 * std::max<uint32_t>(1, S.indexer_head_dim), n);
  s.sel = backend.alloc(G::I32, std::max<uint32_t>(1, S.indexer_top_k), n);
  s.router = backend.alloc(G::F32, S.n_expert, n);
  s.experts = backend.alloc(G::I32, S.n_expert_used, n);
  s.weights = backend.alloc(G::F32, S.n_expert_used, n);
  s.sh_g = backend.alloc(G::F32, Fs, n);
  s.sh_u = backend.alloc(G::F32, Fs, n);
  s.sh_h = backend.alloc(G::F32, Fs, n);
  if (m->act_quant(FAST_ATTN_IN | FAST_FFN_IN) != ActQuant::NONE) s.xq = backend.alloc(G::F32, D, n);
  if (m->has_head()) {  // (a pipeline stage before the last has no head)
    s.h = backend.alloc(G::F32, D, n);
    s.hn = backend.alloc(G::F32, D, n);
    s.logits = backend.alloc(G::F32, S.n_vocab, n);
  }
  s.mtp_e = backend.alloc(G::F32, D, 1);
  s.mtp_y = backend.alloc(G::F32, D, hc, 1);
  if (options.count_routing) {
    s.route_log = backend.alloc(G::I32, S.n_expert_used, n * S.n_layer);
    m->routing_ = ExpertStats::zeros(S.n_layer, S.n_expert);
  }
  for (Tensor* t : s.all()) m->placement_.scratch_bytes += t->data ? t->n_bytes() : 0;
  DSV4_TRY(m->upload(weights, mtp));
  return m;
}

Status Model::upload(const ModelWeights& w, const MtpWeights* mtp) {
  auto up = [&](const TensorRef& r, Tensor& dst) -> Status {
    if (!r) return {};
    int64_t ne[4] = {static_cast<int64_t>(r.ne[0]), static_cast<int64_t>(r.ne[1]), static_cast<int64_t>(r.ne[2]),
                     static_cast<int64_t>(r.ne[3])};
    auto t = backend_.upload_weight(r.data, r.type, ne);
    if (!t) return t.error().with_context("uploading " + r.name);
    dst = *t;
    return {};
  };
  auto routed = [](size_t i) {
    return i == static_cast<size_t>(LayerTensor::FFN_GATE_EXPS) || i == static_cast<size_t>(LayerTensor::FFN_UP_EXPS) ||
           i == static_cast<size_t>(LayerTensor::FFN_DOWN_EXPS);
  };
  // Placement (ModelOptions::memory_budget): the dense part's bytes, then the routed experts' per layer.
  // one[il]: one expert of each routed matrix of layer il (an expert's share of the layer's routed bytes).
  const size_t L = w.layers.size();
  WeightPlacement& P = placement_;
  P.n_expert = spec_.n_expert;
  // A pipeline stage (layers [first_, end_)) takes its layers, the embedding when it starts at layer 0
  // and the head tensors when it ends at the last layer.
  const bool whole = first_ == 0 && end_ == spec_.n_layer;
  auto mine = [&](size_t il) { return il >= first_ && il < end_; };
  auto global_here = [&](size_t i) {
    return i == static_cast<size_t>(GlobalTensor::TOKEN_EMBD) ? first_ == 0 : end_ == spec_.n_layer;
  };
  std::vector<uint64_t> one(L, 0);
  uint64_t per_expert = 0;  // one expert of every layer
  for (size_t il = 0; il < L; ++il) {
    for (size_t i = 0; i < w.layers[il].t.size(); ++i)
      if (w.layers[il].t[i] && routed(i) && mine(il)) one[il] += w.layers[il].t[i].expert_bytes();
    per_expert += one[il];
  }
  if (whole) {
    P.dense_bytes = w.n_bytes - per_expert * spec_.n_expert;
  } else {
    for (size_t i = 0; i < w.global.size(); ++i) P.dense_bytes += global_here(i) ? w.global[i].n_bytes : 0;
    for (size_t il = first_; il < end_; ++il)
      for (size_t i = 0; i < w.layers[il].t.size(); ++i) P.dense_bytes += routed(i) ? 0 : w.layers[il].t[i].n_bytes;
  }
  if (mtp) {
    for (const TensorRef& r : mtp->head) P.dense_bytes += r.n_bytes;
    for (const TensorRef& r : mtp->block.t) P.dense_bytes += r.n_bytes;
  }
  DSV4_TRY_ASSIGN(const std::vector<std::vector<uint32_t>> resident, choose_resident(one));
  for (size_t i = 0; i < global_.size(); ++i)
    if (global_here(i)) DSV4_TRY(up(w.global[i], global_[i]));
  layers_.resize(L);
  P.min_resident = spec_.n_expert;
  P.max_resident = 0;
  for (size_t il = first_; il < end_; ++il) {
    const auto n_res = static_cast<uint32_t>(resident[il].size());
    const bool placed = n_res < spec_.n_expert && w.layers[il][LayerTensor::FFN_GATE_EXPS];
    for (size_t i = 0; i < w.layers[il].t.size(); ++i)
      if (!(placed && routed(i))) DSV4_TRY(up(w.layers[il].t[i], layers_[il].t[i]));
    if (placed) DSV4_TRY(place_experts(w.layers[il], layers_[il], resident[il]));
    P.expert_bytes += one[il] * n_res;
    P.host_expert_bytes += one[il] * (spec_.n_expert - n_res);
    P.min_resident = std::min(P.min_resident, n_res);
    P.max_resident = std::max(P.max_resident, n_res);
  }
  if (mtp) {
    for (size_t i = 0; i < mtp->head.size(); ++i) DSV4_TRY(up(mtp->head[i], mtp_head_[i]));
    for (size_t i = 0; i < mtp->block.t.size(); ++i) DSV4_TRY(up(mtp->block.t[i], mtp_block_.t[i]));
    has_mtp_ = true;
  }
  return {};
}

expected<std::vector<std::vector<uint32_t>>> Model::choose_resident(const std::vector<uint64_t>& one) {
  const size_t L = one.size();
  const uint32_t E = spec_.n_expert;
  WeightPlacement& P = placement_;
  std::vector<std::vector<uint8_t>> on(L, std::vector<uint8_t>(E, 1));  // on[il][e]: expert e of layer il resident
  uint64_t per_expert = 0, max_one = 0;  // one expert of every layer; the largest one expert of a layer
  for (uint64_t b : one) {
    per_expert += b;
    max_one = std::max(max_one, b);
  }
  const uint64_t base = P.dense_bytes + P.scratch_bytes + options_.reserve_bytes;
  if (options_.memory_budget > 0 && per_expert > 0 && options_.memory_budget < base + per_expert * E) {
    // Not every expert fits. A prefill batch gathers the host experts it uses into GPU memory (a stage of
    // min(E, batch x k) experts per matrix, the largest layer's size); then as many experts as the rest holds.
    P.stage_bytes = max_one * std::min<uint64_t>(E, static_cast<uint64_t>(options_.max_batch) * spec_.n_expert_used);
    const uint64_t need = base + P.stage_bytes;
    if (options_.memory_budget < need)
      return make_error(
          "a GPU memory budget of %.2f GiB is too small for this model: its dense weights (%.2f GiB), activation "
          "buffers (%.2f GiB), one session's state with working memory (%.2f GiB) and the stage for routed experts "
          "read from host memory (%.2f GiB) need at least %.2f GiB",
          gib(options_.memory_budget), gib(P.dense_bytes), gib(P.scratch_bytes), gib(options_.reserve_bytes),
          gib(P.stage_bytes), gib(need));
    uint64_t left = options_.memory_budget - need;
    for (size_t il = 0; il < L; ++il)
      if (one[il] > 0) std::fill(on[il].begin(), on[il].end(), 0);
    // Candidates in order: the most-used first (ExpertStats counts; ties and no statistics: expert index, then
    // layer, which spreads whole experts evenly over the layers); each taken while the budget holds it.
    const ExpertStats& pri = options_.expert_priority;
    if (!pri.empty() && (pri.n_layer != L || pri.n_expert != E))
      return make_error("routing statistics of %u layers x %u experts do not fit this model (%zu x %u)", pri.n_layer,
                        pri.n_expert, L, E);
    P.by_usage = !pri.empty() && pri.total() > 0;
    std::vector<std::pair<uint32_t, uint32_t>> order;  // (expert, layer)
    order.reserve(L * E);
    for (uint32_t e = 0; e < E; ++e)
      for (uint32_t il = 0; il < L; ++il) order.emplace_back(e, il);
    if (P.by_usage)
      std::stable_sort(order.begin(), order.end(), [&](const auto& x, const auto& y) {
        return pri.at(x.second, x.first) > pri.at(y.second, y.first);
      });
    for (const auto& [e, il] : order)
      if (one[il] > 0 && left >= one[il]) {
        on[il][e] = 1;
        left -= one[il];
      }
  }
  std::vector<std::vector<uint32_t>> resident(L);
  for (size_t il = 0; il < L; ++il)
    for (uint32_t e = 0; e < E; ++e)
      if (on[il][e]) resident[il].push_back(e);
  return resident;
}

Status Model::place_experts(const LayerWeights& w, DeviceLayer& dst, const std::vector<uint32_t>& resident) {
  const uint32_t E = spec_.n_expert;
  const auto n_res = static_cast<int64_t>(resident.size());
  std::vector<int32_t> slots(E, -1);
  for (size_t j = 0; j < resident.size(); ++j) slots[resident[j]] = static_cast<int32_t>(j);
  // Experts 0 .. n-1 are one contiguous range of the file; any other set is copied expert by expert.
  const bool leading = resident.empty() || resident.back() + 1 == resident.size();
  std::vector<uint8_t> piece;
  for (auto [lt, host] :
       {std::pair{LayerTensor::FFN_GATE_EXPS, &dst.gate_host}, std::pair{LayerTensor::FFN_UP_EXPS, &dst.up_host},
        std::pair{LayerTensor::FFN_DOWN_EXPS, &dst.down_host}}) {
    const TensorRef& r = w[lt];
    const int64_t ne[4] = {static_cast<int64_t>(r.ne[0]), static_cast<int64_t>(r.ne[1]), static_cast<int64_t>(r.ne[2]),
                           static_cast<int64_t>(r.ne[3])};
    // The resident experts in slot order. Never a device copy straight from the mapped file: its pages may be
    // registered for the GPU already (map_host_weight), and a copy spanning two registrations is refused. A
    // leading range is uploaded like any weight (the backend's own staging); any other set is written from a
    // plain host buffer, one expert at a time.
    Tensor& dev = dst.t[static_cast<size_t>(lt)];
    if (n_res > 0 && leading) {
      const int64_t ne_dev[4] = {ne[0], ne[1], n_res, 1};
      auto d = backend_.upload_weight(r.data, r.type, ne_dev);
      if (!d)
        return d.error().with_context(
            strfmt("uploading %lld experts of %s", static_cast<long long>(n_res), r.name.c_str()));
      dev = *d;
    } else if (n_res > 0) {
      const size_t eb = r.expert_bytes();
      dev = backend_.alloc(r.type, ne[0], ne[1], n_res);
      piece.resize(eb);
      for (size_t j = 0; j < resident.size(); ++j) {
        std::memcpy(piece.data(), static_cast<const uint8_t*>(r.data) + resident[j] * eb, eb);
        backend_.write(dev, piece.data(), eb, j * eb);
      }
    } else {
      dev = make_tensor(nullptr, r.type, ne[0], ne[1], 0);
    }
    auto h = backend_.map_host_weight(r.data, r.type, ne);
    if (!h) return h.error().with_context("mapping " + r.name + " for the GPU to read from host memory");
    *host = *h;
  }
  dst.slots = backend_.alloc(GgmlType::I32, E);
  backend_.write(dst.slots, slots.data(), slots.size() * sizeof(int32_t));
  return {};
}

void Model::count_routing(int64_t n) {
  if (!options_.count_routing || n <= 0) return;
  const int64_t k = spec_.n_expert_used, L = spec_.n_layer;
  std::vector<int32_t> ex(static_cast<size_t>(L * n * k));
  const Tensor log = sc_->route_log.rows(0, L * n);
  backend_.read(log, ex.data(), log.n_bytes());
  for (int64_t il = first_; il < end_; ++il)
    for (int64_t i = 0; i < n * k; ++i) {
      const int32_t e = ex[static_cast<size_t>(il * n * k + i)];
      if (e >= 0 && static_cast<uint32_t>(e) < spec_.n_expert) ++routing_.at(static_cast<uint32_t>(il), e);
    }
}

RopeParams Model::rope_for_ratio(uint32_t ratio) const {
  RopeParams p;
  p.n_rot = static_cast<int>(spec_.rope_dim);
  if (ratio == 0) {
    p.theta = spec_.rope_theta;  // plain RoPE on window-only layers (and the MTP block)
    return p;
  }
  p.theta = spec_.compress_rope_theta;
  p.yarn = true;
  p.factor = spec_.rope_scale_factor;
  p.orig_ctx = spec_.rope_orig_ctx;
  p.beta_fast = spec_.yarn_beta_fast;
  p.beta_slow = spec_.yarn_beta_slow;
  return p;
}

GgmlType kv_row_type(const ModelSpec& spec, const ModelOptions& options) {
  // KV_FP8 holds the FP8_BF16 simulation's output exactly: 64-blocks over the
  // nope dims, bf16 RoPE tail of k_kv_rope_dims.
  const bool fits = kv_fp8_width_ok(spec.head_dim) && spec.rope_dim == static_cast<uint32_t>(k_kv_rope_dims);
  return simulates_storage(options.numerics) && options.compact_kv && fits ? GgmlType::KV_FP8 : GgmlType::F32;
}

GgmlType indexer_row_type(const ModelSpec& spec, const ModelOptions& options) {
  const bool fits = kv_fp4_width_ok(spec.indexer_head_dim);
  return simulates_storage(options.numerics) && options.compact_kv && fits ? GgmlType::KV_FP4 : GgmlType::F32;
}

uint64_t model_scratch_bytes(const ModelSpec& S, const ModelOptions& options) {
  const uint64_t n = static_cast<uint64_t>(options.max_batch), D = S.n_embd, hc = S.hc_count, hd = S.head_dim;
  const uint64_t HD = static_cast<uint64_t>(S.n_head) * hd, k = S.n_expert_used;
  const uint64_t Fs = static_cast<uint64_t>(S.expert_ff) * std::max<uint32_t>(1, S.n_expert_shared);
  const uint64_t dI = std::max<uint32_t>(1, S.indexer_head_dim), HI = std::max<uint32_t>(1, S.indexer_heads);
  const uint64_t end = options.layer_end > 0 ? options.layer_end : S.n_layer;
  // Per row: pos, ids, state, u/xn/y/ys, post, comb, qa, q, kv, o, la, ckv, cgate, iq, iw, ikv, igate, sel,
  // router, experts, weights, sh_g/sh_u/sh_h; with the head also h, hn, logits.
  uint64_t row = 2 + D * hc + 4 * D + hc + hc * hc + S.q_lora_rank + 2 * HD + hd +
                 static_cast<uint64_t>(S.o_groups) * S.o_lora_rank + 4 * hd + dI * HI + HI + 4 * dI +
                 std::max<uint32_t>(1, S.indexer_top_k) + S.n_expert + 2 * k + 3 * Fs;
  if (end == S.n_layer) row += 2 * D + S.n_vocab;
  if (options.act_quant(FAST_ATTN_IN | FAST_FFN_IN) != ActQuant::NONE) row += D;  // xq
  uint64_t b = 4 * (n * row + D + D + D * hc);                                    // + sh_y, mtp_e, mtp_y
  if (options.count_routing) b += 4 * k * n * S.n_layer;
  return b;
}

uint64_t kv_state_bytes(const ModelSpec& spec, const ModelOptions& options, bool mtp, uint32_t ctx) {
  const uint64_t hd = spec.head_dim, dI = spec.indexer_head_dim;
  const uint64_t kv_row = ggml_row_bytes(kv_row_type(spec, options), hd);
  const uint64_t idx_row = ggml_row_bytes(indexer_row_type(spec, options), dI);
  const uint64_t cap_w = spec.sliding_window + static_cast<uint64_t>(options.max_batch);
  uint64_t b = static_cast<uint64_t>(spec.n_embd) * spec.hc_count * 4;  // last_hidden
  const uint32_t end = options.layer_end > 0 ? options.layer_end : spec.n_layer;
  for (uint32_t il = options.layer_first; il < end; ++il) {
    uint32_t m = spec.ratio(il);
    b += cap_w * kv_row;
    if (m == 0) continue;
    uint64_t c = m == 4 ? 2 : 1;
    b += (ctx / m + 1) * kv_row + 2 * (c * m) * (c * hd) * 4;
    if (m == 4) b += (ctx / 4 + 1) * idx_row + 2 * 8 * 2 * dI * 4;
  }
  if (mtp) b += cap_w * kv_row + static_cast<uint64_t>(spec.n_embd) * spec.hc_count * 4;  // ring, mtp_hidden
  return b;
}

LayerState Model::alloc_layer_state(uint32_t ratio, uint32_t ctx, uint32_t cap_w, bool with_compressor) {
  using G = GgmlType;
  LayerState L;
  const int64_t hd = spec_.head_dim;
  L.ring = backend_.alloc(kv_row_type(spec_, options_), hd, cap_w);
  if (with_compressor && ratio > 0) {
    const bool overlap = ratio == 4;
    L.comp = backend_.alloc(kv_row_type(spec_, options_), hd, ctx / ratio + 1);
    L.comp_a = backend_.alloc(G::F32, (overlap ? 2 : 1) * hd, (overlap ? 2 : 1) * ratio);
    L.comp_g = backend_.alloc(G::F32, (overlap ? 2 : 1) * hd, (overlap ? 2 : 1) * ratio);
    if (ratio == 4) {
      const int64_t dI = spec_.indexer_head_dim;
      L.idx = backend_.alloc(indexer_row_type(spec_, options_), dI, ctx / 4 + 1);
      L.idx_a = backend_.alloc(G::F32, 2 * dI, 8);
      L.idx_g = backend_.alloc(G::F32, 2 * dI, 8);
    }
  }
  return L;
}

KvState Model::new_state(uint32_t ctx) {
  KvState s;
  s.ctx = ctx;
  s.uid = ++next_state_uid_;
  s.cap_w = spec_.sliding_window + static_cast<uint32_t>(options_.max_batch);
  for (uint32_t il = 0; il < spec_.n_layer; ++il)  // (layers of other stages: empty)
    s.layers.push_back(il >= first_ && il < end_ ? alloc_layer_state(spec_.ratio(il), ctx, s.cap_w, true)
                                                 : LayerState{});
  s.last_hidden = backend_.alloc(GgmlType::F32, spec_.n_embd, spec_.hc_count);
  if (has_mtp_) {
    s.mtp = alloc_layer_state(0, ctx, s.cap_w, false);
    s.mtp_hidden = backend_.alloc(GgmlType::F32, spec_.n_embd, spec_.hc_count);
  }
  if (has_dspark_) {
    s.dspark_feat =
        backend_.alloc(GgmlType::F32, spec_.n_embd, static_cast<int64_t>(dspark_meta_.target_layers.size()));
    // One drafting block: the target row and block_size draft rows.
    for (uint32_t st = 0; st < dspark_meta_.stage_count; ++st)
      s.dspark.push_back(alloc_layer_state(0, ctx, dspark_meta_.block_size + 1, false));
  }
  if (next_) s.next.push_back(next_->new_state(ctx));
  reset_state(s);
  return s;
}

void Model::free_state(KvState& s) {
  auto free_layer = [&](LayerState& L) {
    for (Tensor* t : {&L.ring, &L.comp, &L.comp_a, &L.comp_g, &L.idx, &L.idx_a, &L.idx_g}) backend_.free(*t);
  };
  for (auto& L : s.layers) free_layer(L);
  free_layer(s.mtp);
  backend_.free(s.last_hidden);
  backend_.free(s.mtp_hidden);
  backend_.free(s.dspark_feat);
  for (auto& L : s.dspark) free_layer(L);
  s.dspark.clear();
  for (SpecLayer& l : s.spec.layers)
    for (Tensor* t : {&l.snap_a, &l.snap_g, &l.snap_ia, &l.snap_ig, &l.kv, &l.gate, &l.ikv, &l.igate})
      backend_.free(*t);
  for (Tensor* t : {&s.spec.snap_hidden, &s.spec.hidden, &s.spec.pos, &s.spec.snap_feat, &s.spec.feat})
    backend_.free(*t);
  s.spec = SpecLog{};
  s.layers.clear();
  if (next_)
    for (KvState& n : s.next) next_->free_state(n);
  s.next.clear();
}

void Model::reset_state(KvState& s) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto reset_layer = [&](LayerState& L) {
    for (Tensor* t : {&L.ring, &L.comp, &L.comp_a, &L.idx, &L.idx_a})
      if (*t) backend_.fill(*t, 0.0f);
    for (Tensor* t : {&L.comp_g, &L.idx_g})
      if (*t) backend_.fill(*t, neg_inf);
  };
  for (auto& L : s.layers) reset_layer(L);
  reset_layer(s.mtp);
  for (auto& L : s.dspark) reset_layer(L);
  if (s.dspark_feat) backend_.fill(s.dspark_feat, 0.0f);
  backend_.fill(s.last_hidden, 0.0f);
  s.spec.p0 = -1;
  s.spec.n = 0;
  if (next_)
    for (KvState& n : s.next) next_->reset_state(n);
}

void Model::ensure_scores(int64_t rows) {
  if (sc_->score_rows >= rows) return;
  backend_.free(sc_->scores);
  sc_->scores = backend_.alloc(GgmlType::F32, rows, options_.max_batch);
  sc_->score_rows = rows;
}

Tensor Model::stage_state(int64_t n) const {
  const int64_t D = spec_.n_embd, hc = spec_.hc_count;
  return sc_->state.reshape(D, hc, options_.max_batch).rows(0, hc * n).reshape(D, hc, n);
}

Status Model::forward(KvState& s, const int32_t* ids, int64_t n, int64_t p0, float* logits, bool all_logits) {
  if (n <= 0) return make_error("forward: no tokens");
  if (logits && !has_head() && !next_)
    return make_error("forward: this stage (layers %u .. %u) has no head to give logits", first_, end_ - 1);
  if (next_ && s.next.size() != 1) return make_error("forward: a state without the pipeline's later stages");
  if (first_ > 0 && n > options_.max_batch)
    return make_error("forward: a stage that starts at layer %u takes one batch (at most %d tokens) at a time", first_,
                      options_.max_batch);
  if (p0 < 0 || p0 + n > static_cast<int64_t>(s.ctx))
    return make_error("context overflow: %lld + %lld tokens exceed the context of %u", static_cast<long long>(p0),
                      static_cast<long long>(n), s.ctx);
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= spec_.n_vocab)
      return make_error("token id %d at index %lld is outside the vocabulary [0, %u)", ids[i],
                        static_cast<long long>(i), spec_.n_vocab);
  for (int64_t b = 0; b < n; b += options_.max_batch) {
    int64_t nb = std::min<int64_t>(options_.max_batch, n - b);
    bool last = b + nb == n;
    float* out = !logits ? nullptr : all_logits ? logits + b * spec_.n_vocab : (last ? logits : nullptr);
    run_batch(s, ids + b, nb, p0 + b, next_ ? nullptr : out, all_logits);
    if (next_) {  // the batch's state on to the next stage, which runs its layers (and the head, or passes on)
      transport_->move(backend_, stage_state(nb), next_->backend_, next_->stage_state(nb));
      DSV4_TRY(next_->forward(s.next[0], ids + b, nb, p0 + b, out, all_logits));
    }
  }
  return {};
}

ExpertStats Model::routing_counts() const {
  ExpertStats all = routing_;
  for (const Model* m = next_.get(); m; m = m->next_.get())
    for (uint32_t il = m->first_; il < m->end_; ++il)
      for (uint32_t e = 0; e < spec_.n_expert && !all.empty(); ++e) all.at(il, e) += m->routing_.at(il, e);
  return all;
}

// One compressor step (main KV rows or indexer rows) over the batch.
CompressOp Model::compress_op(const Tensor& rows, const Tensor& state_a, const Tensor& state_g, const Tensor& kv,
                              const Tensor& gate, const Tensor& ape, const Tensor& norm_w, const Tensor& pos, int ratio,
                              const RopeParams& rope, KvQuantSim sim, int n_quant, bool round_pooled_bf16) const {
  CompressOp c;
  c.rows = rows;
  c.state_a = state_a;
  c.state_g = state_g;
  c.kv = kv;
  c.gate = gate;
  c.ape = ape;
  c.norm_w = norm_w;
  c.pos = pos;
  c.ratio = ratio;
  c.overlap = ratio == 4;  // ratio-4 layers pool overlapping 8-token windows (model-spec.md §5.5)
  c.eps = spec_.rms_eps;
  c.rope = rope;
  c.sim = sim;
  c.n_quant = n_quant;
  c.round_pooled_bf16 = round_pooled_bf16;
  return c;
}

CompressOp Model::main_compress(const DeviceLayer& L, LayerState& S, uint32_t ratio, const Tensor& kv,
                                const Tensor& gate, const Tensor& pos) const {
  using LT = LayerTensor;
  const bool ref = simulates_storage(options_.numerics);
  return compress_op(S.comp, S.comp_a, S.comp_g, kv, gate, L[LT::ATTN_COMPRESSOR_APE], L[LT::ATTN_COMPRESSOR_NORM], pos,
                     static_cast<int>(ratio), rope_for_ratio(ratio), ref ? KvQuantSim::FP8_BF16 : KvQuantSim::NONE,
                     static_cast<int>(spec_.nope_dim()), ref);
}

CompressOp Model::indexer_compress(const DeviceLayer& L, LayerState& S, const Tensor& ikv, const Tensor& igate,
                                   const Tensor& pos) const {
  using LT = LayerTensor;
  const bool ref = simulates_storage(options_.numerics);
  return compress_op(S.idx, S.idx_a, S.idx_g, ikv, igate, L[LT::INDEXER_COMPRESSOR_APE], L[LT::INDEXER_COMPRESSOR_NORM],
                     pos, 4, rope_for_ratio(4), ref ? KvQuantSim::HADAMARD_FP4 : KvQuantSim::NONE, 0, ref);
}

ActQuant Model::act_quant(unsigned site) const { return options_.act_quant(site); }

void Model::project(const Tensor& x, const std::vector<std::pair<Tensor, Tensor>>& out_w, ActQuant x_quant) {
  // MatmulsOp per weight type, in first-seen order, at most k_max each.
  std::vector<bool> done(out_w.size(), false);
  for (size_t i = 0; i < out_w.size(); ++i) {
    if (done[i]) continue;
    MatmulsOp op;
    op.x = x;
    op.x_quant = x_quant;
    for (size_t j = i; j < out_w.size() && op.count < MatmulsOp::k_max; ++j) {
      if (done[j] || out_w[j].second.type != out_w[i].second.type) continue;
      op.out[op.count] = out_w[j].first;
      op.w[op.count] = out_w[j].second;
      ++op.count;
      done[j] = true;
    }
    backend_.matmuls(op);
  }
}

void Model::attention_block(const DeviceLayer& L, std::span<const Segment> segs, int layer, uint32_t ratio, int64_t n) {
  using LT = LayerTensor;
  Scratch& s = *sc_;
  const ModelSpec& P = spec_;
  const bool ref = simulates_storage(options_.numerics);
  const int64_t H = P.n_head, hd = P.head_dim;
  const RopeParams rope = rope_for_ratio(ratio);
  const bool mtp_block = layer < 0;  // the MTP block or a DSpark stage: window only
  const int dspark_stage = layer <= -2 ? -2 - layer : -1;
  auto state_of = [&](const Segment& g) -> LayerState& {
    if (dspark_stage >= 0) return g.state->dspark[static_cast<size_t>(dspark_stage)];
    return mtp_block ? g.state->mtp : g.state->layers[static_cast<size_t>(layer)];
  };
  Tensor pos = s.pos.head(n);
  Tensor xn = s.xn.rows(0, n);
  // A DSpark block's n rows go to ring slots 0..n-1 and every row sees all of them (dspark_pos_ holds
  // 0..n-1, then n-1 n times); RoPE still uses the rows' own positions (pos).
  const Tensor store_pos = dspark_stage >= 0 ? dspark_pos_.head(n) : pos;
  const Tensor mask_pos = dspark_stage >= 0 ? elems(dspark_pos_, n, n) : pos;

  // Every projection of xn first (wq_a, wkv, the compressors' kv and gate, the
  // indexer's head weights): MatmulsOp per weight type, one kernel each for a
  // decode token. In fast numerics wq_a and wkv (FP8 linears in DeepSeek's
  // code) read xn quantised, the others xn itself.
  const bool compressor = ratio > 0 && !mtp_block, indexer = compressor && ratio == 4;
  const int64_t w_comp = (ratio == 4 ? 2 : 1) * hd;
  const int64_t cap_rows = 2 * hd * options_.max_batch / w_comp;  // the compressor buffers hold [max_batch][2*hd]
  Tensor qa = s.qa.rows(0, n), kv = s.kv.rows(0, n);
  Tensor ckv = s.ckv.reshape(w_comp, cap_rows).rows(0, n), cg = s.cgate.reshape(w_comp, cap_rows).rows(0, n);
  Tensor iw = s.iw.rows(0, n), ikv = s.ikv.rows(0, n), ig = s.igate.rows(0, n);
  {
    std::vector<std::pair<Tensor, Tensor>> lin = {{qa, L[LT::ATTN_Q_A]}, {kv, L[LT::ATTN_KV]}}, other;
    if (compressor) {
      other.push_back({ckv, L[LT::ATTN_COMPRESSOR_KV]});
      other.push_back({cg, L[LT::ATTN_COMPRESSOR_GATE]});
    }
    if (indexer) {
      other.push_back({iw, L[LT::INDEXER_PROJ]});
      other.push_back({ikv, L[LT::INDEXER_COMPRESSOR_KV]});
      other.push_back({ig, L[LT::INDEXER_COMPRESSOR_GATE]});
    }
    // hc_pre's quantised copy of xn in fast numerics
    const Tensor xq = act_quant(FAST_ATTN_IN) != ActQuant::NONE ? s.xq.rows(0, n) : xn;
    if (xq.data == xn.data) {  // one input: every projection together
      lin.insert(lin.end(), other.begin(), other.end());
      other.clear();
    }
    project(xq, lin, act_quant(FAST_ATTN_IN));
    if (!other.empty()) project(xn, other);
  }

  // Query path (§5.1): c_q = RMSNorm(W_qa x; q_norm); q = W_qb c_q, per-head RMSNorm, RoPE.
  // Quantised in place in fast numerics: the input of wq_b and the indexer's wq_b.
  backend_.rms_norm({.out = qa, .x = qa, .w = L[LT::ATTN_Q_A_NORM], .eps = P.rms_eps, .quant = act_quant(FAST_Q)});
  Tensor q = s.q.reshape(hd, H, options_.max_batch).rows(0, n * H).reshape(hd, H, n);
  backend_.matmul({.out = q.reshape(H * hd, n), .w = L[LT::ATTN_Q_B], .x = qa, .x_quant = act_quant(FAST_Q)});
  backend_.rms_norm({.out = q.reshape(hd, H * n),
                     .x = q.reshape(hd, H * n),
                     .w = Tensor{},
                     .eps = P.rms_eps,
                     .rope_pos = pos,
                     .rope = rope,
                     .rope_rows_per_token = H});  // + RoPE

  // KV path (§5.2): kv = RMSNorm(W_kv x; kv_norm), RoPE, FP8 simulation, into the ring.
  // A KV_FP8 ring applies the simulation itself while packing (core/kv_rows.h:
  // unpack(pack(v)) == FP8_BF16 sim of v), so the separate pass only runs for f32 rows.
  backend_.rms_norm({.out = kv,
                     .x = kv,
                     .w = L[LT::ATTN_KV_A_NORM],
                     .eps = P.rms_eps,
                     .rope_pos = pos,
                     .rope = rope,
                     .rope_rows_per_token = 1});                    // + RoPE
  if (ref && state_of(segs.front()).ring.type != GgmlType::KV_FP8)  // one row type for every state
    backend_.quant_sim({kv, KvQuantSim::FP8_BF16, static_cast<int>(P.nope_dim())});
  // The per-sequence ops run over all segments at once (Backend::*_seqs; one op per segment).
  std::vector<StoreRowsOp> stores;
  for (const Segment& g : segs)
    stores.push_back({state_of(g).ring, kv.rows(g.row0, g.n), elems(store_pos, g.row0, g.n)});
  backend_.store_rows_seqs(stores);

  Tensor sel;
  if (compressor) {
    // Compressor (§5.5): rows completed inside this batch become visible to later tokens.
    std::vector<CompressOp> comps;
    for (const Segment& g : segs)
      comps.push_back(
          main_compress(L, state_of(g), ratio, ckv.rows(g.row0, g.n), cg.rows(g.row0, g.n), elems(pos, g.row0, g.n)));
    backend_.compress_seqs(comps);
    // A verified sequence's rows' compressor projections, for commit() to feed a kept prefix again.
    for (const Segment& g : segs) {
      if (mtp_block || !g.state->spec.logging) continue;
      SpecLayer& spec = g.state->spec.layers[static_cast<size_t>(layer)];
      backend_.copy(spec.kv.rows(0, g.n), ckv.rows(g.row0, g.n));
      backend_.copy(spec.gate.rows(0, g.n), cg.rows(g.row0, g.n));
      if (indexer) {
        backend_.copy(spec.ikv.rows(0, g.n), ikv.rows(g.row0, g.n));
        backend_.copy(spec.igate.rows(0, g.n), ig.rows(g.row0, g.n));
      }
    }

    if (indexer) {
      // Lightning indexer (§5.6).
      const int64_t HI = P.indexer_heads, dI = P.indexer_head_dim;
      Tensor iq = s.iq.reshape(dI * HI * options_.max_batch)
                      .reshape(dI, HI * options_.max_batch)
                      .rows(0, HI * n)
                      .reshape(dI, HI, n);
      backend_.matmul(
          {.out = iq.reshape(HI * dI, n), .w = L[LT::INDEXER_ATTN_Q_B], .x = qa, .x_quant = act_quant(FAST_Q)});
      backend_.rope({.x = iq, .pos = pos, .rope = rope, .inverse = false});
      backend_.quant_sim({iq.reshape(dI, HI * n), ref ? KvQuantSim::HADAMARD_FP4 : KvQuantSim::NONE, 0});
      backend_.scale({iw, 1.0f / std::sqrt(static_cast<float>(dI)) / std::sqrt(static_cast<float>(HI))});
      int64_t max_rows = 0;
      for (const Segment& g : segs) max_rows = std::max(max_rows, state_of(g).idx.n_rows());
      ensure_scores(max_rows);
      sel = s.sel.rows(0, n);
      comps.clear();
      std::vector<IndexerScoresOp> scores;
      std::vector<TopKOp> topks;
      for (const Segment& g : segs) {
        LayerState& S = state_of(g);
        const Tensor gpos = elems(pos, g.row0, g.n);
        comps.push_back(indexer_compress(L, S, ikv.rows(g.row0, g.n), ig.rows(g.row0, g.n), gpos));
        const int64_t rows = S.idx.n_rows();
        // [g.n, rows] from row g.row0 of the [max_batch, max_rows] scratch: disjoint per segment.
        Tensor sc = make_tensor(static_cast<float*>(s.scores.data) + g.row0 * max_rows, GgmlType::F32, rows, g.n);
        scores.push_back({.scores = sc,
                          .q = iq.reshape(dI * HI, n).rows(g.row0, g.n).reshape(dI, HI, g.n),
                          .w = iw.rows(g.row0, g.n),
                          .rows = S.idx,
                          .pos = gpos,
                          .ratio = 4,
                          .inputs_bf16 = ref});  // ref: q and rows went through the FP4 simulation
        topks.push_back({.sel = sel.rows(g.row0, g.n), .scores = sc, .pos = gpos, .ratio = 4});
      }
      backend_.compress_seqs(comps);
      backend_.indexer_scores_seqs(scores);
      backend_.topk_seqs(topks);
    }
  }

  // Attention over window + compressed rows (§5.7), inverse RoPE, grouped output projection (§5.8).
  Tensor o = s.o.reshape(hd, H, options_.max_batch).rows(0, H * n).reshape(hd, H, n);
  std::vector<AttentionOp> atts;
  for (const Segment& g : segs) {
    LayerState& S = state_of(g);
    AttentionOp a;
    a.out = o.reshape(hd * H, n).rows(g.row0, g.n).reshape(hd, H, g.n);
    a.q = q.reshape(hd * H, n).rows(g.row0, g.n).reshape(hd, H, g.n);
    a.ring = S.ring;
    a.comp = mtp_block ? Tensor{} : S.comp;
    a.sel = sel ? sel.rows(g.row0, g.n) : Tensor{};
    a.sinks = L[LT::ATTN_SINKS];
    a.pos = elems(mask_pos, g.row0, g.n);
    a.window = dspark_stage >= 0 ? static_cast<int>(n) : static_cast<int>(P.sliding_window);
    a.ratio = mtp_block ? 0 : static_cast<int>(ratio);
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    a.keys_bf16 = ref;  // the ring and the compressed rows went through the FP8/bf16 simulation
    a.fast = options_.numerics == Numerics::FAST;
    atts.push_back(a);
  }
  backend_.attention_seqs(atts);
  backend_.rope({.x = o, .pos = pos, .rope = rope, .inverse = true});
  Tensor la = s.la.rows(0, n);
  backend_.matmul(
      {.out = la, .w = L[LT::ATTN_OUTPUT_A], .x = o.reshape(H * hd, n), .groups = static_cast<int>(P.o_groups)});
  // wo_b reads la quantised in fast numerics (la is not read again: the backend may quantise it in place).
  backend_.matmul({.out = s.y.rows(0, n), .w = L[LT::ATTN_OUTPUT_B], .x = la, .x_quantise = act_quant(FAST_WO_B)});
}

Tensor Model::ffn_block(const DeviceLayer& L, int64_t n, uint32_t il, bool hash) {
  using LT = LayerTensor;
  Scratch& s = *sc_;
  const ModelSpec& P = spec_;
  Tensor xn = s.xn.rows(0, n);
  Tensor y = s.y.rows(0, n);
  const float clamp = P.swiglu_clamp[std::min<size_t>(il, P.swiglu_clamp.size() - 1)];
  // Shared expert (§6.5): independent of the routing. For one token on a
  // backend that overlaps branches (CUDA) it runs as a branch beside the router
  // and the routed experts — the router's small kernels leave most of the GPU
  // idle — into sh_y, added to y after both by the caller's hc_post (y + sh_y:
  // the same single f32 addition as the accumulating down projection, so the
  // same bits; one kernel fewer than an AddOp);
  // otherwise its down projection accumulates into y.
  const bool shexp = static_cast<bool>(L[LT::FFN_GATE_SHEXP]);
  Tensor g = s.sh_g.rows(0, n), u = s.sh_u.rows(0, n), h = s.sh_h.rows(0, n);
  // The experts' input: xn, quantised in fast numerics (hc_pre's copy; the router reads xn itself).
  const Tensor xq = act_quant(FAST_FFN_IN) != ActQuant::NONE ? s.xq.rows(0, n) : xn;
  auto shexp_hidden = [&] {  // h = SwiGLU(W_gate xq, W_up xq), quantised in fast numerics
    project(xq, {{g, L[LT::FFN_GATE_SHEXP]}, {u, L[LT::FFN_UP_SHEXP]}}, act_quant(FAST_FFN_IN));
    backend_.swiglu({.out = h, .gate = g, .up = u, .clamp = clamp, .quant = act_quant(FAST_SHEXP_MID)});
  };
  const bool branch = shexp && n == 1 && backend_.concurrent_branches();
  if (branch) {
    backend_.branch_begin();
    shexp_hidden();
    backend_.matmul({.out = s.sh_y, .w = L[LT::FFN_DOWN_SHEXP], .x = h, .x_quant = act_quant(FAST_SHEXP_MID)});
    backend_.branch_end();
  }
  // Router (§6.1–§6.3) and routed experts (§6.4).
  Tensor router = s.router.rows(0, n), experts = s.experts.rows(0, n), weights = s.weights.rows(0, n);
  backend_.matmul({router, L[LT::FFN_GATE_INP], xn});
  MoeRouteOp r;
  r.experts = experts;
  r.weights = weights;
  r.logits = router;
  r.bias = hash ? Tensor{} : L[LT::EXP_PROBS_B];
  r.hash = hash ? L[LT::FFN_GATE_TID2EID] : Tensor{};
  r.ids = s.ids.head(n);
  r.alpha = P.expert_weights_scale;
  r.normalize = P.expert_weights_norm;
  backend_.moe_route(r);
  backend_.moe_experts({.out = y,
                        .x = xq,
                        .gate = L[LT::FFN_GATE_EXPS],
                        .up = L[LT::FFN_UP_EXPS],
                        .down = L[LT::FFN_DOWN_EXPS],
                        .experts = experts,
                        .weights = weights,
                        .clamp = clamp,
                        .accumulate = false,
                        .mid_quant = act_quant(FAST_EXP_MID),
                        .x_quant = act_quant(FAST_FFN_IN),
                        .slots = L.slots,
                        .gate_host = L.gate_host,
                        .up_host = L.up_host,
                        .down_host = L.down_host});
  if (branch) {
    backend_.branch_join();
    return s.sh_y;  // y += W_down h, in hc_post
  }
  if (shexp) {
    shexp_hidden();
    backend_.matmul({.out = y,
                     .w = L[LT::FFN_DOWN_SHEXP],
                     .x = h,
                     .groups = 1,
                     .accumulate = /*accumulate=*/true,
                     .x_quant = act_quant(FAST_SHEXP_MID)});  // y += W_down h
  }
  return {};
}

void Model::run_batch(KvState& st, const int32_t* ids, int64_t n, int64_t p0, float* logits, bool all_logits) {
  Scratch& s = *sc_;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(p0 + i);
  backend_.write(s.pos, pos.data(), static_cast<size_t>(n) * 4);
  backend_.write(s.ids, ids, static_cast<size_t>(n) * 4);

  // A single-token step is the same op sequence on the same tensors every time
  // (positions and ids are read on the device): record it once, replay it.
  bool done = false;
  if (n == 1) {
    const StepKey key{st.uid, logits != nullptr};
    if (step_graph_ && step_key_ == key) {
      done = backend_.replay(step_graph_);
      if (!done) {  // stale (memory moved since the recording), or the backend wants eager ops now
        backend_.drop_replay(step_graph_);
        step_graph_ = 0;
      }
    }
    if (!done && step_seen_ == key && backend_.capture_begin()) {
      batch_ops(st, 1, logits != nullptr, all_logits);
      if (step_graph_) backend_.drop_replay(step_graph_);
      step_graph_ = backend_.capture_end();
      step_key_ = key;
      done = backend_.replay(step_graph_);
      DSV4_ASSERT(done, "a decode step recorded just now cannot be replayed");
    }
    step_seen_ = key;
  }
  if (!done) batch_ops(st, n, logits != nullptr, all_logits);
  count_routing(n);
  if (logits) {
    const int64_t cnt = all_logits ? n : 1;
    Tensor lg = s.logits.rows(0, cnt);
    backend_.read(lg, logits, lg.n_bytes());
  }
  // A batch of a prompt fills the MTP block's window for its last positions (each paired with the
  // next token of the batch; the last position's row waits for its next token): the rows a draft
  // after the prompt attends to. In chunks of what the scratch holds, oldest first: a chunk's
  // writes to the final state scratch stay below the rows the later chunks read. (A verify pass
  // fills after its commit instead: Session::verify.)
  if (has_mtp_ && n >= 2 && !st.spec.logging) {
    const int64_t D = spec_.n_embd, hc = spec_.hc_count;
    const Tensor final_rows = s.state.reshape(D * hc, options_.max_batch).rows(0, n);
    const int64_t chunk = std::max<int64_t>(1, options_.max_batch / hc);
    for (int64_t r = std::max<int64_t>(0, n - 1 - spec_.sliding_window); r < n - 1; r += chunk) {
      const int64_t m = std::min(chunk, n - 1 - r);
      const Status st_fill = mtp_fill(st, ids + r + 1, final_rows.rows(r, m), m, p0 + r);
      DSV4_ASSERT(st_fill.has_value(), "MTP fill of a checked batch: %s", st_fill.error().message.c_str());
    }
  }
}

// The ops of one batch of n tokens whose positions and ids are already in
// s.pos / s.ids; with `logits`, the head runs for the last token (or all) into s.logits.
void Model::batch_ops(KvState& st, int64_t n, bool logits, bool all_logits) {
  const Segment seg{&st, 0, n};
  const Tensor state = layer_ops(std::span<const Segment>(&seg, 1), n);
  if (!logits) return;
  const int64_t D = spec_.n_embd, hc = spec_.hc_count;
  const int64_t first = all_logits ? 0 : n - 1, cnt = n - first;
  head_ops(state.reshape(D * hc, n).rows(first, cnt).reshape(D, hc, cnt), cnt);
}

void Model::block(const DeviceLayer& L, std::span<const Segment> segs, int layer, uint32_t ratio, uint32_t ffn_index,
                  bool hash, int64_t n) {
  using LT = LayerTensor;
  Scratch& s = *sc_;
  const ModelSpec& P = spec_;
  const bool ref = simulates_storage(options_.numerics);
  const int64_t hc = P.hc_count;
  Tensor state = stage_state(n);
  Tensor u = s.u.rows(0, n), xn = s.xn.rows(0, n), y = s.y.rows(0, n);
  Tensor post = s.post.rows(0, n), comb = s.comb.reshape(hc * hc, options_.max_batch).rows(0, n).reshape(hc, hc, n);
  // hc_pre of a sublayer with its input norm fused in: xn = RMSNorm(u; norm), and in fast numerics
  // its quantised copy xq (the sublayer's FP8 linears' input).
  auto hc_pre = [&](LT fn, LT scale, LT base, LT norm, unsigned site) {
    const ActQuant quant = act_quant(site);
    backend_.hc_pre({.u = u,
                     .post = post,
                     .comb = comb,
                     .state = state,
                     .fn = L[fn],
                     .scale = L[scale],
                     .base = L[base],
                     .norm_eps = P.rms_eps,
                     .hc_eps = P.hc_eps,
                     .sinkhorn_iters = static_cast<int>(P.hc_sinkhorn_iters),
                     .norm_out = xn,
                     .norm_w = L[norm],
                     .norm_rms_eps = P.rms_eps,
                     .norm_q = quant != ActQuant::NONE ? s.xq.rows(0, n) : Tensor{},
                     .norm_quant = quant});
  };
  // Experts partly in host memory: the backend may copy them in while the attention runs.
  if (L.slots)
    backend_.moe_prefetch({.slots = L.slots,
                           .gate_host = L.gate_host,
                           .up_host = L.up_host,
                           .down_host = L.down_host,
                           .n = n,
                           .k = static_cast<int64_t>(P.n_expert_used)});
  hc_pre(LT::HC_ATTN_FN, LT::HC_ATTN_SCALE, LT::HC_ATTN_BASE, LT::ATTN_NORM, FAST_ATTN_IN);
  attention_block(L, segs, layer, ratio, n);
  backend_.hc_post({.state = state, .y = y, .post = post, .comb = comb, .round_bf16 = ref});
  hc_pre(LT::HC_FFN_FN, LT::HC_FFN_SCALE, LT::HC_FFN_BASE, LT::FFN_NORM, FAST_FFN_IN);
  const Tensor y2 = ffn_block(L, n, ffn_index, hash);
  if (options_.count_routing && layer >= 0 && sc_->route_log)
    backend_.copy(sc_->route_log.rows(layer * n, n), sc_->experts.rows(0, n));
  backend_.hc_post({.state = state, .y = y, .post = post, .comb = comb, .round_bf16 = ref, .y2 = y2});
  // DSpark target features: the layer's output state averaged over the streams, of each sequence's
  // last row (and, in verify(), of every row, for commit()).
  if (const int j = has_dspark_ && layer >= 0 ? dspark_target(static_cast<uint32_t>(layer)) : -1; j >= 0) {
    const int64_t T = static_cast<int64_t>(dspark_meta_.target_layers.size());
    for (const Segment& g : segs) {
      average_streams(state, g.row0 + g.n - 1, g.state->dspark_feat.rows(j, 1));
      if (g.state->spec.logging)
        for (int64_t r = 0; r < g.n; ++r) average_streams(state, g.row0 + r, g.state->spec.feat.rows(r * T + j, 1));
    }
  }
}

Tensor Model::layer_ops(std::span<const Segment> segs, int64_t n) {
  using GT = GlobalTensor;
  Scratch& s = *sc_;
  const ModelSpec& P = spec_;
  const int64_t D = P.n_embd, hc = P.hc_count;
  Tensor state = stage_state(n);
  if (first_ == 0) backend_.embed({state, global_[static_cast<size_t>(GT::TOKEN_EMBD)], s.ids.head(n)});
  for (uint32_t il = first_; il < end_; ++il)
    block(layers_[il], segs, static_cast<int>(il), P.ratio(il), il, P.is_hash_layer(il), n);
  // Each sequence's last token's final state feeds its MTP block.
  for (const Segment& g : segs)
    backend_.copy(g.state->last_hidden, state.reshape(D * hc, n).rows(g.row0 + g.n - 1, 1).reshape(D, hc));
  for (const Segment& g : segs)  // a verified sequence: every row's, for commit()
    if (g.state->spec.logging)
      backend_.copy(g.state->spec.hidden.reshape(D * hc, Model::k_max_verify).rows(0, g.n),
                    state.reshape(D * hc, n).rows(g.row0, g.n));
  return state;
}

void Model::head_ops(const Tensor& state_rows, int64_t cnt) {
  using GT = GlobalTensor;
  Scratch& s = *sc_;
  const ModelSpec& P = spec_;
  // Head (§7): hc_head -> RMSNorm -> logits.
  Tensor h = s.h.rows(0, cnt), hn = s.hn.rows(0, cnt), lg = s.logits.rows(0, cnt);
  backend_.hc_head({.h = h,
                    .state = state_rows,
                    .fn = global_[static_cast<size_t>(GT::OUTPUT_HC_FN)],
                    .scale = global_[static_cast<size_t>(GT::OUTPUT_HC_SCALE)],
                    .base = global_[static_cast<size_t>(GT::OUTPUT_HC_BASE)],
                    .norm_eps = P.rms_eps,
                    .hc_eps = P.hc_eps});
  backend_.rms_norm({.out = hn, .x = h, .w = global_[static_cast<size_t>(GT::OUTPUT_NORM)], .eps = P.rms_eps});
  backend_.matmul({lg, global_[static_cast<size_t>(GT::OUTPUT)], hn});
}

Status Model::step(std::span<const StepItem> items) {
  if (items.empty()) return make_error("step: no sequences");
  if (items.size() == 1) {  // one sequence: forward() (its recorded decode step included) or verify()
    const StepItem& it = items[0];
    if (!it.state) return make_error("step: item 0 has no state");
    if (it.all_logits) return verify(*it.state, it.ids, it.n, it.p0, it.all_logits);
    return forward(*it.state, it.ids, it.n, it.p0, it.logits, false);
  }
  int64_t total = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const StepItem& it = items[k];
    if (!it.state || !it.ids || it.n <= 0) return make_error("step: item %zu has no tokens", k);
    for (size_t j = 0; j < k; ++j)
      if (items[j].state == it.state) return make_error("step: items %zu and %zu are the same sequence", j, k);
    if (it.p0 < 0 || it.p0 + it.n > static_cast<int64_t>(it.state->ctx))
      return make_error("context overflow: %lld + %lld tokens exceed the context of %u (step item %zu)",
                        static_cast<long long>(it.p0), static_cast<long long>(it.n), it.state->ctx, k);
    for (int64_t i = 0; i < it.n; ++i)
      if (it.ids[i] < 0 || static_cast<uint32_t>(it.ids[i]) >= spec_.n_vocab)
        return make_error("token id %d at index %lld of step item %zu is outside the vocabulary [0, %u)", it.ids[i],
                          static_cast<long long>(i), k, spec_.n_vocab);
    total += it.n;
  }
  if (total > options_.max_batch)
    return make_error("step: %lld tokens exceed the batch of %d", static_cast<long long>(total), options_.max_batch);
  if (!has_head() && !next_)
    for (const StepItem& it : items)
      if (it.logits || it.all_logits)
        return make_error("step: this stage (layers %u .. %u) has no head to give logits", first_, end_ - 1);
  if (next_)
    for (const StepItem& it : items)
      if (it.state->next.size() != 1) return make_error("step: a state without the pipeline's later stages");
  for (const StepItem& it : items)  // verify items: checked and their frontiers saved before anything runs
    if (it.all_logits) DSV4_TRY(begin_verify(*it.state, it.n));

  // A batched decode step runs its items in uid order (the rows of a recording are fixed).
  std::vector<size_t> order(items.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  const bool decode =
      std::all_of(items.begin(), items.end(), [](const StepItem& it) { return it.n == 1 && !it.all_logits; });
  if (decode)
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return items[a].state->uid < items[b].state->uid; });

  Scratch& s = *sc_;
  std::vector<Segment> segs;
  std::vector<int32_t> pos, ids;
  std::vector<int64_t> heads;
  std::vector<uint64_t> key;
  pos.reserve(static_cast<size_t>(total));
  ids.reserve(static_cast<size_t>(total));
  for (size_t k : order) {
    const StepItem& it = items[k];
    segs.push_back(Segment{it.state, static_cast<int64_t>(pos.size()), it.n});
    for (int64_t i = 0; i < it.n; ++i) pos.push_back(static_cast<int32_t>(it.p0 + i));
    ids.insert(ids.end(), it.ids, it.ids + it.n);
    heads.push_back(next_ ? 0 : it.all_logits ? it.n : it.logits ? 1 : 0);  // (a pipeline: the last stage's)
    key.push_back(it.state->uid * 2 + (it.logits ? 1 : 0));
  }
  backend_.write(s.pos, pos.data(), pos.size() * 4);
  backend_.write(s.ids, ids.data(), ids.size() * 4);

  // A batched decode step is the same op sequence on the same tensors while
  // its sessions stay the same (positions and ids are read on the device):
  // recorded on its second occurrence (the first sizes every buffer), replayed after.
  bool done = false;
  if (decode && items.size() <= k_batch_graph_rows) {
    ++batch_clock_;
    auto it =
        std::find_if(batch_graphs_.begin(), batch_graphs_.end(), [&](const BatchGraph& g) { return g.key == key; });
    if (it != batch_graphs_.end()) {
      done = backend_.replay(it->id);
      if (done) {
        it->used = batch_clock_;
      } else {  // stale (memory moved since the recording), or the backend wants eager ops now
        backend_.drop_replay(it->id);
        batch_graphs_.erase(it);
      }
    }
    if (!done && batch_seen_ == key && backend_.capture_begin()) {
      step_ops(segs, total, heads);
      BatchGraph g{key, backend_.capture_end(), batch_clock_};
      done = backend_.replay(g.id);
      DSV4_ASSERT(done, "a batched decode step recorded just now cannot be replayed");
      if (batch_graphs_.size() >= k_batch_graphs) {
        auto lru = std::min_element(batch_graphs_.begin(), batch_graphs_.end(),
                                    [](const BatchGraph& a, const BatchGraph& b) { return a.used < b.used; });
        backend_.drop_replay(lru->id);
        batch_graphs_.erase(lru);
      }
      batch_graphs_.push_back(std::move(g));
    }
    batch_seen_ = std::move(key);
  }
  for (const StepItem& it : items) it.state->spec.logging = it.all_logits != nullptr;
  if (!done) step_ops(segs, total, heads);
  count_routing(total);
  if (next_) {
    // The rows on to the next stage, whose states are created with these (Model::new_state), so a decode
    // step orders them by uid as here: the same rows in the same order.
    transport_->move(backend_, stage_state(total), next_->backend_, next_->stage_state(total));
    std::vector<StepItem> later(items.begin(), items.end());
    for (StepItem& it : later) it.state = &it.state->next[0];
    if (decode)
      for (size_t k = 1; k < order.size(); ++k)
        DSV4_ASSERT(later[order[k - 1]].state->uid < later[order[k]].state->uid,
                    "pipeline: the stages order a decode step's sequences differently");
    return next_->step(later);
  }

  const size_t V = spec_.n_vocab;
  int64_t j = 0;
  for (size_t k : order) {
    const StepItem& it = items[k];
    if (it.all_logits) {
      it.state->spec.logging = false;
      it.state->spec.p0 = it.p0;
      it.state->spec.n = it.n;
      backend_.read(s.logits.rows(j, it.n), it.all_logits, static_cast<size_t>(it.n) * V * sizeof(float));
      j += it.n;
    } else if (it.logits) {
      backend_.read(s.logits.rows(j++, 1), it.logits, V * sizeof(float));
    }
  }
  return {};
}

void Model::step_ops(std::span<const Segment> segs, int64_t total, const std::vector<int64_t>& heads) {
  const Tensor state = layer_ops(segs, total);
  // The head over the last heads[k] rows of every segment, moved to rows [0, cnt)
  // of the final state first, row by row in order (a segment's rows to head start
  // at or after the rows headed before it, so no row is overwritten before it is moved).
  const int64_t D = spec_.n_embd, hc = spec_.hc_count;
  const Tensor flat = state.reshape(D * hc, total);
  int64_t cnt = 0;
  for (size_t k = 0; k < segs.size(); ++k) {
    for (int64_t r = segs[k].row0 + segs[k].n - heads[k]; r < segs[k].row0 + segs[k].n; ++r) {
      if (r != cnt) backend_.copy(flat.rows(cnt, 1), flat.rows(r, 1));
      ++cnt;
    }
  }
  if (cnt > 0) head_ops(flat.rows(0, cnt).reshape(D, hc, cnt), cnt);
}

Status Model::mtp_fill(KvState& st, const int32_t* next, const Tensor& hidden, int64_t n, int64_t p0) {
  using MT = MtpTensor;
  using GT = GlobalTensor;
  if (!has_mtp_) return make_error("no MTP block loaded (use --mtp FILE)");
  const ModelSpec& P = spec_;
  const int64_t D = P.n_embd, hc = P.hc_count;
  if (n < 1 || n * hc > options_.max_batch || p0 < 0 || p0 + n > static_cast<int64_t>(st.ctx))
    return make_error("MTP fill: %lld rows at %lld", static_cast<long long>(n), static_cast<long long>(p0));
  for (int64_t r = 0; r < n; ++r)
    if (next[r] < 0 || static_cast<uint32_t>(next[r]) >= P.n_vocab)
      return make_error("MTP: token %d outside the vocabulary", next[r]);
  Scratch& s = *sc_;
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) pos[static_cast<size_t>(r)] = static_cast<int32_t>(p0 + r);
  backend_.write(s.pos, pos.data(), pos.size() * 4);
  backend_.write(s.ids, next, static_cast<size_t>(n) * 4);
  const int64_t rows = n * hc;  // every (row, stream) pair
  Tensor state = s.state.reshape(D, hc, options_.max_batch).rows(0, rows).reshape(D, hc, n);
  // Y = W_h RMSNorm(X; hnorm) + W_e RMSNorm(embed[next]; enorm), over all n * hc rows (the embedding
  // repeated per stream, so the sum is row by row).
  Tensor e = s.u.rows(0, rows), ye = s.ys.rows(0, rows), hn = s.xn.rows(0, rows);
  backend_.embed({e.reshape(D, hc, n), global_[static_cast<size_t>(GT::TOKEN_EMBD)], s.ids.head(n)});
  // (e and hn quantised in place in fast numerics: the projections' input.)
  backend_.rms_norm({.out = e,
                     .x = e,
                     .w = mtp_head_[static_cast<size_t>(MT::ENORM)],
                     .eps = P.rms_eps,
                     .quant = act_quant(FAST_MTP)});
  backend_.matmul({.out = ye, .w = mtp_head_[static_cast<size_t>(MT::E_PROJ)], .x = e, .x_quant = act_quant(FAST_MTP)});
  const Tensor x = hidden.reshape(D * hc, hidden.n_elements() / (D * hc)).rows(0, n).reshape(D, rows);
  backend_.rms_norm({.out = hn,
                     .x = x,
                     .w = mtp_head_[static_cast<size_t>(MT::HNORM)],
                     .eps = P.rms_eps,
                     .quant = act_quant(FAST_MTP)});
  backend_.matmul({.out = state.reshape(D, rows),
                   .w = mtp_head_[static_cast<size_t>(MT::H_PROJ)],
                   .x = hn,
                   .x_quant = act_quant(FAST_MTP)});
  backend_.add({state.reshape(D, rows), ye});
  const Segment seg{&st, 0, n};
  block(mtp_block_, std::span<const Segment>(&seg, 1), /*layer=*/-1, 0, P.n_layer, false, n);
  return {};
}

Status Model::mtp_forward(KvState& st, int32_t token, int64_t p, float* logits, bool chain) {
  using MT = MtpTensor;
  using GT = GlobalTensor;
  if (!has_mtp_) return make_error("no MTP block loaded (use --mtp FILE)");
  if (token < 0 || static_cast<uint32_t>(token) >= spec_.n_vocab)
    return make_error("MTP: token %d outside the vocabulary", token);
  if (p < 0 || p >= static_cast<int64_t>(st.ctx))
    return make_error("MTP: position %lld outside the context", static_cast<long long>(p));
  Scratch& s = *sc_;
  const ModelSpec& P = spec_;
  const int64_t D = P.n_embd, hc = P.hc_count;
  const int32_t pos = static_cast<int32_t>(p);
  backend_.write(s.pos, &pos, 4);
  backend_.write(s.ids, &token, 4);
  Tensor state = s.state.reshape(D, hc, options_.max_batch).rows(0, hc).reshape(D, hc, 1);

  // e = RMSNorm(embed[token]; enorm); Y_i = W_e e + W_h RMSNorm(X_i; hnorm).
  Tensor e = s.mtp_e;
  Tensor emb = s.mtp_y;  // [1, hc, D] scratch: embedding broadcast
  backend_.embed({emb, global_[static_cast<size_t>(GT::TOKEN_EMBD)], s.ids.head(1)});
  Tensor e_row = emb.reshape(D, hc).rows(0, 1);
  backend_.rms_norm({.out = e,
                     .x = e_row,
                     .w = mtp_head_[static_cast<size_t>(MT::ENORM)],
                     .eps = P.rms_eps,
                     .quant = act_quant(FAST_MTP)});
  backend_.matmul({.out = s.ys.rows(0, 1),
                   .w = mtp_head_[static_cast<size_t>(MT::E_PROJ)],
                   .x = e,
                   .x_quant = act_quant(FAST_MTP)});
  Tensor hnorm = s.h.rows(0, 1);
  for (int64_t i = 0; i < hc; ++i) {
    Tensor xi = (chain ? st.mtp_hidden : st.last_hidden).rows(i, 1);
    backend_.rms_norm({.out = hnorm,
                       .x = xi,
                       .w = mtp_head_[static_cast<size_t>(MT::HNORM)],
                       .eps = P.rms_eps,
                       .quant = act_quant(FAST_MTP)});
    Tensor yi = state.reshape(D, hc).rows(i, 1);
    backend_.matmul(
        {.out = yi, .w = mtp_head_[static_cast<size_t>(MT::H_PROJ)], .x = hnorm, .x_quant = act_quant(FAST_MTP)});
    backend_.add({yi, s.ys.rows(0, 1)});
  }
  // One block: window-only attention with plain RoPE, top-k MoE with bias.
  const Segment seg{&st, 0, 1};
  block(mtp_block_, std::span<const Segment>(&seg, 1), /*layer=*/-1, 0, P.n_layer, false, 1);
  backend_.copy(st.mtp_hidden, state.reshape(D, hc));  // a chained draft's input
  // Head with the MTP block's own hc_head and norm, the shared output matrix.
  Tensor h = s.h.rows(0, 1), hn = s.hn.rows(0, 1), lg = s.logits.rows(0, 1);
  backend_.hc_head({.h = h,
                    .state = state,
                    .fn = mtp_head_[static_cast<size_t>(MT::HC_HEAD_FN)],
                    .scale = mtp_head_[static_cast<size_t>(MT::HC_HEAD_SCALE)],
                    .base = mtp_head_[static_cast<size_t>(MT::HC_HEAD_BASE)],
                    .norm_eps = P.rms_eps,
                    .hc_eps = P.hc_eps});
  backend_.rms_norm({.out = hn, .x = h, .w = mtp_head_[static_cast<size_t>(MT::NORM)], .eps = P.rms_eps});
  backend_.matmul({lg, global_[static_cast<size_t>(GT::OUTPUT)], hn});
  backend_.read(lg, logits, lg.n_bytes());
  return {};
}

}  // namespace dsv4
