// The on-disk KV cache flags (--kv-disk-dir, --kv-disk-space-mb,
// --kv-cache-*) and --sessions, shared by `dsv4 serve` and `dsv4 run`, and
// their range checks.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

#include "core/error.h"
#include "runtime/cache_options.h"

namespace dsv4::tools {

// `with_sessions`: also --sessions (a server keeps several agents warm; `run` has one conversation).
inline void add_kv_cache_flags(CLI::App* cmd, runtime::KvCacheOptions* cache, bool with_sessions) {
  if (with_sessions) {
    cmd->add_option("--sessions", cache->sessions,
                    "Live sessions kept in memory, so several agents stay warm; a request goes to the one it reuses "
                    "most")
        ->capture_default_str();
    cmd->add_option("--session-memory-mb", cache->session_memory_mb,
                    "Memory (MiB) the live sessions may take in all; requests beyond the sessions that fit wait for "
                    "a free one (0: as many as --sessions and the GPU allow)")
        ->capture_default_str();
  }
  cmd->add_option("--kv-disk-dir", cache->disk_dir,
                  "On-disk KV cache directory (created 0700): long prompt prefixes are saved and restored across "
                  "requests and restarts (docs/kv-cache-format.md)");
  cmd->add_option("--kv-disk-space-mb", cache->disk_space_mb,
                  "Budget of the cache files in MiB; the least valuable files are evicted beyond it")
      ->capture_default_str();
  cmd->add_option("--kv-cache-min-tokens", cache->min_tokens, "Shortest prefix worth a cache file, in tokens")
      ->capture_default_str();
  cmd->add_option("--kv-cache-frontier", cache->frontier,
                  "Save the session every this many tokens during long prefills and replies (0: never)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-align", cache->align,
                  "A long first message without a system prompt is saved at a multiple of this many tokens")
      ->capture_default_str();
}

inline Status check_kv_cache_options(const runtime::KvCacheOptions& c) {
  if (c.sessions < 1 || c.sessions > 64) return make_error("--sessions must be between 1 and 64");
  if (c.disk_space_mb < 1 || c.disk_space_mb > (uint64_t{1} << 30))
    return make_error("--kv-disk-space-mb must be between 1 and 1073741824");
  if (c.min_tokens < 1) return make_error("--kv-cache-min-tokens must be at least 1");
  if (c.align < 1) return make_error("--kv-cache-align must be at least 1");
  return {};
}

}  // namespace dsv4::tools
