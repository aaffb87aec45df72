// HostExpertWorker (host_expert_worker.h): the CPU's side of the host experts' mailbox.
#include "backend/host/host_expert_worker.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "backend/host/request_poll.h"
#include "core/assert.h"
#include "core/log.h"

namespace dsv4 {

HostExpertWorker::HostExpertWorker(int threads, HostMailbox* box, HostShareRule* rules)
    : experts_(threads), box_(box), rules_(rules), jobs_(std::make_unique<HostExpertTask[]>(k_max_jobs)) {
  const uint32_t seen = __atomic_load_n(&box_->request, __ATOMIC_ACQUIRE);  // a request may come before it runs
  thread_ = std::thread([this, seen] { run(seen); });
}

HostExpertWorker::~HostExpertWorker() { stop(); }

void HostExpertWorker::set_controls(const HostShareControl& c) {
  DSV4_ASSERT(!ready(), "host experts: controls set twice");
  controls_.assign(k_slots, c);
  for (int i = 0; i < k_slots; ++i) rules_[i] = c.rule();
  ready_.store(true, std::memory_order_release);
}

uint32_t HostExpertWorker::add_job(const HostExpertTask& task) {
  const size_t i = n_jobs_.load();
  DSV4_ASSERT(i < k_max_jobs, "host experts: more than %zu (layer, batch) shapes", k_max_jobs);
  jobs_[i] = task;
  n_jobs_.store(i + 1, std::memory_order_release);
  return static_cast<uint32_t>(i);
}

void HostExpertWorker::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  thread_.join();
  if (stats_.calls == 0) return;
  const double calls = static_cast<double>(stats_.calls);
  log_info(
      "host experts: %llu requests (%.1f%% of the ops that used host experts), %.2f host assignments and %.3f ms "
      "each, %.1f GB/s of expert matrices; the CPU took %.1f%% of the host experts the ops used, and the GPU "
      "waited for it after %.1f%% of the requests (%.1f ms in all)",
      static_cast<unsigned long long>(stats_.calls), 100.0 * calls / static_cast<double>(stats_.ops),
      static_cast<double>(stats_.assignments) / calls, 1e3 * stats_.seconds / calls,
      stats_.seconds > 0 ? stats_.bytes / stats_.seconds / 1e9 : 0.0,
      100.0 * static_cast<double>(stats_.host) / static_cast<double>(std::max<uint64_t>(stats_.used, 1)),
      stats_.timed ? 100.0 * static_cast<double>(stats_.waited) / static_cast<double>(stats_.timed) : 0.0,
      stats_.wait_us * 1e-3);
  const HostShareControl& c = controls_.front();
  if (c.adaptive())
    log_info(
        "host experts: last fit of a one-token request: the CPU %.0f us an expert (spread %.0f us), the GPU %.0f "
        "us + %.0f us a gathered expert",
        c.cpu_fit().rate(), c.cpu_fit().spread(), c.gpu_fit().intercept(), c.gpu_fit().slope());
}

// The host experts a task names (its assignments < 0), each counted once.
int HostExpertWorker::distinct_host_experts(const HostExpertTask& t) {
  seen_.assign(static_cast<size_t>((t.gate.count + 63) / 64), 0);
  int n = 0;
  for (int64_t a = 0; a < t.n_tokens * t.k; ++a) {
    const int32_t e = -1 - t.experts[a];
    if (e < 0 || e >= t.gate.count) continue;
    uint64_t& word = seen_[static_cast<size_t>(e) / 64];
    const uint64_t bit = uint64_t{1} << (e % 64);
    n += (word & bit) == 0;
    word |= bit;
  }
  return n;
}

// Each request: the job, its control fed the CPU's time and the GPU's times of the request before (its answer
// came before this request was posted, so they are in the mailbox), the next rule, then the answer.
void HostExpertWorker::run(uint32_t last) {
  using clock = std::chrono::steady_clock;
  RequestPoll poll(last);
  uint32_t prev = 0;  // the previous request, its slot and the experts the GPU gathered for it
  int prev_slot = 0, prev_gathered = 0;
  while (const uint32_t r = poll.next(&box_->request, stop_)) {
    const auto t0 = clock::now();
    const uint32_t job = __atomic_load_n(&box_->job, __ATOMIC_ACQUIRE);
    const int gathered = static_cast<int>(__atomic_load_n(&box_->gathered, __ATOMIC_ACQUIRE));
    const int skipped = static_cast<int>(__atomic_load_n(&box_->skipped, __ATOMIC_ACQUIRE));
    const int skipped_used = static_cast<int>(__atomic_load_n(&box_->skipped_used, __ATOMIC_ACQUIRE));
    DSV4_ASSERT(job < n_jobs_.load(std::memory_order_acquire), "host experts: request for job %u of %zu", job,
                n_jobs_.load());
    DSV4_ASSERT(ready(), "host experts: a request before the share's controls");
    const HostExpertTask& t = jobs_[job];
    const int slot = slot_of(t.n_tokens);
    int host = 0;
    try {
      host = distinct_host_experts(t);
      const int64_t n = experts_.run(t);
      stats_.assignments += static_cast<uint64_t>(n);
      stats_.bytes +=
          static_cast<double>(n) * static_cast<double>(t.gate.expert_bytes + t.up.expert_bytes + t.down.expert_bytes);
    } catch (const std::exception& e) {
      // The GPU is waiting on this answer: an error here (out of memory) ends the process, loudly.
      std::fprintf(stderr, "dsv4: fatal: host experts: %s\n", e.what());
      std::abort();
    }
    const double cpu_s = std::chrono::duration<double>(clock::now() - t0).count();
    stats_.seconds += cpu_s;
    stats_.calls += 1;
    stats_.host += static_cast<uint64_t>(host);
    stats_.ops += 1 + static_cast<uint64_t>(skipped);
    stats_.used += static_cast<uint64_t>(host + gathered + skipped_used);
    if (prev != 0 && __atomic_load_n(&box_->timed, __ATOMIC_ACQUIRE) == prev) {
      const volatile HostMailbox* vb = box_;
      const float gpu_us = vb->gpu_us, wait_us = vb->wait_us;
      HostShareControl& pc = controls_[static_cast<size_t>(prev_slot)];
      pc.observe_gpu(prev_gathered, gpu_us);
      rules_[prev_slot] = pc.rule();
      stats_.timed += 1;
      stats_.waited += wait_us > 5.0f;
      stats_.wait_us += wait_us;
    }
    HostShareControl& c = controls_[static_cast<size_t>(slot)];
    c.observe_cpu(host, host + gathered, cpu_s * 1e6, skipped);
    rules_[slot] = c.rule();
    prev = r;
    prev_slot = slot;
    prev_gathered = gathered;
    __atomic_store_n(&box_->answer, r, __ATOMIC_RELEASE);
    poll.served();
  }
}

}  // namespace dsv4
