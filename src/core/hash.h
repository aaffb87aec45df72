// Cryptographic digests (OpenSSL): SHA-256 for identities and checksums,
// SHA-1 where a file format names it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace dsv4 {

enum class HashKind { SHA1, SHA256 };

class Hasher {
 public:
  explicit Hasher(HashKind kind);
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Finishes and returns the digest as lowercase hex; the hasher is then spent.
  std::string hex_digest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string sha256_hex(const void* data, size_t size);
std::string sha1_hex(const void* data, size_t size);

}  // namespace dsv4
