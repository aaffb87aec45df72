#include "kv/model_identity.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/assert.h"
#include "core/hash.h"
#include "core/thread_pool.h"

namespace dsv4 {

Digest model_content_identity(const MappedFile& file, std::string_view fingerprint, int n_threads,
                              const std::function<void(uint64_t, uint64_t)>& progress) {
  DSV4_ASSERT(fingerprint.size() == 32, "the layout fingerprint is 32 bytes, got %zu", fingerprint.size());
  const uint64_t n = file.size(), c = k_identity_chunk_bytes;
  const size_t n_leaves = static_cast<size_t>((n + c - 1) / c);
  std::vector<Digest> leaves(n_leaves);
  std::mutex progress_mu;
  uint64_t done = 0;
  auto hash_leaves = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const uint64_t off = i * c, len = std::min(c, n - off);
      file.prefetch(static_cast<size_t>(off), static_cast<size_t>(len));
      leaves[i] = sha256_digest(file.data() + off, static_cast<size_t>(len));
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mu);
        done += len;
        progress(done, n);
      }
    }
  };
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(n_threads), std::max<size_t>(n_leaves, 1)));
  if (n_threads == 1) {
    hash_leaves(0, n_leaves);
  } else {
    ThreadPool pool(n_threads);
    pool.parallel_for(n_leaves, hash_leaves);
  }

  Hasher root(HashKind::SHA256);
  root.update(k_identity_tag, sizeof k_identity_tag);
  root.update(fingerprint);
  uint8_t sizes[16];
  std::memcpy(sizes, &n, 8);  // little-endian host (kv_file.h)
  std::memcpy(sizes + 8, &c, 8);
  root.update(sizes, sizeof sizes);
  for (const Digest& d : leaves) root.update(d.data(), d.size());
  std::optional<Digest> id = digest_from_hex(root.hex_digest());
  DSV4_ASSERT(id.has_value());
  return *id;
}

}  // namespace dsv4
