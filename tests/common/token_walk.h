// Helpers of the engine tests on the synthetic tiny model: a deterministic
// walk over its ordinary token ids (3..511) and a bitwise comparison of logits.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace dsv4::test {

// n token ids in [3, 512), the same for the same seed.
inline std::vector<int32_t> tiny_tokens(size_t n, uint32_t seed = 1) {
  std::vector<int32_t> t(n);
  uint32_t x = seed * 2654435761u + 7;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<int32_t>(3 + (x >> 8) % 509);
  }
  return t;
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace dsv4::test
