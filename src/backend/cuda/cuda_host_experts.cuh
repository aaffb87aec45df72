// The host's share of a decode step's host-memory experts (CudaOptions::cpu_experts,
// docs/design-notes/expert-offload.md). For an op whose experts are partly in host
// memory, the gather plan (cuda_moe.cu) hands the first h of the u host experts
// that the batch uses to the CPU (their assignments marked -1 - e in a copy of the
// expert ids) and gathers the rest over the bus; h = host_share_plan(rule, u)
// (backend/host/host_share.h: a fixed share, or `auto`, the h that ends the two
// paths soonest by a fit of what the earlier requests measured). GPU and CPU meet
// through mapped pinned memory, with no driver call and no kernel of their own:
//   GPU  gather_plan_kernel: reads the rule, h into HostPlanState; with h > 0
//        host_post_request: x, ids, weights, the gathered and skipped counts
//        into the mailbox, then the request (job, sequence number; the GPU
//        timer at posting kept on the device) -> gather -> the device's experts
//        -> expert_sum_kernel: host_await_answer (until the CPU's answer carries
//        that sequence number; then the GPU's path and wait times into the
//        mailbox), then the sum (the host's rows of y_host, read in place, for
//        the assignments marked the host's). With h = 0 nothing is posted and
//        nothing waits: an op the CPU takes no part in costs the plan's read of
//        the rule.
//   CPU  HostExpertWorker (backend/host/host_expert_worker.h): one thread polls
//        the request word, runs HostExperts::run (all cores) on the job's
//        matrices, writes y_host, feeds its time and the GPU's times of the
//        request before to the job's HostShareControl, writes the next rule,
//        then the answer.
// so the CPU computes while the GPU gathers. (Copy-engine transfers and a
// cudaLaunchHostFunc in a side stream were measured first: the transfers queued
// behind the gather's reads of host memory and the host function started late,
// so the two paths ran mostly one after the other. A request and a wait kernel
// of their own cost two launches per op, 2-3% of decode where the CPU took
// almost nothing.) Everything on the GPU side is in kernels: a decode graph
// records it like any other op, and the rule it reads is memory, so a recorded
// graph follows the rule's changes. The worker spins while requests keep coming
// and sleeps in 100 us naps after 20 ms without one.
// This file: the GPU's side (the device functions, the mapped and device memory,
// the calibration that seeds `auto`).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <tuple>

#include "backend/host/host_expert_worker.h"
#include "backend/host/host_experts.h"
#include "backend/host/host_share.h"

namespace dsv4::cuda {

struct CudaContext;

// Device memory: the latest request's sequence number and the GPU timer (ns) when it was posted.
struct HostSeq {
  uint32_t seq = 0;
  unsigned long long posted_ns = 0;
};

// Device memory, one per batch size, written by the gather plan: this op's host experts (0: no request), the ops
// in a row that used host experts and gave the CPU none (host_share_plan's `since`) and the host experts they
// used, and both counts as they were before this op's request (for the CPU's fit and its statistics).
struct HostPlanState {
  int32_t host = 0, since = 0, since_used = 0, skipped = 0, skipped_used = 0;
};

// An op's request, as the gather plan posts it and the expert sum awaits its answer (device pointers; every
// member null when the op has no host path).
struct HostRequest {
  const HostShareRule* rule = nullptr;  // mapped memory (the plan reads it afresh)
  HostPlanState* state = nullptr;       // device memory: the plan's h and counters
  HostMailbox* box = nullptr;           // mapped memory
  HostSeq* seq = nullptr;               // device memory
  uint32_t job = 0;                     // HostExpertWorker::add_job's index of this op's task
  float* x_h = nullptr;                 // mapped: x [n_x], the assignments' ids and weights [n_assign]
  int32_t* ids_h = nullptr;
  float* w_h = nullptr;
  const float* y_h = nullptr;  // mapped: the CPU's rows of y [n_assign, D] (the host's assignments)
  const float* x = nullptr;    // device: the op's x [n_x] and weights [n_assign]
  const float* w = nullptr;
  int64_t n_x = 0;
};

#ifdef __CUDACC__
// A request the CPU has not answered after this long is a hang, reported and fatal (a decode step takes ms).
constexpr unsigned long long k_host_wait_limit_ns = 60ull * 1000 * 1000 * 1000;

__device__ __forceinline__ unsigned long long host_global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every thread of one block, after the plan wrote state->host (and a barrier): when the plan gave the CPU
// experts, the inputs into the mailbox's buffers (x, ids2 and weights [n_assign], the gathered and skipped
// counts), then the request. Every thread fences its own writes to system scope before the barrier, and thread
// 0 fences again after it, before the request: the release is then the posting thread's own (the barrier
// orders the other threads' writes before its fence), so the CPU sees the inputs before the new sequence
// number.
__device__ __forceinline__ void host_post_request(const HostRequest& r, const int32_t* ids2, int64_t n_assign,
                                                  int32_t gathered) {
  if (r.state->host == 0) return;  // the same value for the whole block
  for (int64_t i = threadIdx.x; i < r.n_x; i += blockDim.x) r.x_h[i] = r.x[i];
  for (int64_t i = threadIdx.x; i < n_assign; i += blockDim.x) {
    r.ids_h[i] = ids2[i];
    r.w_h[i] = r.w[i];
  }
  volatile HostMailbox* b = r.box;
  if (threadIdx.x == 0) {
    b->job = r.job;
    b->gathered = static_cast<uint32_t>(gathered);
    b->skipped = static_cast<uint32_t>(r.state->skipped);
    b->skipped_used = static_cast<uint32_t>(r.state->skipped_used);
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t s = r.seq->seq + 1 == 0 ? 1 : r.seq->seq + 1;  // never 0 (RequestPoll: 0 means stopped)
    r.seq->seq = s;
    r.seq->posted_ns = host_global_ns();
    __threadfence_system();
    b->request = s;
  }
}

// Every thread of a block that reads y_h: returns once the CPU's answer carries the posted request's sequence
// number (y_h is then written); at once when the plan posted none. Block 0 then gives the CPU its times
// (posting to reaching this wait, and the wait). Traps with a message after k_host_wait_limit_ns.
__device__ __forceinline__ void host_await_answer(const HostRequest& r) {
  if (threadIdx.x == 0 && r.state->host != 0) {
    const uint32_t s = r.seq->seq;
    volatile HostMailbox* b = r.box;
    const unsigned long long t0 = host_global_ns();
    unsigned long long t = t0;
    while (b->answer != s) {
      __nanosleep(256);
      t = host_global_ns();
      if (t - t0 > k_host_wait_limit_ns) {
        printf("dsv4: fatal: host experts: request %u not answered by the CPU within %llu s\n", s,
               k_host_wait_limit_ns / 1000000000ull);
        __trap();
      }
    }
    __threadfence_system();
    if (blockIdx.x == 0) {
      b->gpu_us = static_cast<float>(t0 - r.seq->posted_ns) * 1e-3f;
      b->wait_us = static_cast<float>(t - t0) * 1e-3f;
      __threadfence_system();
      b->timed = s;
    }
  }
  __syncthreads();
}
#endif

class HostExpertRunner {
 public:
  // share: the fraction of the used host experts the CPU takes; < 0: auto (calibrated on the first op, then
  // adapted to every request's times: HostShareControl).
  HostExpertRunner(int threads, float share);
  ~HostExpertRunner();
  HostExpertRunner(const HostExpertRunner&) = delete;
  HostExpertRunner& operator=(const HostExpertRunner&) = delete;

  // The request of an op of `task`'s matrices (pointers into host memory) with its inputs x_dev [n_tokens, D]
  // and weights_dev [n_assign] on the device, for the gather plan to post and the expert sum to await
  // (cuda_moe.cu), or one of null pointers when the op cannot use the host path now (no buffers yet while a
  // graph is being recorded, or larger than the buffers). Calibrates first when the share is "auto" and
  // nothing is being recorded: `bus_src` / `bus_dst` (device-usable host memory and device memory of
  // `bus_bytes` each) time the bus.
  HostRequest plan_for(const CudaContext& ctx, const HostExpertTask& task, const float* x_dev, const float* weights_dev,
                       const void* bus_src, void* bus_dst, size_t bus_bytes);

  int threads() const { return worker_->threads(); }

 private:
  bool ensure_buffers(int64_t n_assign, int64_t n_tokens, int64_t D, bool capturing);
  uint32_t job_of(const HostExpertTask& task);
  void calibrate(const CudaContext& ctx, const HostExpertTask& shape, const void* bus_src, void* bus_dst,
                 size_t bus_bytes);

  float share_;
  // Mapped pinned memory (host pointers; *_d_: their device pointers): the mailbox, the rules (one per batch
  // size: HostExpertWorker::k_slots), x [max_tokens * D], ids and weights [max_assign], y [max_assign * D].
  HostMailbox* box_ = nullptr;
  HostShareRule* rules_ = nullptr;
  float* x_h_ = nullptr;
  int32_t* ids_h_ = nullptr;
  float* w_h_ = nullptr;
  float* y_h_ = nullptr;
  void *box_d_ = nullptr, *rules_d_ = nullptr, *x_d_ = nullptr, *ids_d_ = nullptr, *w_d_ = nullptr, *y_d_ = nullptr;
  HostSeq* seq_d_ = nullptr;         // device memory
  HostPlanState* plan_d_ = nullptr;  // device memory, k_slots
  int64_t cap_tokens_ = 0, cap_assign_ = 0, cap_d_ = 0;
  std::unique_ptr<HostExpertWorker> worker_;  // the CPU's side (after the memory it shares)
  // Jobs by (gate matrix, tokens, k): the worker's index of the task with the mailbox's buffers.
  std::map<std::tuple<const void*, int64_t, int64_t>, uint32_t> job_index_;
};

}  // namespace dsv4::cuda
