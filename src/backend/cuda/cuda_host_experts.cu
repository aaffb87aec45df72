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
// A request the CPU has not answered after this long is a hang, reported and fatal (a decode step takes ms).
constexpr uint64_t k_wait_limit_ns = 60ull * 1000 * 1000 * 1000;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One block: the inputs into the mailbox's buffers (x [n_x floats], ids2 and weights [n_assign], the gathered
// and skipped counts), then the request; nothing when the plan gave the host no expert. Every thread fences its
// own writes to system scope before the barrier, so the host sees the inputs before it sees the new sequence
// number.
__global__ void __launch_bounds__(1024)
    host_request_kernel(HostMailbox* box, HostSeq* seq, const HostPlanState* plan, uint32_t job,
                        float* __restrict__ x_h, int32_t* __restrict__ ids_h, float* __restrict__ w_h,
                        const float* __restrict__ x, const int32_t* __restrict__ ids2, const float* __restrict__ w,
                        const int32_t* gathered, int64_t n_x, int64_t n_assign) {
  pdl_enter();
  if (plan->host == 0) return;
  for (int64_t i = threadIdx.x; i < n_x; i += blockDim.x) x_h[i] = x[i];
  for (int64_t i = threadIdx.x; i < n_assign; i += blockDim.x) {
    ids_h[i] = ids2[i];
    w_h[i] = w[i];
  }
  volatile HostMailbox* b = box;
  if (threadIdx.x == 0) {
    b->job = job;
    b->gathered = static_cast<uint32_t>(*gathered);
    b->skipped = static_cast<uint32_t>(plan->skipped);
    b->skipped_used = static_cast<uint32_t>(plan->skipped_used);
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t s = seq->seq + 1 == 0 ? 1 : seq->seq + 1;  // never 0 (RequestPoll: 0 means stopped)
    seq->seq = s;
    seq->posted_ns = global_ns();
    b->request = s;
  }
}

// One thread: returns once the host's answer carries the last request's sequence number (y_host is then
// written), then gives the host its times: posting to this kernel, and the wait; returns at once when the plan
// posted no request. Traps with a message after k_wait_limit_ns.
__global__ void host_wait_kernel(HostMailbox* box, const HostSeq* seq, const HostPlanState* plan) {
  pdl_enter();
  if (threadIdx.x != 0 || plan->host == 0) return;
  const uint32_t s = seq->seq;
  volatile HostMailbox* b = box;
  const unsigned long long t0 = global_ns();
  unsigned long long t = t0;
  while (b->answer != s) {
    __nanosleep(256);
    t = global_ns();
    if (t - t0 > k_wait_limit_ns) {
      printf("dsv4: fatal: host experts: request %u not answered by the CPU within %llu s\n", s,
             static_cast<unsigned long long>(k_wait_limit_ns / 1000000000ull));
      __trap();
    }
  }
  __threadfence_system();
  b->gpu_us = static_cast<float>(t0 - seq->posted_ns) * 1e-3f;
  b->wait_us = static_cast<float>(t - t0) * 1e-3f;
  __threadfence_system();
  b->timed = s;
}
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

HostExpertRunner::Plan HostExpertRunner::plan_for(const CudaContext& ctx, const HostExpertTask& shape,
                                                  const void* bus_src, void* bus_dst, size_t bus_bytes) {
  if (share_ == 0.0f) return {};
  if (!shape.gate.base || !shape.up.base || !shape.down.base) return {};  // not host memory we registered
  if (!ensure_buffers(shape.n_tokens * shape.k, shape.n_tokens, shape.gate.cols, ctx.capturing)) return {};
  if (!worker_->ready()) {
    if (ctx.capturing) return {};
    calibrate(ctx, shape, bus_src, bus_dst, bus_bytes);
  }
  const int slot = HostExpertWorker::slot_of(shape.n_tokens);
  return {static_cast<const HostShareRule*>(rules_d_) + slot, plan_d_ + slot};
}

const float* HostExpertRunner::launch(const CudaContext& ctx, const Plan& plan, const HostExpertTask& shape,
                                      const float* x_dev, const int32_t* ids2_dev, const float* weights_dev,
                                      const int32_t* gathered_dev) {
  const int64_t n = shape.n_tokens, na = n * shape.k, D = shape.gate.cols;
  DSV4_ASSERT(x_h_ && n <= cap_tokens_ && na <= cap_assign_ && D <= cap_d_, "host experts: launch without buffers");
  const auto key = std::make_tuple(static_cast<const void*>(shape.gate.base), n, shape.k);
  auto it = job_index_.find(key);
  if (it == job_index_.end()) {  // the same key always describes the same task (one layer, n tokens, k each)
    HostExpertTask t = shape;
    t.x = x_h_;
    t.experts = ids_h_;
    t.weights = w_h_;
    t.y = y_h_;
    t.zero_others = false;  // expert_sum_kernel reads only the host's rows
    it = job_index_.emplace(key, worker_->add_job(t)).first;
  }
  launch_kernel(host_request_kernel, 1, 1024, 0, ctx.stream, static_cast<HostMailbox*>(box_d_), seq_d_,
                static_cast<const HostPlanState*>(plan.state), it->second, static_cast<float*>(x_d_),
                static_cast<int32_t*>(ids_d_), static_cast<float*>(w_d_), x_dev, ids2_dev, weights_dev, gathered_dev,
                n * D, na);
  CUDA_CHECK_LAUNCH();
  return static_cast<const float*>(y_d_);
}

void HostExpertRunner::join(const CudaContext& ctx, const Plan& plan) {
  launch_kernel(host_wait_kernel, 1, 32, 0, ctx.stream, static_cast<HostMailbox*>(box_d_),
                static_cast<const HostSeq*>(seq_d_), static_cast<const HostPlanState*>(plan.state));
  CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
