// Model identities remembered next to a KV cache (docs/kv-cache-format.md
// §4.1), so that a restart does not read the whole model again: the file
// `model-identity.v1` in the cache directory maps a model file's absolute
// path and stamp (core/file_stamp.h) to its content identity
// (kv/model_identity.h).
//
// Format: text, every line ended by '\n':
//   dsv4 model identity v1
//   <identity: 64 lowercase hex> <dev> <ino> <size> <mtime_ns> <ctime_ns> <path>
//   ... at most k_max_entries entry lines, the most recently written first, one per path
// Numbers are decimal without signs or leading zeros (times: an optional '-');
// the path runs to the end of the line, starts with '/', holds no control
// character and has at most k_max_path_bytes bytes.
//
// Trust: the store lives in a directory DiskCache::open has checked (ours, not
// writable by group or others), and the file is read only when it is a
// regular file of ours, not writable by group or others and at most
// k_max_file_bytes (opened without following symlinks or waiting on a FIFO).
// A file with another first line is ignored whole, a malformed line alone;
// neither is an error, and the next remember() rewrites the file without
// them. An entry is used only when its path and every stamp field equal the
// model file's. Whoever can write the directory can make an identity claim
// for a stamp, which is no more than planting cache files there already allows.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_stamp.h"
#include "kv/kv_file.h"

namespace dsv4 {

// A model file as found on disk: what an identity is remembered under.
struct ModelFileKey {
  std::string path;  // absolute
  FileStamp stamp;
  bool operator==(const ModelFileKey&) const = default;
};

class ModelIdentityStore {
 public:
  static constexpr const char* k_file_name = "model-identity.v1";
  static constexpr const char* k_first_line = "dsv4 model identity v1";
  static constexpr size_t k_max_entries = 8;
  static constexpr size_t k_max_file_bytes = size_t{64} << 10;
  static constexpr size_t k_max_path_bytes = 4096;

  // `dir_fd`: the directory, open; borrowed, it must outlive the store. `dir`: its path, for messages.
  ModelIdentityStore(int dir_fd, std::string dir);

  // The identity remembered for exactly `key`; nullopt when there is none,
  // or the file is missing, unreadable or not trusted (a warning says why).
  std::optional<Digest> find(const ModelFileKey& key) const;
  // Rewrites the file atomically (temporary file, fsync, rename, directory
  // fsync): `key` first, then the valid entries of other paths from the
  // current file, at most k_max_entries in all. On an error (a key that
  // cannot be stored, a failed write) the old file stays as it was.
  Status remember(const ModelFileKey& key, const Digest& identity);

  std::string path() const { return dir_ + "/" + k_file_name; }

 private:
  struct Entry {
    ModelFileKey key;
    Digest identity{};
  };
  std::vector<Entry> load() const;

  int dir_fd_;
  std::string dir_;
};

}  // namespace dsv4
