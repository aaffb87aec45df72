// ExpertPrefetcher (cuda_expert_prefetch.cuh): a large batch's host experts copied in by the copy engine while
// the layer's attention runs.
#include "backend/cuda/cuda_expert_prefetch.cuh"

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "core/log.h"

namespace dsv4::cuda {

ExpertPrefetcher::ExpertPrefetcher() {
  CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&consumed_, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(consumed_, copy_));  // the buffer starts free
}

ExpertPrefetcher::~ExpertPrefetcher() {
  CUDA_CHECK(cudaStreamSynchronize(copy_));
  if (layers_ > 0)
    log_info("cuda: prefetched the host experts of %llu layer batches (%.1f GB) beside the attention",
             static_cast<unsigned long long>(layers_), bytes_ / 1e9);
  for (auto& [key, l] : layers_by_slots_) CUDA_CHECK(cudaFree(l.slots));
  if (buf_) CUDA_CHECK(cudaFree(buf_));
  CUDA_CHECK(cudaEventDestroy(copied_));
  CUDA_CHECK(cudaEventDestroy(consumed_));
  CUDA_CHECK(cudaStreamDestroy(copy_));
}

// The layer's host expert list and prefetch slot table, made once per slots tensor (one read of the slots).
const ExpertPrefetcher::Layer* ExpertPrefetcher::layer_of(const CudaContext& ctx, const Tensor& slots) {
  auto it = layers_by_slots_.find(slots.data);
  if (it != layers_by_slots_.end()) return &it->second;
  const auto E = static_cast<size_t>(slots.ne[0]);
  std::vector<int32_t> s(E);
  CUDA_CHECK(cudaMemcpyAsync(s.data(), slots.data, E * sizeof(int32_t), cudaMemcpyDeviceToHost, ctx.stream));
  CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  Layer l;
  for (size_t e = 0; e < E; ++e)
    if (s[e] == -1) {
      s[e] = -2 - static_cast<int32_t>(l.host.size());
      l.host.push_back(static_cast<int32_t>(e));
    }
  CUDA_CHECK(cudaMalloc(&l.slots, E * sizeof(int32_t)));
  CUDA_CHECK(cudaMemcpy(l.slots, s.data(), E * sizeof(int32_t), cudaMemcpyHostToDevice));
  return &layers_by_slots_.emplace(slots.data, std::move(l)).first->second;
}

void ExpertPrefetcher::prefetch(const CudaContext& ctx, const MoePrefetchOp& op, const CopyIn& copy_in) {
  pending_ = nullptr;
  if (failed_ || ctx.capturing || !op.slots || op.k <= 0) return;
  const int64_t E = op.slots.ne[0];
  if (op.n < k_min_tokens || op.n * op.k < k_min_uses_per_expert * E) return;
  const Layer* l = layer_of(ctx, op.slots);
  if (l->host.empty()) return;
  const Tensor* mats[3] = {&op.gate_host, &op.up_host, &op.down_host};
  size_t bytes[3], total = 0;
  for (int m = 0; m < 3; ++m) {
    bytes[m] = mats[m]->n_bytes() / static_cast<size_t>(E);
    total += (l->host.size() * bytes[m] + 255) / 256 * 256;
  }
  if (total > buf_bytes_) {
    CUDA_CHECK(cudaStreamSynchronize(copy_));  // the old buffer may still be in use by its last op
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    if (buf_) CUDA_CHECK(cudaFree(buf_));
    buf_ = nullptr;
    buf_bytes_ = 0;
    void* p = nullptr;
    if (const cudaError_t e = cudaMalloc(&p, total); e != cudaSuccess) {
      (void)cudaGetLastError();
      failed_ = true;
      log_warn(
          "cuda: no room for a %.2f GiB buffer to prefetch host experts beside the attention (%s): prefill "
          "gathers them after the router instead",
          static_cast<double>(total) / (1u << 30), cudaGetErrorString(e));
      return;
    }
    buf_ = static_cast<uint8_t*>(p);
    buf_bytes_ = total;
  }
  CUDA_CHECK(cudaStreamWaitEvent(copy_, consumed_));
  uint8_t* dst = buf_;
  for (int m = 0; m < 3; ++m) {
    pending_stage_.stage[m] = dst;
    const auto* src = static_cast<const uint8_t*>(mats[m]->data);  // registered host memory (device-usable)
    // Runs of consecutive host experts as one copy each.
    for (size_t i = 0; i < l->host.size();) {
      size_t j = i + 1;
      while (j < l->host.size() && l->host[j] == l->host[j - 1] + 1) ++j;
      copy_in(dst + i * bytes[m], src + static_cast<size_t>(l->host[i]) * bytes[m], (j - i) * bytes[m], copy_);
      i = j;
    }
    dst += (l->host.size() * bytes[m] + 255) / 256 * 256;
  }
  CUDA_CHECK(cudaEventRecord(copied_, copy_));
  pending_stage_.slots = l->slots;
  pending_ = op.gate_host.data;
  layers_ += 1;
  bytes_ += static_cast<double>(l->host.size()) * static_cast<double>(bytes[0] + bytes[1] + bytes[2]);
}

PrefetchedExperts ExpertPrefetcher::take(const CudaContext& ctx, const MoeExpertsOp& op) {
  if (!pending_ || !op.slots || op.gate_host.data != pending_) return {};
  pending_ = nullptr;
  CUDA_CHECK(cudaStreamWaitEvent(ctx.stream, copied_));
  return pending_stage_;
}

void ExpertPrefetcher::finish(const CudaContext& ctx) { CUDA_CHECK(cudaEventRecord(consumed_, ctx.stream)); }

}  // namespace dsv4::cuda
