// The host's share of a decode step's host-memory experts (CudaOptions::cpu_experts,
// docs/design-notes/expert-offload.md). For an op whose experts are partly in host
// memory, the gather plan (cuda_moe.cu) hands the first h of the u host experts
// that the batch uses to the CPU (their assignments marked -1 - e in a copy of the
// expert ids) and gathers the rest over the bus; h = host_share_plan(rule, u)
// (backend/host/host_share.h: a fixed share, or `auto`, the h that ends the two
// paths soonest by a fit of what the earlier requests measured). GPU and CPU meet
// through mapped pinned memory, with no driver call in between:
//   GPU  plan (reads the rule; h into HostPlanState) -> host_request_kernel: x,
//        ids, weights, the gathered and skipped counts into the mailbox, then
//        the request (job, sequence number; the GPU timer at posting kept on
//        the device) -> gather -> the device's experts -> host_wait_kernel
//        (until the CPU's answer carries that sequence number; then the GPU's
//        path and wait times into the mailbox) -> expert sum (the host's rows
//        of y_host, read in place, for the assignments marked the host's).
//        With h = 0 the request and the wait return at once: no round trip.
//   CPU  HostExpertWorker (backend/host/host_expert_worker.h): one thread polls
//        the request word, runs HostExperts::run (all cores) on the job's
//        matrices, writes y_host, feeds its time and the GPU's times of the
//        request before to the job's HostShareControl, writes the next rule,
//        then the answer.
// so the CPU computes while the GPU gathers. (Copy-engine transfers and a
// cudaLaunchHostFunc in a side stream were measured first: the transfers queued
// behind the gather's reads of host memory and the host function started late,
// so the two paths ran mostly one after the other.) Everything on the GPU side
// is kernels: a decode graph records it like any other op, and the rule it reads
// is memory, so a recorded graph follows the rule's changes. The worker spins
// while requests keep coming and sleeps in 100 us naps after 20 ms without one.
// This file: the GPU's side (the kernels, the mapped and device memory, the
// calibration that seeds `auto`).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
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

class HostExpertRunner {
 public:
  // share: the fraction of the used host experts the CPU takes; < 0: auto (calibrated on the first op, then
  // adapted to every request's times: HostShareControl).
  HostExpertRunner(int threads, float share);
  ~HostExpertRunner();
  HostExpertRunner(const HostExpertRunner&) = delete;
  HostExpertRunner& operator=(const HostExpertRunner&) = delete;

  // The rule (device-usable, in mapped memory; the gather plan reads it) and the plan's state for an op of
  // `task`'s matrices (pointers into host memory), or nullptrs when the op cannot use the host path now (no
  // buffers yet while a graph is being recorded, or larger than the buffers). Calibrates first when the share is "auto"
  // and nothing is being recorded: `bus_src` / `bus_dst` (device-usable host memory and device memory of `bus_bytes`
  // each) time the bus.
  struct Plan {
    const HostShareRule* rule = nullptr;  // mapped memory
    HostPlanState* state = nullptr;       // device memory
  };
  Plan plan_for(const CudaContext& ctx, const HostExpertTask& shape, const void* bus_src, void* bus_dst,
                size_t bus_bytes);

  // Posts the host's part of an op on ctx.stream (see the top of this file) unless the plan gave it no expert:
  // ids2 [n_assign] (host assignments < 0), gathered_dev the plan's count of gathered experts. Returns y_host
  // [n_assign, D] (device-usable; the host's rows, for the assignments ids2 marks), valid on ctx.stream after
  // join().
  const float* launch(const CudaContext& ctx, const Plan& plan, const HostExpertTask& shape, const float* x_dev,
                      const int32_t* ids2_dev, const float* weights_dev, const int32_t* gathered_dev);
  void join(const CudaContext& ctx, const Plan& plan);

  int threads() const { return worker_->threads(); }

 private:
  bool ensure_buffers(int64_t n_assign, int64_t n_tokens, int64_t D, bool capturing);
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
