// The disk-cache writer thread of `dsv4 serve`: the engine thread captures a
// session's state (cache_prepare_save: a memory copy) and hands it here; this
// thread writes the file (DiskCache::store: temp file, fsync, rename,
// eviction) while the engine streams on.
//
// Bounded: at most `capacity` captured states wait or are being written
// (each holds a copy of a session's state in RAM). The engine asks
// has_room() before capturing; a frontier or cold save finding no room is
// skipped, a displaced or shutdown save waits for room (wait_for_room), since
// its session is about to be overwritten or dropped.
//
// Thread-safety: every method may be called from any thread. The destructor
// writes what is pending, then joins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/session_cache.h"
#include "kv/disk_cache.h"

namespace dsv4::runtime {

class CacheWriter {
 public:
  CacheWriter(DiskCache& cache, size_t capacity);
  ~CacheWriter();
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;

  bool has_room() const;
  void wait_for_room();
  // Queues a write; needs room (has_room() or wait_for_room() just before,
  // on the only submitting thread).
  void submit(PreparedSave save);
  // Waits until nothing is queued or being written.
  void flush();
  // Waits while a queued or in-flight save satisfies `relevant` (e.g. a
  // session displaced a moment ago, which the next lookup wants to find).
  void wait_while_pending(const std::function<bool(const PreparedSave&)>& relevant);

  struct Stats {
    uint64_t written = 0;          // new files
    uint64_t already_present = 0;  // the store found the same file (or a read-only store, or over budget)
    uint64_t failed = 0;           // the write failed (the store turned read-only)
  };
  Stats stats() const;

 private:
  void loop();

  DiskCache& cache_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // writer: a save arrived or stopping
  std::condition_variable done_cv_;  // others: a write finished
  std::deque<PreparedSave> queue_;   // waiting, and (the front one) being written
  bool stopping_ = false;
  Stats stats_;
  std::thread thread_;
};

}  // namespace dsv4::runtime
