// The layer pipeline (pipeline.h): Model::create_pipeline, the stage transports and the layer split planner.
#include "model/pipeline.h"

#include <algorithm>

#include "core/assert.h"

namespace dsv4 {

void HostTransport::move(Backend& from, const Tensor& src, Backend& to, const Tensor& dst) {
  DSV4_ASSERT(src.n_bytes() == dst.n_bytes(), "stage transport: %zu bytes into %zu", src.n_bytes(), dst.n_bytes());
  buf_.resize(src.n_bytes());
  from.read(src, buf_.data(), buf_.size());
  to.write(dst, buf_.data(), buf_.size());
}

void DirectTransport::move(Backend& from, const Tensor& src, Backend& to, const Tensor& dst) {
  if (!from.copy_to(src, to, dst)) host_.move(from, src, to, dst);
}

expected<std::unique_ptr<Model>> Model::create_pipeline(std::span<Backend* const> backends, const ModelWeights& weights,
                                                        const std::vector<uint32_t>& first, const ModelOptions& options,
                                                        std::span<const StageMemory> memory,
                                                        std::shared_ptr<StageTransport> transport) {
  const uint32_t L = weights.spec.n_layer;
  if (backends.empty() || backends.size() != first.size())
    return make_error("layer pipeline: %zu backends for %zu stages", backends.size(), first.size());
  if (first.front() != 0) return make_error("layer pipeline: the first stage starts at layer %u, not 0", first[0]);
  for (size_t k = 1; k < first.size(); ++k)
    if (first[k] <= first[k - 1] || first[k] >= L)
      return make_error("layer pipeline: stage %zu starts at layer %u (after %u; the model has %u layers)", k, first[k],
                        first[k - 1], L);
  if (!memory.empty() && memory.size() != first.size())
    return make_error("layer pipeline: memory for %zu stages, %zu stages", memory.size(), first.size());
  if (!transport) transport = std::make_shared<DirectTransport>();
  // The last stage first, each earlier one holding the next.
  std::unique_ptr<Model> next;
  for (size_t k = first.size(); k-- > 0;) {
    ModelOptions o = options;
    o.layer_first = first[k];
    o.layer_end = k + 1 < first.size() ? first[k + 1] : L;
    if (!memory.empty()) {
      o.memory_budget = memory[k].budget;
      o.reserve_bytes = memory[k].reserve;
    }
    auto m = Model::create(*backends[k], weights, nullptr, o);
    if (!m)
      return m.error().with_context(strfmt("pipeline stage %zu (layers %u .. %u)", k, o.layer_first, o.layer_end - 1));
    if (next) {
      (*m)->next_ = std::move(next);
      (*m)->transport_ = transport;
    }
    next = std::move(*m);
  }
  return next;
}

namespace {

double gib(uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0); }

}  // namespace

expected<std::vector<uint32_t>> plan_layer_split(const LayerSplitCosts& c, const std::vector<uint64_t>& budgets) {
  const size_t L = c.layer.size(), S = budgets.size();
  if (S == 0) return make_error("layer split: no GPUs");
  if (S > L) return make_error("layer split: %zu GPUs for %zu layers (at least one layer each)", S, L);
  std::vector<uint64_t> prefix(L + 1, 0);
  for (size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + c.layer[i];
  // Bytes of stage k holding layers [i, j).
  auto bytes = [&](size_t k, size_t i, size_t j) {
    return prefix[j] - prefix[i] + c.per_stage + (k == 0 ? c.first_extra : 0) + (k + 1 == S ? c.last_extra : 0);
  };
  constexpr double k_inf = 1e300;
  // best[k][j]: the smallest largest ratio over stages 0..k holding layers [0, j); from[k][j]: stage k's first layer.
  std::vector<std::vector<double>> best(S, std::vector<double>(L + 1, k_inf));
  std::vector<std::vector<size_t>> from(S, std::vector<size_t>(L + 1, 0));
  for (size_t k = 0; k < S; ++k)
    for (size_t j = k + 1; j + (S - 1 - k) <= L; ++j)
      for (size_t i = k; i < j; ++i) {
        const double before = k == 0 ? (i == 0 ? 0.0 : k_inf) : best[k - 1][i];
        const uint64_t b = bytes(k, i, j);
        if (before >= k_inf || b > budgets[k] || budgets[k] == 0) continue;
        const double r = std::max(before, static_cast<double>(b) / static_cast<double>(budgets[k]));
        if (r < best[k][j]) {
          best[k][j] = r;
          from[k][j] = i;
        }
      }
  if (best[S - 1][L] >= k_inf) {
    uint64_t total = prefix[L] + c.first_extra + c.last_extra + S * c.per_stage, have = 0;
    for (uint64_t b : budgets) have += b;
    uint64_t largest = 0;
    for (uint64_t v : c.layer) largest = std::max(largest, v);
    return make_error(
        "the model does not fit %zu GPUs of %.2f GiB in all split by layers: it needs %.2f GiB (layers %.2f, "
        "embedding %.2f, head %.2f, %.2f per GPU for activations), and a GPU holds whole layers (the largest "
        "%.2f GiB)",
        S, gib(have), gib(total), gib(prefix[L]), gib(c.first_extra), gib(c.last_extra), gib(c.per_stage),
        gib(largest));
  }
  std::vector<uint32_t> first(S, 0);
  size_t j = L;
  for (size_t k = S; k-- > 0;) {
    first[k] = static_cast<uint32_t>(from[k][j]);
    j = from[k][j];
  }
  return first;
}

LayerSplitCosts layer_split_costs(const ModelWeights& w, const ModelOptions& options, uint32_t ctx, uint32_t sequences,
                                  bool routed_experts) {
  LayerSplitCosts c;
  const ModelSpec& S = w.spec;
  for (uint32_t il = 0; il < S.n_layer; ++il) {
    uint64_t b = 0;
    for (const TensorRef& r : w.layers[il].t) b += r.n_bytes;
    if (!routed_experts)
      for (LayerTensor t : {LayerTensor::FFN_GATE_EXPS, LayerTensor::FFN_UP_EXPS, LayerTensor::FFN_DOWN_EXPS})
        b -= w.layers[il][t].n_bytes;
    ModelOptions one = options;
    one.layer_first = il;
    one.layer_end = il + 1;
    // kv_state_bytes counts last_hidden once per state: take it out of the layer's share.
    const uint64_t kv = kv_state_bytes(S, one, false, ctx) - static_cast<uint64_t>(S.n_embd) * S.hc_count * 4;
    c.layer.push_back(b + kv * sequences);
  }
  c.first_extra = w[GlobalTensor::TOKEN_EMBD].n_bytes;
  for (GlobalTensor g : {GlobalTensor::OUTPUT_HC_BASE, GlobalTensor::OUTPUT_HC_FN, GlobalTensor::OUTPUT_HC_SCALE,
                         GlobalTensor::OUTPUT_NORM, GlobalTensor::OUTPUT})
    c.last_extra += w[g].n_bytes;
  // Activation buffers (Model::create's scratch): the head's rows on the last stage only.
  ModelOptions mid = options;
  mid.layer_first = 0;
  mid.layer_end = S.n_layer - 1;
  ModelOptions last = options;
  last.layer_first = 0;
  last.layer_end = 0;
  c.per_stage = model_scratch_bytes(S, mid);
  c.last_extra += model_scratch_bytes(S, last) - c.per_stage;
  return c;
}

}  // namespace dsv4
