// A team of worker threads for short, back-to-back parallel loops (the host experts: two loops of well
// under a millisecond per decode layer). ThreadPool wakes sleeping workers through a condition variable
// for every loop; here the workers keep polling while loops keep coming (spinning up to k_spin after
// the last one, then sleeping until the next), and take chunks of items with one atomic add each.
//
// run(n, grain, fn) calls fn(begin, end) over [0, n) in chunks of `grain` items on the workers and the
// calling thread, and returns when every chunk is done. One caller at a time (calls are not re-entrant);
// which thread runs a chunk varies, so fn must not depend on it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

// One pause of a spin-wait loop (x86 PAUSE: the core yields pipeline resources to its sibling; elsewhere a
// thread yield). Also the host experts' mailbox worker's (cuda_host_experts.cu).
void cpu_relax();

// Waits for a new value of a mailbox's request word that another agent (a GPU kernel, through mapped memory)
// writes: spins while requests come within k_busy of the previous one, else naps k_nap between looks.
class RequestPoll {
 public:
  // last: the word's value before the first request (read before the polling thread starts).
  explicit RequestPoll(uint32_t last) : last_(last), idle_since_(std::chrono::steady_clock::now()) {}
  // The next request's value, or 0 once `stop` is set (request values are never 0).
  uint32_t next(const uint32_t* word, const std::atomic<bool>& stop);
  // The request was served: the busy spinning window restarts.
  void served() { idle_since_ = std::chrono::steady_clock::now(); }

  static constexpr std::chrono::milliseconds k_busy{20};
  static constexpr std::chrono::microseconds k_nap{100};

 private:
  uint32_t last_;
  std::chrono::steady_clock::time_point idle_since_;
};

class SpinTeam {
 public:
  // n_threads counts the caller: n_threads - 1 workers (n_threads <= 1: the caller alone).
  explicit SpinTeam(int n_threads);
  ~SpinTeam();
  SpinTeam(const SpinTeam&) = delete;
  SpinTeam& operator=(const SpinTeam&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void run(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  static constexpr std::chrono::microseconds k_spin{2000};

 private:
  void worker();
  void work();  // claims and runs chunks of the published call until none is left

  std::vector<std::thread> workers_;
  // The published call. gen_ is odd while the caller rewrites it (workers stay out), even when it stands.
  std::atomic<uint64_t> gen_{0};
  std::atomic<int> inside_{0};  // workers between entering a call and leaving it
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0, grain_ = 1;
  std::atomic<size_t> next_{0};  // first unclaimed item
  std::atomic<size_t> done_{0};  // items finished
  // Sleeping workers wait here for the next call.
  std::mutex mu_;
  std::condition_variable cv_;
  int sleepers_ = 0;  // under mu_
  std::atomic<bool> stop_{false};
};

}  // namespace dsv4
