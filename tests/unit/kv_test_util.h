// Helpers shared by the KV-cache tests: temporary directories, file bytes,
// stand-in session snapshots for store-level tests that need no model, and
// model files that differ from another in one byte.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kv/kv_file.h"
#include "kv/snapshot.h"

namespace kvtest {

// A fresh directory under the system temp dir, removed with its contents at scope exit.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path = (std::filesystem::temp_directory_path() /
            ("dsv4_kv_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
               .string();
    std::filesystem::remove_all(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Writes a copy of the GGUF model `src` at `dst` with one byte flipped in the
// middle of the first tensor of more than 8 KiB, outside its first and last
// 4 KiB. False when `src` cannot be read or has no such tensor.
inline bool write_flipped_copy(const std::string& src, const std::string& dst) {
  auto g = dsv4::GgufFile::open(src);
  if (!g) return false;
  const dsv4::GgufTensorInfo* big = nullptr;
  for (const dsv4::GgufTensorInfo& t : (*g)->tensors())
    if (!big && t.n_bytes > 8192) big = &t;
  if (!big) return false;
  std::vector<uint8_t> b = read_bytes(src);
  const uint64_t at = (*g)->data_offset() + big->rel_offset + big->n_bytes / 2;
  b[static_cast<size_t>(at)] ^= 0x40;
  write_bytes(dst, b);
  return true;
}

inline unsigned mode_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 0777;
}

// The 92-byte header of a full session snapshot (kv/snapshot.h, k_snapshot_version)
// followed by `body` pattern bytes: enough for snapshot_peek, which is all the
// store checks. Only an engine can make a loadable payload.
inline std::vector<uint8_t> fake_snapshot(uint64_t n_tokens, uint32_t numerics = 0, size_t body = 256,
                                          uint8_t seed = 1) {
  std::vector<uint8_t> b;
  auto put = [&](auto v) {
    uint8_t x[sizeof v];
    std::memcpy(x, &v, sizeof v);
    b.insert(b.end(), x, x + sizeof v);
  };
  const char magic[8] = {'D', 'S', 'V', '4', 'S', 'N', 'A', 'P'};
  b.insert(b.end(), magic, magic + 8);
  put(dsv4::k_snapshot_version);
  put(uint32_t{1});             // flags: full snapshot (rows included)
  b.insert(b.end(), 32, 0xab);  // layout fingerprint
  put(numerics);
  for (uint32_t v : {6u, 128u, 64u, 4u, 256u, 512u, 128u, 4096u}) put(v);  // shape fields + ctx
  put(n_tokens);
  for (size_t i = 0; i < body; ++i) b.push_back(static_cast<uint8_t>(seed * 31 + i * 7));
  return b;
}

inline dsv4::KvIdentity test_identity(uint8_t tag = 1) {
  dsv4::KvIdentity id;
  id.model.fill(tag);
  id.numerics = 0;
  id.expert_gate_up_type = 16;
  id.expert_down_type = 10;
  id.dense_type = 8;
  id.routed_bits = 2;
  return id;
}

}  // namespace kvtest
