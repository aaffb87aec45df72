// HostExpertRunner (cuda_host_experts.cuh): the host's share of the host-memory experts, GPU and CPU meeting in
// mapped pinned memory.
#include "backend/cuda/cuda_host_experts.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <new>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "core/log.h"
#include "quant/dot_fast.h"

namespace dsv4::cuda {

namespace {
// Buffer capacity: tokens per op (CudaContext::host_max_tokens) and experts per token.
constexpr int64_t k_max_k = 16;
}  // namespace

HostExpertRunner::HostExpertRunner(int threads, float share) : share_(share) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, sizeof(HostMailbox), cudaHostAllocMapped));
  box_ = new (p) HostMailbox();
  CUDA_CHECK(cudaHostGetDevicePointer(&box_d_, p, 0));
  CUDA_CHECK(cudaHostAlloc(&p, HostExpertWorker::k_slots * sizeof(HostShareRule), cudaHostAllocMapped));
  rules_ = static_cast<HostShareRule*>(p);
  for (int i = 0; i < HostExpertWorker::k_slots; ++i) new (rules_ + i) HostShareRule();
  CUDA_CHECK(cudaHostGetDevicePointer(&rules_d_, p, 0));
  CUDA_CHECK(cudaMalloc(&seq_d_, sizeof(HostSeq)));
  CUDA_CHECK(cudaMemset(seq_d_, 0, sizeof(HostSeq)));
  CUDA_CHECK(cudaMalloc(&plan_d_, HostExpertWorker::k_slots * sizeof(HostPlanState)));
  CUDA_CHECK(cudaMemset(plan_d_, 0, HostExpertWorker::k_slots * sizeof(HostPlanState)));
  CUDA_CHECK(cudaDeviceSynchronize());
  worker_ = std::make_unique<HostExpertWorker>(threads, box_, rules_);
  if (share_ >= 0.0f) worker_->set_controls(HostShareControl::fixed(share_));  // auto: after the calibration
}

HostExpertRunner::~HostExpertRunner() {
  worker_->stop();  // logs its totals
  for (void* p : {static_cast<void*>(box_), static_cast<void*>(rules_), static_cast<void*>(x_h_),
                  static_cast<void*>(ids_h_), static_cast<void*>(w_h_), static_cast<void*>(y_h_)})
    if (p) CUDA_CHECK(cudaFreeHost(p));
  CUDA_CHECK(cudaFree(seq_d_));
  CUDA_CHECK(cudaFree(plan_d_));
}

// Mapped pinned buffers for ops of up to host_max_tokens tokens and k_max_k experts per token, made once
// (recorded graphs keep their addresses): none while a graph is being recorded.
bool HostExpertRunner::ensure_buffers(int64_t n_assign, int64_t n_tokens, int64_t D, bool capturing) {
  if (x_h_) return n_tokens <= cap_tokens_ && n_assign <= cap_assign_ && D <= cap_d_;
  if (capturing) return false;
  cap_tokens_ = std::max<int64_t>(n_tokens, 16);
  cap_assign_ = std::max(n_assign, cap_tokens_ * k_max_k);
  cap_d_ = D;
  auto pinned = [](size_t bytes, void** dev) {
    void* p = nullptr;
    CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped));
    CUDA_CHECK(cudaHostGetDevicePointer(dev, p, 0));
    return p;
  };
  x_h_ = static_cast<float*>(pinned(static_cast<size_t>(cap_tokens_ * cap_d_) * sizeof(float), &x_d_));
  ids_h_ = static_cast<int32_t*>(pinned(static_cast<size_t>(cap_assign_) * sizeof(int32_t), &ids_d_));
  w_h_ = static_cast<float*>(pinned(static_cast<size_t>(cap_assign_) * sizeof(float), &w_d_));
  y_h_ = static_cast<float*>(pinned(static_cast<size_t>(cap_assign_ * cap_d_) * sizeof(float), &y_d_));
  return n_tokens <= cap_tokens_ && n_assign <= cap_assign_;
}

// First estimates for `auto`'s controls: the CPU's time per expert (this op's matrices: k experts of one
// token, best of 3, over k) and the bus's per gathered expert (a copy of bus_bytes, best of 3, scaled to an
// expert's three matrices). The controls then fit both to every request's times (HostShareControl).
void HostExpertRunner::calibrate(const CudaContext& ctx, const HostExpertTask& shape, const void* bus_src,
                                 void* bus_dst, size_t bus_bytes) {
  const int64_t D = shape.gate.cols, k = std::min<int64_t>(6, shape.gate.count);
  std::vector<float> x(static_cast<size_t>(D)), w(static_cast<size_t>(k), 1.0f / static_cast<float>(k));
  for (int64_t i = 0; i < D; ++i) x[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i));
  std::vector<int32_t> ids(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(-1 - i);
  std::vector<float> y(static_cast<size_t>(k * D));
  HostExpertTask t = shape;
  t.n_tokens = 1;
  t.k = k;
  t.x = x.data();
  t.experts = ids.data();
  t.weights = w.data();
  t.y = y.data();
  double cpu_s = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    worker_->experts().run(t);  // the worker is idle: no request is posted before the controls are ready
    cpu_s = std::min(cpu_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double expert_bytes =
      static_cast<double>(shape.gate.expert_bytes + shape.up.expert_bytes + shape.down.expert_bytes);
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  float bus_ms = 1e30f;
  for (int rep = 0; rep < 3; ++rep) {
    CUDA_CHECK(cudaEventRecord(e0, ctx.stream));
    CUDA_CHECK(cudaMemcpyAsync(bus_dst, bus_src, bus_bytes, cudaMemcpyDefault, ctx.stream));
    CUDA_CHECK(cudaEventRecord(e1, ctx.stream));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    bus_ms = std::min(bus_ms, ms);
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  const double r_cpu = static_cast<double>(k) * expert_bytes / std::max(cpu_s, 1e-9);
  const double r_bus = static_cast<double>(bus_bytes) / std::max(static_cast<double>(bus_ms) * 1e-3, 1e-9);
  const double cpu_us = 1e6 * expert_bytes / r_cpu, bus_us = 1e6 * expert_bytes / r_bus;
  worker_->set_controls(HostShareControl::adaptive(cpu_us, bus_us));
  log_info(
      "cuda: host experts: the CPU computes %.1f GB/s of experts (%d threads, %s dots; %.0f us an expert), the "
      "bus gathers %.1f GB/s (%.0f us an expert): the CPU takes as many of each decode step's host experts as "
      "end no later than the gather, fitted to every step's times (--cpu-experts auto)",
      r_cpu / 1e9, worker_->threads(), quant::dot_fast_isa(), cpu_us, r_bus / 1e9, bus_us);
}

uint32_t HostExpertRunner::job_of(const HostExpertTask& task) {
  const auto key = std::make_tuple(static_cast<const void*>(task.gate.base), task.n_tokens, task.k);
  auto it = job_index_.find(key);
  if (it == job_index_.end()) {  // the same key always describes the same task (one layer, n tokens, k each)
    HostExpertTask t = task;
    t.x = x_h_;
    t.experts = ids_h_;
    t.weights = w_h_;
    t.y = y_h_;
    t.zero_others = false;  // expert_sum_kernel reads only the host's rows
    it = job_index_.emplace(key, worker_->add_job(t)).first;
  }
  return it->second;
}

HostRequest HostExpertRunner::plan_for(const CudaContext& ctx, const HostExpertTask& task, const float* x_dev,
                                       const float* weights_dev, const void* bus_src, void* bus_dst, size_t bus_bytes) {
  if (share_ == 0.0f) return {};
  if (!task.gate.base || !task.up.base || !task.down.base) return {};  // not host memory we registered
  const int64_t n = task.n_tokens, na = n * task.k, D = task.gate.cols;
  if (!ensure_buffers(na, n, D, ctx.capturing)) return {};
  if (!worker_->ready()) {
    if (ctx.capturing) return {};
    calibrate(ctx, task, bus_src, bus_dst, bus_bytes);
  }
  const int slot = HostExpertWorker::slot_of(n);
  HostRequest r;
  r.rule = static_cast<const HostShareRule*>(rules_d_) + slot;
  r.state = plan_d_ + slot;
  r.box = static_cast<HostMailbox*>(box_d_);
  r.seq = seq_d_;
  r.job = job_of(task);
  r.x_h = static_cast<float*>(x_d_);
  r.ids_h = static_cast<int32_t*>(ids_d_);
  r.w_h = static_cast<float*>(w_d_);
  r.y_h = static_cast<const float*>(y_d_);
  r.x = x_dev;
  r.w = weights_dev;
  r.n_x = n * D;
  return r;
}

}  // namespace dsv4::cuda
