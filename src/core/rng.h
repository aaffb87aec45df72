// Deterministic random numbers.
//
// `Rng` is a small sequential generator (xoshiro-style state from splitmix64).
// `hash_u64` is a counter-based mix: the value for (seed, stream, index) does
// not depend on evaluation order, so generators can run in parallel (threads or
// CUDA blocks) and still produce identical bytes.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace dsv4 {

DSV4_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

DSV4_HD uint64_t hash_u64(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream + 0x632be59bd9b4e019ull)) + index);
}

// Uniform in [0, 1) with 24 random bits.
DSV4_HD float u64_to_unit(uint64_t x) { return static_cast<float>(x >> 40) * (1.0f / 16777216.0f); }

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(splitmix64(seed)) {}
  uint64_t next_u64() {
    s_ += 0x9e3779b97f4a7c15ull;
    return splitmix64(s_);
  }
  uint32_t next_u32() { return static_cast<uint32_t>(next_u64() >> 32); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return n ? next_u64() % n : 0; }
  float uniform() { return u64_to_unit(next_u64()); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller).
  float normal() {
    float u1 = uniform(), u2 = uniform();
    if (u1 < 1e-7f) u1 = 1e-7f;
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530718f * u2);
  }

 private:
  uint64_t s_;
};

}  // namespace dsv4
