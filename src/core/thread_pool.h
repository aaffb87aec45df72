// A fixed pool of worker threads for data-parallel loops (the CPU backend's ops, conversion, synthesis).
//
// parallel_for(n, fn) splits [0, n) into contiguous chunks and calls fn(begin, end) on the workers and on the
// calling thread; it returns when all chunks are done. Calls are serialised (one loop at a time per pool); a
// call from inside a loop (on the calling thread or a worker) runs inline, so nesting cannot deadlock. The
// loops run on a SpinTeam (core/spin_team.h): between back-to-back loops, as in a forward pass, the workers
// poll (yielding their core between looks) instead of sleeping, for k_spin after the last loop. Against
// workers that sleep on a condition variable after every loop (2-core dev machine, tiny model): decode
// +45-60%, a test binary alone 20% faster, two at once on the two cores the same.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>

namespace dsv4 {

class SpinTeam;

class ThreadPool {
 public:
  // How long idle workers keep polling for the next loop before they sleep. Longer than the gaps between a
  // forward pass's ops (microseconds), short enough that an idle engine leaves the cores to others at once.
  static constexpr std::chrono::microseconds k_spin{200};

  // n_threads <= 0: use std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;

  // min_chunk: smallest number of items worth a separate task.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk = 1);

 private:
  std::unique_ptr<SpinTeam> team_;
  std::mutex call_mutex_;  // serialises parallel_for calls
};

}  // namespace dsv4
