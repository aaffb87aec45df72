// A layer pipeline (placement mode "layers", docs/design-notes/multi-gpu.md): the model's layers cut
// into contiguous ranges, one Model stage per backend (ModelOptions::layer_first / layer_end), chained
// by Model::create_pipeline. Stage 0 embeds the tokens, the last stage has the head; every stage writes
// the batch's positions and token ids itself (attention reads positions, hash-routed layers route by
// token id). At each boundary the batch's mHC state, [n, hc, D] f32 (hc * D * 4 bytes per token: 64 KiB
// for Flash), passes from one stage to the next through a StageTransport. Every op runs on the same
// inputs as in one Model, so the logits equal a single Model's bit for bit when the stages' backends
// compute alike (the CPU backend: tested; GPUs of one kind pick the same kernel per op, which
// scripts/gpu.sh pipeline checks).
// Each sequence's KvState holds the next stage's state in KvState::next.
//
// This file: the transports and the planner that picks the split.
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

// Through host memory: from.read, then to.write. Works between any two backends.
class HostTransport final : public StageTransport {
 public:
  void move(Backend& from, const Tensor& src, Backend& to, const Tensor& dst) override;

 private:
  std::vector<uint8_t> buf_;
};

// Backend::copy_to where the two backends can (CPU to CPU, CUDA to CUDA: a device-to-device copy the next
// stage's stream waits for, no host wait), else through host memory. The pipeline's default.
class DirectTransport final : public StageTransport {
 public:
  void move(Backend& from, const Tensor& src, Backend& to, const Tensor& dst) override;

 private:
  HostTransport host_;
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
// sequence times `sequences`, the embedding and head; per_stage: a stage's activation buffers). Without
// `routed_experts` the layers' routed experts are left out (they may stay in host memory).
LayerSplitCosts layer_split_costs(const ModelWeights& weights, const ModelOptions& options, uint32_t ctx,
                                  uint32_t sequences, bool routed_experts = true);

}  // namespace dsv4
