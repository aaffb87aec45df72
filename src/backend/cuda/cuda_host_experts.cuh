// The host's share of a decode step's host-memory experts (CudaOptions::cpu_experts,
// docs/design-notes/expert-offload.md). For an op whose experts are partly in host
// memory, the gather plan (cuda_moe.cu) hands the first `share` of the host experts
// that the batch uses to the CPU (their assignments marked -1 - e in a copy of the
// expert ids) and gathers the rest over the bus. GPU and CPU meet through mapped
// pinned memory, with no driver call in between:
//   GPU  plan -> host_request_kernel: x, ids, weights into the mailbox, then the
//        request (job, sequence number) -> gather -> the device's experts ->
//        host_wait_kernel (until the CPU's answer carries that sequence number)
//        -> expert sum (adds y_host's rows, read in place)
//   CPU  one worker thread polls the request word, runs HostExperts::run (backend/
//        host, all cores) on the job's matrices, writes y_host, then the answer.
// so the CPU computes while the GPU gathers. (Copy-engine transfers and a
// cudaLaunchHostFunc in a side stream were measured first: the transfers queued
// behind the gather's reads of host memory and the host function started late,
// so the two paths ran mostly one after the other.) Everything on the GPU side
// is kernels: a decode graph records it like any other op. The worker spins
// while requests keep coming and sleeps in 100 us naps after 20 ms without one.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/host/host_experts.h"

namespace dsv4::cuda {

struct CudaContext;

// The mailbox in mapped pinned memory (written by one side, read by the other).
struct HostMailbox {
  uint32_t request = 0;  // GPU -> CPU: sequence number of the latest request
  uint32_t job = 0;      //             its job (HostExpertRunner::jobs_ index)
  uint32_t answer = 0;   // CPU -> GPU: sequence number of the latest finished request
};

class HostExpertRunner {
 public:
  // share: the fraction of the used host experts the CPU takes; < 0: measured on the first op (calibrate).
  HostExpertRunner(int threads, float share);
  ~HostExpertRunner();
  HostExpertRunner(const HostExpertRunner&) = delete;
  HostExpertRunner& operator=(const HostExpertRunner&) = delete;

  // The share for an op of `task`'s matrices (pointers into host memory), or 0 when the op cannot use the
  // host path now (no buffers yet while a graph is being recorded, or larger than the buffers). Measures the
  // share first when it is "auto" and nothing is being recorded: `bus_src` / `bus_dst` (device-usable host
  // memory and device memory of `bus_bytes` each) time the bus.
  float share_for(const CudaContext& ctx, const HostExpertTask& shape, const void* bus_src, void* bus_dst,
                  size_t bus_bytes);

  // Posts the host's part of an op on ctx.stream (see the top of this file): ids2 [n_assign] (host
  // assignments < 0). Returns y_host [n_assign, D] (device-usable; the host rows, zeros elsewhere), valid on
  // ctx.stream after join().
  const float* launch(const CudaContext& ctx, const HostExpertTask& shape, const float* x_dev, const int32_t* ids2_dev,
                      const float* weights_dev);
  void join(const CudaContext& ctx);

  int threads() const { return experts_.threads(); }
  // Worker totals since the start (logged when the runner ends): requests, host assignments, seconds computing,
  // the bytes of expert matrices they read.
  struct Stats {
    uint64_t calls = 0, assignments = 0;
    double seconds = 0, bytes = 0;
  };

 private:
  void worker(uint32_t last);
  bool ensure_buffers(int64_t n_assign, int64_t n_tokens, int64_t D, bool capturing);
  void calibrate(const CudaContext& ctx, const HostExpertTask& shape, const void* bus_src, void* bus_dst,
                 size_t bus_bytes);

  HostExperts experts_;
  float share_;
  Stats stats_;  // the worker's (read after it has stopped)
  // Mapped pinned buffers (host pointers; *_d_: their device pointers): the mailbox, x [max_tokens * D], ids and
  // weights [max_assign], y [max_assign * D].
  HostMailbox* box_ = nullptr;
  float* x_h_ = nullptr;
  int32_t* ids_h_ = nullptr;
  float* w_h_ = nullptr;
  float* y_h_ = nullptr;
  void *box_d_ = nullptr, *x_d_ = nullptr, *ids_d_ = nullptr, *w_d_ = nullptr, *y_d_ = nullptr;
  uint32_t* seq_d_ = nullptr;  // device memory: the last sequence number posted
  int64_t cap_tokens_ = 0, cap_assign_ = 0, cap_d_ = 0;
  // Jobs by (gate matrix, tokens, k): the task with the mailbox's buffers; the index is the request's job.
  // A fixed array, so that appending never moves an entry the worker may be reading.
  static constexpr size_t k_max_jobs = 4096;
  std::unique_ptr<HostExpertTask[]> jobs_;
  std::map<std::tuple<const void*, int64_t, int64_t>, uint32_t> job_index_;
  std::atomic<size_t> n_jobs_{0};  // jobs_ entries the worker may read (published after each append)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dsv4::cuda
