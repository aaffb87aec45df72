#include "core/hash.h"

#include <openssl/evp.h>

#include "core/assert.h"

namespace dsv4 {

struct Hasher::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Hasher::Hasher(HashKind kind) : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  DSV4_ASSERT(impl_->ctx != nullptr);
  const EVP_MD* md = nullptr;
  switch (kind) {
    case HashKind::SHA1: md = EVP_sha1(); break;
    case HashKind::SHA256: md = EVP_sha256(); break;
  }
  DSV4_ASSERT(EVP_DigestInit_ex(impl_->ctx, md, nullptr) == 1);
}

Hasher::~Hasher() { EVP_MD_CTX_free(impl_->ctx); }

void Hasher::update(const void* data, size_t size) { DSV4_ASSERT(EVP_DigestUpdate(impl_->ctx, data, size) == 1); }

std::string Hasher::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  DSV4_ASSERT(EVP_DigestFinal_ex(impl_->ctx, md, &len) == 1);
  static const char* k_hex = "0123456789abcdef";
  std::string out(len * 2, '0');
  for (unsigned i = 0; i < len; ++i) {
    out[2 * i] = k_hex[md[i] >> 4];
    out[2 * i + 1] = k_hex[md[i] & 15];
  }
  return out;
}

std::string sha256_hex(const void* data, size_t size) {
  Hasher h(HashKind::SHA256);
  h.update(data, size);
  return h.hex_digest();
}

std::string sha1_hex(const void* data, size_t size) {
  Hasher h(HashKind::SHA1);
  h.update(data, size);
  return h.hex_digest();
}

}  // namespace dsv4
