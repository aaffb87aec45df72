// The on-disk KV cache store (docs/kv-cache-format.md): a private directory
// of KV-cache files (kv/kv_file.h), one cached prompt prefix each, kept under
// a byte budget. This layer moves bytes; restoring into a Session, choosing
// what to save and when live in src/cache/.
//
// Rules:
//   * the directory is created 0700 and must be owned by this user and not
//     writable by group or others; files are created 0600, never followed
//     through symlinks, written to a dot-temp file in the same directory,
//     fsynced, renamed into place, then the directory is fsynced;
//   * reads use plain read() into memory and validate everything (header,
//     identity, sizes, every hash, the file checksum, the payload header)
//     before a caller sees a byte; a truncated, corrupt, wrong-version or
//     foreign-model file is removed with a warning and never returned;
//   * hits and last use are persisted with a 32-byte pwrite of the usage block;
//   * a failed write (full disk, quota, I/O error, read-only file system)
//     makes the store read-only for its lifetime with one warning: existing
//     files still serve hits, nothing new is written;
//   * eviction keeps the files' total size within the budget, lowest value
//     first (evict_to_budget);
//   * the directory also holds model-identity.v1, the identities of model
//     files remembered there (kv/model_identity_store.h); scans leave it and
//     every other name that is not a cache file alone;
//   * several stores (threads or processes) may share a directory: each
//     rescans before a lookup or eviction, files appear and disappear only by
//     rename and unlink, and a file that vanishes or changes under a reader is
//     a miss, never an error.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "kv/kv_file.h"
#include "kv/model_identity_store.h"

namespace dsv4 {

struct DiskCacheOptions {
  std::string dir;
  uint64_t budget_bytes = uint64_t{4096} << 20;  // total size of the cache files
  double half_life_seconds = 6 * 3600;           // of a file's value since its last use (eviction)
  std::function<uint64_t()> clock;               // Unix seconds; empty: the system clock
};

// One valid file, as indexed by a scan (header + usage + lookup probes).
struct CacheEntry {
  std::string name;
  KvHeader header;
  KvUsage usage;
  uint64_t file_bytes = 0;
  std::string text_tail;            // the last <= 32 bytes of the key text
  std::vector<int32_t> token_tail;  // the last <= 8 token ids
  uint64_t dev = 0, ino = 0;        // to notice a file replaced under the same name
  int64_t mtime_ns = 0;
};

// An entry whose tokens are a prefix of the query's tokens and/or whose key
// text is a byte prefix of the query's text.
struct CacheCandidate {
  CacheEntry entry;
  bool tokens_match = false;
  bool text_match = false;
};

// A file read in full and validated; `view` points into `image`.
struct CacheRecord {
  CacheEntry entry;
  std::vector<uint8_t> image;
  KvFileView view;
};

struct CacheStats {
  uint64_t files = 0, bytes = 0, budget_bytes = 0;
  uint64_t hits = 0;       // record_hit calls (successful restores)
  uint64_t misses = 0;     // record_miss calls (lookups that restored nothing)
  uint64_t stores = 0;     // files written
  uint64_t evictions = 0;  // files removed to stay within the budget
  uint64_t rejected = 0;   // invalid files removed (corrupt, truncated, foreign, wrong version)
  bool writable = false;   // false after a write failure (the store is read-only)
};

struct StoreInput {
  std::string_view key_text;
  bool decoded_key = true;           // key_text == the decoded bytes of `tokens`
  std::span<const int32_t> tokens;   // >= 1 token
  std::span<const uint8_t> payload;  // Session::save() of exactly `tokens`
  uint32_t ctx = 0;                  // context of the session
  SaveReason reason = SaveReason::OTHER;
  const ToolDsmlMap* tools = nullptr;  // kept: entries whose DSML occurs in key_text
};

enum class StoreOutcome {
  WRITTEN,          // a new file (evictions may have followed)
  ALREADY_PRESENT,  // a file with the same key, tokens and tool map exists
  OVER_BUDGET,      // the file alone would exceed the budget
  READ_ONLY,        // an earlier write failed; nothing is written any more
};
const char* store_outcome_name(StoreOutcome o);

struct StoreResult {
  StoreOutcome outcome = StoreOutcome::WRITTEN;
  std::string name;
  uint64_t bytes = 0;                // size of the file (written or not)
  std::vector<std::string> evicted;  // files removed by the eviction that followed
};

// The identity of the engine a store serves, asked for by DiskCache::open once
// the directory passed its checks (so an unusable directory costs no model
// hashing); `store` holds the identities remembered in that directory.
using IdentitySource = std::function<KvIdentity(ModelIdentityStore& store)>;

class DiskCache {
 public:
  // Creates or opens `options.dir`, checks it (ownership, permissions, a
  // probe write), asks `identity` for the identity, removes stale temporary
  // files and invalid cache files (those of another identity included), and
  // evicts down to the budget. An error means "no disk cache": the caller
  // warns and runs without one.
  static expected<std::unique_ptr<DiskCache>> open(DiskCacheOptions options, const IdentitySource& identity);
  // The same with an identity known beforehand.
  static expected<std::unique_ptr<DiskCache>> open(DiskCacheOptions options, const KvIdentity& identity);
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  // Entries with min_tokens <= n_tokens <= max_tokens whose token ids are a
  // prefix of `tokens` or whose key text is a byte prefix of `text` (either
  // query may be empty), best first: more tokens, then token matches before
  // text-only matches, then more recent use. Matching is by the headers'
  // SHA-256 of the prefix, after a cheap tail probe; read() confirms bytes.
  std::vector<CacheCandidate> find(std::string_view text, std::span<const int32_t> tokens, uint64_t min_tokens,
                                   uint64_t max_tokens);
  // Reads and validates the whole file. Invalid: removed with a warning and an
  // error returned. Gone or replaced since `entry` was indexed: an error (no
  // warning) and the index forgets it.
  expected<CacheRecord> read(const CacheEntry& entry);
  // Persists hits + 1 and last use = now in the file's usage block.
  void record_hit(const CacheEntry& entry);
  void record_miss();

  // Writes a file atomically, then evicts to the budget (the new file is
  // protected unless it alone exceeds the budget). An error means the write
  // failed; the store then turned read-only and said so once.
  expected<StoreResult> store(const StoreInput& in);

  // Removes files, lowest value first, until the total fits the budget:
  //   value = (1 + hits) * 2^(-(now - last_use) / half_life) * n_tokens / file_bytes
  // (ties: older last use first). `protect` is removed last.
  std::vector<std::string> evict_to_budget(const std::string& protect = "");
  // Removes a file that read() accepted but its consumer rejected (e.g. the
  // engine refused the payload), with a warning; counted as rejected.
  void discard(const CacheEntry& entry, const std::string& why);
  // True when a file with this key text and these tokens is indexed (a save
  // of the same state can be skipped before serialising the session).
  bool has(std::string_view key_text, std::span<const int32_t> tokens);

  // Tool-id -> DSML entries for `ids`, from every file's tool map section
  // (each section is checked against its hash in the checksummed header).
  ToolDsmlMap find_tool_calls(const std::vector<std::string>& ids);

  std::vector<CacheEntry> entries();  // after a rescan, by name
  CacheStats stats() const;
  const std::string& dir() const { return options_.dir; }
  uint64_t now() const;

 private:
  DiskCache(DiskCacheOptions options, const KvIdentity& identity, int dir_fd);
  void rescan_locked();
  std::optional<CacheEntry> index_file_locked(const std::string& name);
  void remove_invalid_locked(const std::string& name, uint64_t dev, uint64_t ino, const std::string& why);
  std::vector<std::string> evict_locked(const std::string& protect);
  void disable_writes(const std::string& what, int err);
  expected<std::vector<uint8_t>> read_tool_section(const CacheEntry& e);

  DiskCacheOptions options_;
  KvIdentity identity_;
  int dir_fd_ = -1;
  mutable std::mutex mu_;
  std::map<std::string, CacheEntry> index_;
  CacheStats stats_;
  uint64_t temp_counter_ = 0;
};

}  // namespace dsv4
