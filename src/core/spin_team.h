// A team of worker threads for short, back-to-back parallel loops: the CPU backend's ops (ThreadPool: loops
// of microseconds to milliseconds, one after another through a forward pass) and the host experts' (two loops
// of well under a millisecond per decode layer). Waking a sleeping thread through a condition variable costs
// a system call and a scheduling round trip per loop; here the workers keep polling while loops keep coming
// (spinning up to `spin` after the last one, then sleeping until the next), and take chunks of items with one
// atomic add each.
//
// run(n, grain, fn) calls fn(begin, end) over [0, n) in chunks of `grain` items on the workers and the
// calling thread, and returns when every chunk is done. One caller at a time; a run called from inside a
// run (by a chunk, on the caller or a worker of any team) calls fn over the whole range inline. Which
// thread runs a chunk varies, so fn must not depend on it. Where the caller has run out of chunks it
// waits for the workers' last ones spinning, then yielding its core.
//
// Two ways to poll: PAUSE loops (the host experts: cores set aside for them, where the next loop must start
// within a microsecond), or `yield`: sched_yield between looks, which costs a system call a look but hands
// the core to any other runnable thread. With more runnable threads than cores (ctest -j2 on two cores, or a
// server's other threads) a PAUSE-spinning worker holds a core that a descheduled thread of the same loop,
// or another process, needs: two CPU test processes on two cores measured 16% slower than with condition
// variables, and the same with yield.
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
// thread yield).
void cpu_relax();

class SpinTeam {
 public:
  static constexpr std::chrono::microseconds k_default_spin{2000};

  // n_threads counts the caller: n_threads - 1 workers (n_threads <= 1: the caller alone). spin: how long a
  // worker keeps polling after its last loop before it sleeps; yield: poll by sched_yield (see above).
  explicit SpinTeam(int n_threads, std::chrono::microseconds spin = k_default_spin, bool yield = false);
  ~SpinTeam();
  SpinTeam(const SpinTeam&) = delete;
  SpinTeam& operator=(const SpinTeam&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void run(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  // Whether the calling thread is inside a run of some SpinTeam: a worker, or a caller whose run has not
  // returned (a run from there is inline; ThreadPool checks it before taking its call lock).
  static bool in_run();

 private:
  void worker();
  void work();  // claims and runs chunks of the published call until none is left
  template <class Done>
  void wait_until(Done done) const;  // spins, then yields, until done() (see the top of this file)

  const std::chrono::microseconds spin_;
  const bool yield_;
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
