// Random values from the operating system's generator (OpenSSL RAND_bytes):
// ids the server hands out, seeds of requests that give none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsv4 {

// `n_bytes` random bytes (OpenSSL RAND_bytes) as 2*n_bytes lowercase hex characters.
std::string random_hex(size_t n_bytes);
// A random 64-bit value (OpenSSL RAND_bytes), e.g. for sampling seeds.
uint64_t random_u64();

}  // namespace dsv4
