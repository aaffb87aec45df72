// A layer pipeline (placement mode "layers", docs/design-notes/multi-gpu.md): the model's layers cut
// into contiguous ranges, one Model stage per backend (ModelOptions::layer_first / layer_end). Stage 0
// embeds the tokens, the last stage has the head; every stage writes the batch's positions and token
// ids itself (attention reads positions, hash-routed layers route by token id). At each boundary the
// batch's mHC state, [n, hc, D] f32 (hc * D * 4 bytes per token: 64 KiB for Flash), passes from one
// stage to the next through a StageTransport. Every op runs on the same inputs as in one Model, so the
// logits equal a single Model's bit for bit when the stages' backends compute alike (the CPU backend:
// tested; GPUs of one kind run one kernel per op whatever the stage).
//
// Each sequence has one KvState per stage (State), holding that stage's layers.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "model/forward.h"

namespace dsv4 {

// Moves a stage's output state to the next stage's input (tensors of the same shape, f32).
class StageTransport {
 public:
  virtual ~StageTransport() = default;
  virtual void move(Backend& from, const Tensor& src, Backend& to, const Tensor& dst) = 0;
};

// Through host memory: from.read, then to.write. Works between any two backends (the in-process
// transport of the tests); GPUs of one host would use peer copies instead.
class HostTransport final : public StageTransport {
 public:
  void move(Backend& from, const Tensor& src, Backend& to, const Tensor& dst) override;

 private:
  std::vector<uint8_t> buf_;
};

// The layer split of a pipeline over GPUs with memory budgets (placement mode "layers"). Costs in bytes:
// layer[il] = layer il's weights and its part of the sequences' KV states; `first_extra` what only the first
// stage holds (the embedding), `last_extra` only the last (the head), `per_stage` every stage (activation
// buffers and working memory).
struct LayerSplitCosts {
  std::vector<uint64_t> layer;
  uint64_t first_extra = 0, last_extra = 0, per_stage = 0;
};
// The first layer of each stage (one stage per budget, in order, each at least one layer): contiguous
// ranges that fit their budgets, chosen so the largest ratio of a stage's bytes to its budget is as small as
// possible (a stage's decode time goes with the bytes it reads, and that ratio keeps room for the KV states
// and batches that grow with use). An error names the shortfall when no split fits.
expected<std::vector<uint32_t>> plan_layer_split(const LayerSplitCosts& costs, const std::vector<uint64_t>& budgets);
// The costs of a model under `options` (layer weights, f32/compact KV state rows for ctx tokens per
// sequence times `sequences`, the embedding and head; per_stage: a stage's activation buffers).
LayerSplitCosts layer_split_costs(const ModelWeights& weights, const ModelOptions& options, uint32_t ctx,
                                  uint32_t sequences);

class LayerPipeline {
 public:
  // One stage per backend: stage k runs layers [first[k], first[k + 1]) (first[0] = 0, strictly
  // ascending, the last stage up to the model's last layer). `options` applies to every stage (its
  // layer range is set per stage; memory_budget, when set, to each). No MTP block or DSpark drafter.
  static expected<std::unique_ptr<LayerPipeline>> create(std::span<Backend* const> backends,
                                                         const ModelWeights& weights,
                                                         const std::vector<uint32_t>& first,
                                                         const ModelOptions& options,
                                                         std::unique_ptr<StageTransport> transport = nullptr);

  size_t stages() const { return stages_.size(); }
  Model& stage(size_t k) { return *stages_[k].model; }
  const ModelSpec& spec() const { return stages_.front().model->spec(); }

  struct State {
    std::vector<KvState> stages;  // one per stage
  };
  State new_state(uint32_t ctx);
  void free_state(State& s);
  void reset_state(State& s);

  // Model::forward's contract over the stages: tokens ids[0..n) at positions p0.. (the state holds
  // exactly p0 tokens), in batches of at most max_batch; logits of the last token (or of every token
  // with all_logits) from the last stage.
  Status forward(State& s, const int32_t* ids, int64_t n, int64_t p0, float* logits, bool all_logits);

 private:
  struct Stage {
    Backend* backend = nullptr;
    std::unique_ptr<Model> model;
  };
  std::vector<Stage> stages_;
  std::unique_ptr<StageTransport> transport_;
  int max_batch_ = 0;
};

}  // namespace dsv4
