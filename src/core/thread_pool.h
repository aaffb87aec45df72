// A fixed pool of worker threads for data-parallel loops.
//
// parallel_for(n, fn) splits [0, n) into contiguous chunks and calls
// fn(begin, end) on the workers and on the calling thread; it returns when all
// chunks are done. Calls are serialised (one loop at a time per pool); a call
// from inside a worker runs inline, so nesting cannot deadlock.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dsv4 {

class ThreadPool {
 public:
  // n_threads <= 0: use std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // min_chunk: smallest number of items worth a separate task.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // serialises parallel_for calls
  std::mutex mutex_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  const std::function<void(size_t, size_t)>* fn_ = nullptr;
  size_t n_ = 0, chunk_ = 0, n_chunks_ = 0;
  size_t next_chunk_ = 0, done_chunks_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace dsv4
