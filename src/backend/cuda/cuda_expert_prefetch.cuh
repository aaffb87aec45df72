// Prefill with routed experts in host memory: a batch of a few hundred tokens or more uses nearly every expert of
// a layer, so its moe_experts op would gather nearly all of the layer's host experts over the bus (~1.6 GB per
// layer at a 24 GiB budget, q2) after the router, with the GPU idle meanwhile. The model announces each layer's
// op before the layer's attention (Backend::moe_prefetch); for a large batch the prefetcher then copies every
// host expert of the layer into one device buffer with the copy engine, on its own stream, while the attention
// runs, and the op uses that buffer instead of gathering (CudaContext::prefetched):
//   copy stream:    wait(consumed) -> copies of layer l's host experts -> record(copied)
//   compute stream: [attention of layer l] -> wait(copied) -> the expert kernels -> record(consumed)
// One buffer: layer l + 1's copies wait until layer l's op has read it (announced after that op was issued).
// Only pinned host experts (streamed ones go through cuda_expert_stream.cuh), never while a graph is recorded.
// The kernels read the same bytes through a slot table as after a gather, so results are bitwise the same.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "ops/ops.h"

namespace dsv4::cuda {

struct CudaContext;

// A layer's host experts already in device memory: slots [E] (s >= 0: the resident stack's slot; s <= -2:
// position -2 - s of stage[m]); empty when none.
struct PrefetchedExperts {
  const int32_t* slots = nullptr;
  uint8_t* stage[3] = {};
};

class ExpertPrefetcher {
 public:
  ExpertPrefetcher();
  ~ExpertPrefetcher();  // waits for the copy stream
  ExpertPrefetcher(const ExpertPrefetcher&) = delete;
  ExpertPrefetcher& operator=(const ExpertPrefetcher&) = delete;

  // Batches of n tokens with n * k >= k_min_uses_per_expert * E are prefetched (then ~e^-4 of the host experts
  // copied go unused), and only batches of at least k_min_tokens: smaller batched steps may be recorded as
  // graphs after a first run that sized the scratch memory, which must then need the same gather stage.
  static constexpr int64_t k_min_uses_per_expert = 4;
  static constexpr int64_t k_min_tokens = 128;

  // Copies n bytes at src (a device-usable address of registered host memory) to dst on a stream.
  using CopyIn = std::function<void(uint8_t* dst, const uint8_t* src, size_t n, cudaStream_t stream)>;
  // Starts the copies of op's layer when the batch is large enough (see the top of the file).
  void prefetch(const CudaContext& ctx, const MoePrefetchOp& op, const CopyIn& copy_in);
  // The prefetched experts of the moe_experts op `op` (its layer's, announced last), with ctx.stream made to
  // wait for the copies; empty otherwise. finish() after the op's launches.
  PrefetchedExperts take(const CudaContext& ctx, const MoeExpertsOp& op);
  void finish(const CudaContext& ctx);

  // Totals (logged at the end): layers prefetched, bytes copied.
  uint64_t layers() const { return layers_; }
  double bytes() const { return bytes_; }

 private:
  struct Layer {
    std::vector<int32_t> host;  // the experts in host memory, in expert order (stage position = index)
    int32_t* slots = nullptr;   // device [E]: the op's slots with host expert host[i] at -2 - i
  };
  const Layer* layer_of(const CudaContext& ctx, const Tensor& slots);

  cudaStream_t copy_ = nullptr;
  cudaEvent_t copied_ = nullptr, consumed_ = nullptr;
  uint8_t* buf_ = nullptr;  // the stage: three matrices' host experts back to back
  size_t buf_bytes_ = 0;
  bool failed_ = false;  // the buffer could not be allocated: no more prefetching
  std::map<const void*, Layer> layers_by_slots_;
  const void* pending_ = nullptr;  // the gate_host data of the layer copied last, until its op takes it
  PrefetchedExperts pending_stage_;
  uint64_t layers_ = 0;
  double bytes_ = 0;
};

}  // namespace dsv4::cuda
