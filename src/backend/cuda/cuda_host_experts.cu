// HostExpertRunner (cuda_host_experts.cuh): the host's share of the host-memory experts, GPU and CPU meeting in
// mapped pinned memory.
#include "backend/cuda/cuda_host_experts.cuh"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/host/request_poll.h"
#include "core/log.h"
#include "quant/dot_fast.h"

namespace dsv4::cuda {

namespace {
// Buffer capacity: tokens per op (CudaContext::host_max_tokens) and experts per token.
constexpr int64_t k_max_k = 16;
// A request the CPU has not answered after this long is a hang, reported and fatal (a decode step takes ms).
constexpr uint64_t k_wait_limit_ns = 60ull * 1000 * 1000 * 1000;

// One block: the inputs into the mailbox's buffers (x [n_x floats], ids2 and weights [n_assign]), then the
// request. Every thread fences its own writes to system scope before the barrier, so the host sees the inputs
// before it sees the new sequence number.
__global__ void __launch_bounds__(1024)
    host_request_kernel(HostMailbox* box, uint32_t* seq, uint32_t job, float* __restrict__ x_h,
                        int32_t* __restrict__ ids_h, float* __restrict__ w_h, const float* __restrict__ x,
                        const int32_t* __restrict__ ids2, const float* __restrict__ w, int64_t n_x, int64_t n_assign) {
  pdl_enter();
  for (int64_t i = threadIdx.x; i < n_x; i += blockDim.x) x_h[i] = x[i];
  for (int64_t i = threadIdx.x; i < n_assign; i += blockDim.x) {
    ids_h[i] = ids2[i];
    w_h[i] = w[i];
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t s = *seq + 1 == 0 ? 1 : *seq + 1;  // never 0 (RequestPoll: 0 means stopped)
    *seq = s;
    volatile HostMailbox* b = box;
    b->job = job;
    __threadfence_system();
    b->request = s;
  }
}

// One thread: returns once the host's answer carries the last request's sequence number (y_host is then
// written); traps with a message after k_wait_limit_ns.
__global__ void host_wait_kernel(const HostMailbox* box, const uint32_t* seq) {
  pdl_enter();
  if (threadIdx.x != 0) return;
  const uint32_t s = *seq;
  const volatile uint32_t* answer = &box->answer;
  uint64_t t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (*answer != s) {
    __nanosleep(256);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > k_wait_limit_ns) {
      printf("dsv4: fatal: host experts: request %u not answered by the CPU within %llu s\n", s,
             static_cast<unsigned long long>(k_wait_limit_ns / 1000000000ull));
      __trap();
    }
  }
  __threadfence_system();
}
}  // namespace

HostExpertRunner::HostExpertRunner(int threads, float share)
    : experts_(threads), share_(share), jobs_(std::make_unique<HostExpertTask[]>(k_max_jobs)) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, sizeof(HostMailbox), cudaHostAllocMapped));
  box_ = new (p) HostMailbox();
  CUDA_CHECK(cudaHostGetDevicePointer(&box_d_, p, 0));
  CUDA_CHECK(cudaMalloc(&seq_d_, sizeof(uint32_t)));
  CUDA_CHECK(cudaMemset(seq_d_, 0, sizeof(uint32_t)));
  CUDA_CHECK(cudaDeviceSynchronize());
  const uint32_t seen = box_->request;  // before the worker starts: a request may come before it runs
  thread_ = std::thread([this, seen] { worker(seen); });
}

HostExpertRunner::~HostExpertRunner() {
  stop_.store(true);
  thread_.join();
  if (stats_.calls > 0)
    log_info(
        "cuda: host experts: %llu requests, %.2f host assignments and %.3f ms each, %.1f GB/s of expert "
        "matrices",
        static_cast<unsigned long long>(stats_.calls),
        static_cast<double>(stats_.assignments) / static_cast<double>(stats_.calls),
        1e3 * stats_.seconds / static_cast<double>(stats_.calls),
        stats_.seconds > 0 ? stats_.bytes / stats_.seconds / 1e9 : 0.0);
  for (void* p : {static_cast<void*>(box_), static_cast<void*>(x_h_), static_cast<void*>(ids_h_),
                  static_cast<void*>(w_h_), static_cast<void*>(y_h_)})
    if (p) CUDA_CHECK(cudaFreeHost(p));
  CUDA_CHECK(cudaFree(seq_d_));
}

// The worker: waits for each request (RequestPoll), computes the job, publishes y_host, then the answer.
void HostExpertRunner::worker(uint32_t last) {
  using clock = std::chrono::steady_clock;
  RequestPoll poll(last);
  while (const uint32_t r = poll.next(&box_->request, stop_)) {
    const uint32_t job = __atomic_load_n(&box_->job, __ATOMIC_ACQUIRE);
    DSV4_ASSERT(job < n_jobs_.load(std::memory_order_acquire), "host experts: request for job %u of %zu", job,
                n_jobs_.load());
    const HostExpertTask& t = jobs_[job];
    try {
      const auto t0 = clock::now();
      const int64_t n = experts_.run(t);
      stats_.seconds += std::chrono::duration<double>(clock::now() - t0).count();
      stats_.calls += 1;
      stats_.assignments += static_cast<uint64_t>(n);
      stats_.bytes +=
          static_cast<double>(n) * static_cast<double>(t.gate.expert_bytes + t.up.expert_bytes + t.down.expert_bytes);
    } catch (const std::exception& e) {
      // The GPU is waiting on this answer: an error here (out of memory) ends the process, loudly.
      std::fprintf(stderr, "dsv4: fatal: host experts: %s\n", e.what());
      std::abort();
    }
    __atomic_store_n(&box_->answer, r, __ATOMIC_RELEASE);
    poll.served();
  }
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

// The share that balances the two paths: the CPU computes its experts at r_cpu bytes/s (timed on this op's
// matrices: k experts of one token, best of 3) while the bus gathers the others at r_bus (a copy of bus_bytes,
// best of 3), so share = r_cpu / (r_cpu + r_bus) makes both take the same time per byte of experts.
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
    experts_.run(t);  // the worker is idle: no request was posted before the share was known
    cpu_s = std::min(cpu_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double cpu_bytes =
      static_cast<double>(k) *
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
  const double r_cpu = cpu_bytes / std::max(cpu_s, 1e-9);
  const double r_bus = static_cast<double>(bus_bytes) / std::max(static_cast<double>(bus_ms) * 1e-3, 1e-9);
  share_ = static_cast<float>(r_cpu / (r_cpu + r_bus));
  log_info(
      "cuda: host experts: the CPU computes %.1f GB/s of experts (%d threads, %s dots), the bus gathers %.1f GB/s: "
      "the CPU takes %.0f%% of the host experts of each decode step (--cpu-experts)",
      r_cpu / 1e9, experts_.threads(), quant::dot_fast_isa(), r_bus / 1e9, 100.0 * share_);
}

float HostExpertRunner::share_for(const CudaContext& ctx, const HostExpertTask& shape, const void* bus_src,
                                  void* bus_dst, size_t bus_bytes) {
  if (share_ == 0.0f) return 0.0f;
  if (!shape.gate.base || !shape.up.base || !shape.down.base) return 0.0f;  // not host memory we registered
  if (!ensure_buffers(shape.n_tokens * shape.k, shape.n_tokens, shape.gate.cols, ctx.capturing)) return 0.0f;
  if (share_ < 0.0f) {
    if (ctx.capturing) return 0.0f;
    calibrate(ctx, shape, bus_src, bus_dst, bus_bytes);
  }
  return share_;
}

const float* HostExpertRunner::launch(const CudaContext& ctx, const HostExpertTask& shape, const float* x_dev,
                                      const int32_t* ids2_dev, const float* weights_dev) {
  const int64_t n = shape.n_tokens, na = n * shape.k, D = shape.gate.cols;
  DSV4_ASSERT(x_h_ && n <= cap_tokens_ && na <= cap_assign_ && D <= cap_d_, "host experts: launch without buffers");
  const auto key = std::make_tuple(static_cast<const void*>(shape.gate.base), n, shape.k);
  auto it = job_index_.find(key);
  if (it == job_index_.end()) {  // the same key always describes the same task (one layer, n tokens, k each)
    const size_t i = n_jobs_.load();
    DSV4_ASSERT(i < k_max_jobs, "host experts: more than %zu (layer, batch) shapes", k_max_jobs);
    HostExpertTask& t = jobs_[i];
    t = shape;
    t.x = x_h_;
    t.experts = ids_h_;
    t.weights = w_h_;
    t.y = y_h_;
    n_jobs_.store(i + 1, std::memory_order_release);
    it = job_index_.emplace(key, static_cast<uint32_t>(i)).first;
  }
  launch_kernel(host_request_kernel, 1, 1024, 0, ctx.stream, static_cast<HostMailbox*>(box_d_), seq_d_, it->second,
                static_cast<float*>(x_d_), static_cast<int32_t*>(ids_d_), static_cast<float*>(w_d_), x_dev, ids2_dev,
                weights_dev, n * D, na);
  CUDA_CHECK_LAUNCH();
  return static_cast<const float*>(y_d_);
}

void HostExpertRunner::join(const CudaContext& ctx) {
  launch_kernel(host_wait_kernel, 1, 32, 0, ctx.stream, static_cast<const HostMailbox*>(box_d_),
                static_cast<const uint32_t*>(seq_d_));
  CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
