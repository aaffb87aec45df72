// What `--sessions` and the `--kv-disk-*` flags ask of the runtime's session
// pool and on-disk KV cache (docs/kv-cache-format.md), shared by `dsv4 serve`
// and `dsv4 run`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/save_policy.h"

namespace dsv4::runtime {

struct KvCacheOptions {
  size_t sessions = 1;            // --sessions: live sessions kept in memory
  std::string disk_dir;           // --kv-disk-dir (empty: no disk cache)
  uint64_t disk_space_mb = 4096;  // --kv-disk-space-mb: budget of the cache files
  size_t min_tokens = 512;        // --kv-cache-min-tokens: shorter prefixes are not saved
  size_t frontier = 10240;        // --kv-cache-frontier: save every this many tokens (0: off)
  size_t align = 2048;            // --kv-cache-align: cold fallback lengths are multiples of this
  size_t write_queue = 2;         // captured states waiting for / being written; more frontier / cold saves are skipped
  // --session-memory-mb: backend memory the resident sessions may take in all
  // (0: no limit but the backend's); fewer sessions than --sessions / --parallel
  // fit: requests beyond them wait for a free one.
  uint64_t session_memory_mb = 0;

  SavePolicy policy() const;
  std::string describe() const;  // one line, printed at start
};

}  // namespace dsv4::runtime
