#include "core/thread_pool.h"

#include <algorithm>

namespace dsv4 {

namespace {
thread_local bool t_in_worker = false;
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i + 1 < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int) {
  t_in_worker = true;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_work_.wait(lock, [&] { return stop_ || (generation_ != seen && next_chunk_ < n_chunks_); });
    if (stop_) return;
    while (next_chunk_ < n_chunks_) {
      size_t c = next_chunk_++;
      const auto* fn = fn_;
      size_t b = c * chunk_, e = std::min(n_, b + chunk_);
      lock.unlock();
      (*fn)(b, e);
      lock.lock();
      if (++done_chunks_ == n_chunks_) cv_done_.notify_all();
    }
    seen = generation_;
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk) {
  if (n == 0) return;
  min_chunk = std::max<size_t>(1, min_chunk);
  size_t max_tasks = static_cast<size_t>(size()) * 4;
  size_t chunk = std::max(min_chunk, (n + max_tasks - 1) / max_tasks);
  if (workers_.empty() || t_in_worker || chunk >= n) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  t_in_worker = true;  // nested parallel_for from our own chunks runs inline
  std::unique_lock<std::mutex> lock(mutex_);
  fn_ = &fn;
  n_ = n;
  chunk_ = chunk;
  n_chunks_ = (n + chunk - 1) / chunk;
  next_chunk_ = 0;
  done_chunks_ = 0;
  ++generation_;
  cv_work_.notify_all();
  while (next_chunk_ < n_chunks_) {
    size_t c = next_chunk_++;
    size_t b = c * chunk_, e = std::min(n_, b + chunk_);
    lock.unlock();
    fn(b, e);
    lock.lock();
    ++done_chunks_;
  }
  cv_done_.wait(lock, [&] { return done_chunks_ == n_chunks_; });
  fn_ = nullptr;
  n_chunks_ = 0;
  t_in_worker = false;
}

}  // namespace dsv4
