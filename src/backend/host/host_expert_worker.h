// The CPU's side of the host experts' mailbox (--cpu-experts; the GPU's side is
// src/backend/cuda/cuda_host_experts.cuh): one thread polls the request word
// (RequestPoll), runs the request's job on HostExperts (all the team's cores),
// feeds the job's batch-size control (HostShareControl) the CPU's time and the
// GPU's times of the request before, writes the rule the next plan reads, then
// the answer. Every word it shares with the GPU lives in memory both sides reach
// (mapped pinned memory on a GPU; any memory where a test thread plays the GPU).
//
// The protocol, per op that gives the CPU h > 0 experts (an op with h = 0 posts
// nothing):
//   GPU  writes the job's inputs and job, gathered, skipped, skipped_used, then
//        request = the next sequence number (never 0) after a system fence;
//   CPU  computes, writes the rule, then answer = request;
//   GPU  after seeing the answer: gpu_us, wait_us, then timed = that number.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "backend/host/host_experts.h"
#include "backend/host/host_share.h"

namespace dsv4 {

// The mailbox (written by one side, read by the other).
struct HostMailbox {
  uint32_t request = 0;       // GPU -> CPU: sequence number of the latest request
  uint32_t job = 0;           //             its job (HostExpertWorker::add_job's index)
  uint32_t gathered = 0;      //             the experts the GPU gathers beside it
  uint32_t skipped = 0;       //             the ops before it that used host experts and gave the CPU none,
  uint32_t skipped_used = 0;  //             and the host experts those used
  uint32_t answer = 0;        // CPU -> GPU: sequence number of the latest finished request
  uint32_t timed = 0;         // GPU -> CPU: the request whose times these are (after its answer):
  float gpu_us = 0.0f;        //             posting it to reaching the wait
  float wait_us = 0.0f;       //             the wait for the answer
};

class HostExpertWorker {
 public:
  // A control (and a rule) per batch size: tokens 1..k_slots, larger batches share the last.
  static constexpr int k_slots = 16;
  static constexpr size_t k_max_jobs = 4096;
  static int slot_of(int64_t n_tokens) { return static_cast<int>(n_tokens < k_slots ? n_tokens : k_slots) - 1; }

  // box and rules [k_slots]: the shared memory (outlive the worker). Starts the thread. threads: HostExperts'.
  HostExpertWorker(int threads, HostMailbox* box, HostShareRule* rules);
  ~HostExpertWorker();  // stop()
  HostExpertWorker(const HostExpertWorker&) = delete;
  HostExpertWorker& operator=(const HostExpertWorker&) = delete;

  // Before any request: every slot's control (writes the rules); then ready().
  void set_controls(const HostShareControl& c);
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // A job (the task with the mailbox's buffers), registered before a request names it; returns its index.
  uint32_t add_job(const HostExpertTask& task);
  // The thread's HostExperts, for timing runs while no request can come (before ready()).
  HostExperts& experts() { return experts_; }
  int threads() const { return experts_.threads(); }

  // Totals: requests, host assignments, seconds computing, the bytes of expert matrices they read; the host
  // experts the CPU computed, the ops up to the last request that used host experts and the host experts they
  // used; the timed requests, those the GPU waited more than 5 us for, and its waiting time.
  struct Stats {
    uint64_t calls = 0, assignments = 0, host = 0, ops = 0, used = 0, timed = 0, waited = 0;
    double seconds = 0, bytes = 0, wait_us = 0;
  };
  // Stops the thread (once) and logs the totals and the last fit.
  void stop();
  const Stats& stats() const { return stats_; }                                                     // after stop()
  const HostShareControl& control(int slot) const { return controls_[static_cast<size_t>(slot)]; }  // after stop()

 private:
  void run(uint32_t last);
  int distinct_host_experts(const HostExpertTask& t);

  HostExperts experts_;
  HostMailbox* box_;
  HostShareRule* rules_;
  std::vector<HostShareControl> controls_;  // set before ready_, then the thread's
  std::atomic<bool> ready_{false};
  // A fixed array, so that appending never moves an entry the thread may be reading.
  std::unique_ptr<HostExpertTask[]> jobs_;
  std::atomic<size_t> n_jobs_{0};  // entries the thread may read (published after each append)
  std::vector<uint64_t> seen_;     // the thread's bitset of experts (distinct_host_experts)
  Stats stats_;                    // the thread's
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dsv4
