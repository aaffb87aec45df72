// What the runtime reports about its resident sessions and on-disk KV cache
// (Backend::cache_report), for /metrics and the start banner.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/disk_cache.h"

namespace dsv4::runtime {

struct CacheReport {
  size_t max_sessions = 1;
  std::vector<uint64_t> session_tokens;  // per live session (empty: not reported)
  uint64_t session_bytes = 0;
  std::array<uint64_t, 4> picks{};  // by PoolPick: extends, regenerates, new, displaced
  bool disk_enabled = false;
  CacheStats disk;
  uint64_t restored_tokens = 0;
  std::array<uint64_t, 4> saves{};  // cold, frontier, displaced, shutdown
  uint64_t skipped_busy = 0, skipped_present = 0, write_failures = 0;
};

}  // namespace dsv4::runtime
