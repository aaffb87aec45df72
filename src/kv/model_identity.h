// The content identity of a model file (docs/kv-cache-format.md §4): the value
// KV-cache files are bound to. Every byte of the GGUF file counts — header,
// metadata, tensor directory, alignment padding and all tensor data — so two
// files that differ in any byte have different identities.
//
// Construction: a two-level SHA-256 tree, so that the leaves hash in parallel.
//   C        = k_identity_chunk_bytes = 16 MiB
//   N        = the file's size in bytes;  L = ceil(N / C) leaves
//   leaf_i   = SHA-256(file[i*C, min((i+1)*C, N)))                       i = 0 .. L-1
//   identity = SHA-256(tag || fingerprint || u64 N || u64 C || leaf_0 || ... || leaf_{L-1})
// where tag is the 16 ASCII bytes "dsv4-model-id-v1", fingerprint the 32-byte
// layout fingerprint (kv/snapshot.h model_fingerprint) and integers are
// little-endian. The root input has the fixed length 64 + 32 L, and N fixes L,
// so no two (fingerprint, file) pairs share a root input.
//
// Cost: reading the whole file once (an 80 GB model: seconds from the page
// cache, disk speed otherwise), so callers compute it only when a KV disk
// cache needs it and remember it (kv/model_identity_store.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>

#include "core/mapped_file.h"
#include "kv/kv_file.h"

namespace dsv4 {

inline constexpr uint64_t k_identity_chunk_bytes = uint64_t{16} << 20;
inline constexpr char k_identity_tag[16] = {'d', 's', 'v', '4', '-', 'm', 'o', 'd',
                                            'e', 'l', '-', 'i', 'd', '-', 'v', '1'};

// The identity of `file` (its whole mapping) under `fingerprint` (32 raw
// bytes). Leaves are hashed on n_threads threads (<= 0: every core);
// progress(bytes done, total) is called after each leaf, from one thread at a time.
Digest model_content_identity(const MappedFile& file, std::string_view fingerprint, int n_threads,
                              const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace dsv4
