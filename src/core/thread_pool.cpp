#include "core/thread_pool.h"

#include <algorithm>
#include <thread>

#include "core/spin_team.h"

namespace dsv4 {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  team_ = std::make_unique<SpinTeam>(n_threads, k_spin, true);
}

ThreadPool::~ThreadPool() = default;

int ThreadPool::size() const { return team_->size(); }

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn, size_t min_chunk) {
  if (n == 0) return;
  min_chunk = std::max<size_t>(1, min_chunk);
  const size_t max_tasks = static_cast<size_t>(size()) * 4;
  const size_t chunk = std::max(min_chunk, (n + max_tasks - 1) / max_tasks);
  if (size() == 1 || SpinTeam::in_run() || chunk >= n) {  // (a loop called from a loop runs inline)
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  team_->run(n, chunk, fn);
}

}  // namespace dsv4
