#include "runtime/cache_writer.h"

#include <algorithm>

#include "core/log.h"

namespace dsv4::runtime {

CacheWriter::CacheWriter(DiskCache& cache, size_t capacity) : cache_(cache), capacity_(capacity) {
  DSV4_ASSERT(capacity_ >= 1, "the cache writer needs room for one save");
  thread_ = std::thread([this] { loop(); });
}

CacheWriter::~CacheWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool CacheWriter::has_room() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() < capacity_;
}

void CacheWriter::wait_for_room() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return queue_.size() < capacity_; });
}

void CacheWriter::wait_while_pending(const std::function<bool(const PreparedSave&)>& relevant) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return std::none_of(queue_.begin(), queue_.end(), relevant); });
}

void CacheWriter::submit(PreparedSave save) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DSV4_ASSERT(!stopping_, "a save submitted to a stopping cache writer");
    queue_.push_back(std::move(save));
  }
  work_cv_.notify_one();
}

void CacheWriter::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return queue_.empty(); });
}

CacheWriter::Stats CacheWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CacheWriter::loop() {
  for (;;) {
    const PreparedSave* front = nullptr;  // stays in the queue (and valid: deques keep references) until written
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything is written
      front = &queue_.front();
    }
    const PreparedSave& save = *front;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = cache_.store(save.input());
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const std::string reason = save_reason_name(save.reason);
    const size_t n_tokens = save.tokens.size();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
      if (!r) {
        ++stats_.failed;
      } else if (r->outcome == StoreOutcome::WRITTEN) {
        ++stats_.written;
      } else {
        ++stats_.already_present;
      }
    }
    done_cv_.notify_all();
    // (A failed write was reported by the store, once, when it turned read-only.)
    if (!r)
      log_debug("KV disk cache: %s", r.error().message.c_str());
    else if (r->outcome == StoreOutcome::WRITTEN)
      log_info("KV disk cache: stored %s (%s, %zu tokens, %.1f MiB, %.0f ms%s)", r->name.c_str(), reason.c_str(),
               n_tokens, static_cast<double>(r->bytes) / (1 << 20), ms,
               r->evicted.empty() ? "" : strfmt(", %zu evicted", r->evicted.size()).c_str());
    else if (r->outcome == StoreOutcome::OVER_BUDGET)
      log_info("KV disk cache: not stored: %s would take %.1f MiB, more than --kv-disk-space-mb allows",
               r->name.c_str(), static_cast<double>(r->bytes) / (1 << 20));
    else
      log_debug("KV disk cache: not stored (%s): %s", store_outcome_name(r->outcome), r->name.c_str());
  }
}

}  // namespace dsv4::runtime
