// Shared pieces of the CUDA-vs-CPU test programs (no GoogleTest, so they build
// anywhere nvcc and a C++20 compiler exist): a fast seeded RNG, random weight
// blocks of every weight type, comparison by normalised MSE with exact
// handling of non-finite values, and a reporter that prints one line per check
// and a summary.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/float_conv.h"
#include "ops/ops.h"
#include "quant/quant.h"

namespace dsv4::cudatest {

// A seed from the clock and the system's random device.
inline uint64_t random_seed() {
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

// The command line `name [--seed N]` of a test program: the seed (default `seed`), printed with `name` so that a
// failure can be repeated; --help prints the usage and exits 0, anything else exits 2 with it.
inline uint64_t seed_arg(const char* name, int argc, char** argv, uint64_t seed = random_seed()) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(a == "--help" ? stdout : stderr, "usage: %s [--seed N]\n", argv[0]);
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  std::printf("%s: seed %llu (repeat with --seed %llu)\n", name, static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  return seed;
}

// xoshiro256** seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& v : s_) {
      seed += 0x9e3779b97f4a7c15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      v = z ^ (z >> 31);
    }
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }  // [0, 1)
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  float normal() {  // Box-Muller
    float u1 = uniform(), u2 = uniform();
    if (u1 < 1e-30f) u1 = 1e-30f;
    return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853f * u2);
  }
  void fill_bytes(uint8_t* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const uint64_t v = next();
      std::memcpy(p + i, &v, 8);
    }
    if (i < n) {
      const uint64_t v = next();
      std::memcpy(p + i, &v, n - i);
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

inline std::vector<float> random_normal(Rng& r, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal() * scale;
  return v;
}
inline std::vector<float> random_uniform(Rng& r, size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (auto& x : v) x = r.uniform(lo, hi);
  return v;
}

// A binary16 with magnitude in [2^-8, 2) and a random sign (fast, no NaN/inf).
inline uint16_t random_f16_bits(Rng& r) {
  const uint64_t v = r.next();
  const uint16_t exp = static_cast<uint16_t>(7 + (v >> 10) % 9);  // biased exponent 7..15
  return static_cast<uint16_t>(((v & 1) << 15) | (exp << 10) | ((v >> 20) & 0x3ff));
}

// Random bytes of `n_rows` rows of `ne0` elements of a weight type: every
// quant field random except the binary16 scales, which are small positive
// finite values (so dequantised weights stay in a sane range).
inline std::vector<uint8_t> random_weight(Rng& r, GgmlType t, int64_t ne0, int64_t n_rows) {
  using namespace quant;
  const size_t bytes = static_cast<size_t>(ggml_row_bytes(t, static_cast<uint64_t>(ne0))) * static_cast<size_t>(n_rows);
  std::vector<uint8_t> b(bytes);
  const int64_t n = ne0 * n_rows;
  auto f16 = [&](float lo, float hi) { return f32_to_f16(r.uniform(lo, hi)); };
  if (t == GgmlType::F32) {
    auto* p = reinterpret_cast<float*>(b.data());
    for (int64_t i = 0; i < n; ++i) p[i] = f16_to_f32(random_f16_bits(r)) * 0.05f;
  } else if (t == GgmlType::F16) {
    auto* p = reinterpret_cast<uint16_t*>(b.data());
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_f16(f16_to_f32(random_f16_bits(r)) * 0.05f);
  } else if (t == GgmlType::BF16) {
    auto* p = reinterpret_cast<uint16_t*>(b.data());
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(f16_to_f32(random_f16_bits(r)) * 0.05f);
  } else if (t == GgmlType::Q8_0) {
    r.fill_bytes(b.data(), b.size());
    auto* p = reinterpret_cast<BlockQ8_0*>(b.data());
    for (size_t i = 0; i < b.size() / sizeof(BlockQ8_0); ++i) p[i].d = f16(1e-4f, 5e-4f);
  } else if (t == GgmlType::Q2_K) {
    r.fill_bytes(b.data(), b.size());
    auto* p = reinterpret_cast<BlockQ2_K*>(b.data());
    for (size_t i = 0; i < b.size() / sizeof(BlockQ2_K); ++i) {
      p[i].d = f16(1e-3f, 4e-3f);
      p[i].dmin = f16(0.0f, 4e-3f);
    }
  } else if (t == GgmlType::Q4_K) {
    r.fill_bytes(b.data(), b.size());
    auto* p = reinterpret_cast<BlockQ4_K*>(b.data());
    for (size_t i = 0; i < b.size() / sizeof(BlockQ4_K); ++i) {
      p[i].d = f16(2e-5f, 1e-4f);
      p[i].dmin = f16(0.0f, 1e-4f);
    }
  } else if (t == GgmlType::IQ2_XXS) {
    r.fill_bytes(b.data(), b.size());
    auto* p = reinterpret_cast<BlockIQ2_XXS*>(b.data());
    for (size_t i = 0; i < b.size() / sizeof(BlockIQ2_XXS); ++i) p[i].d = f16(5e-4f, 2e-3f);
  } else if (t == GgmlType::MXFP4) {  // scales 2^-15 .. 2^-7: |w| <= 6 2^-7
    r.fill_bytes(b.data(), b.size());
    auto* p = reinterpret_cast<BlockMXFP4*>(b.data());
    for (size_t i = 0; i < b.size() / sizeof(BlockMXFP4); ++i) p[i].e = static_cast<uint8_t>(112 + r.below(9));
  } else {
    std::fprintf(stderr, "random_weight: %s is not a weight type\n", ggml_type_name(t));
    std::abort();
  }
  return b;
}

// Comparison of a CUDA result with the CPU reference.
struct Diff {
  double nmse = 0;            // sum (got - want)^2 / sum want^2 over elements finite in both
  int64_t n = 0;              // elements compared
  int64_t n_diff = 0;         // elements whose bits differ (+0 and -0 count as equal)
  int64_t bad_nonfinite = 0;  // non-finite in one but not the same non-finite in the other
  double max_abs = 0;
};

inline Diff diff_f32(const float* got, const float* want, size_t n) {
  Diff d;
  double num = 0, den = 0;
  d.n = static_cast<int64_t>(n);
  for (size_t i = 0; i < n; ++i) {
    const float g = got[i], w = want[i];
    const bool same_bits = g == w || (std::isnan(g) && std::isnan(w));
    if (!same_bits) ++d.n_diff;
    if (!std::isfinite(w) || !std::isfinite(g)) {
      if (!same_bits) ++d.bad_nonfinite;
      continue;
    }
    const double e = static_cast<double>(g) - static_cast<double>(w);
    num += e * e;
    den += static_cast<double>(w) * w;
    d.max_abs = std::max(d.max_abs, std::fabs(e));
  }
  d.nmse = den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
  return d;
}
inline Diff diff_f32(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) {
    Diff d;
    d.bad_nonfinite = 1;
    d.nmse = INFINITY;
    return d;
  }
  return diff_f32(got.data(), want.data(), got.size());
}
inline Diff diff_i32(const std::vector<int32_t>& got, const std::vector<int32_t>& want) {
  Diff d;
  d.n = static_cast<int64_t>(want.size());
  if (got.size() != want.size()) {
    d.n_diff = d.n ? d.n : 1;
    return d;
  }
  for (size_t i = 0; i < want.size(); ++i) d.n_diff += got[i] != want[i];
  return d;
}

// Largest minus second-largest value of v[0..n) (the top-1 margin of a logit row).
inline float margin(const float* v, int64_t n) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    if (v[i] > a) {
      b = a;
      a = v[i];
    } else if (v[i] > b) {
      b = v[i];
    }
  }
  return a - b;
}

// Prints "op  shape  result  ok/FAIL" lines and keeps the tally.
class Report {
 public:
  // NMSE check: passes when every non-finite value matches and nmse <= threshold.
  bool nmse(const std::string& op, const std::string& shape, const Diff& d, double threshold) {
    const bool ok = d.bad_nonfinite == 0 && d.nmse <= threshold;
    line(op, shape,
         strfmt("nmse %9.2e (max |d| %8.1e)  thr %7.1e  nonfinite-mismatch %lld", d.nmse, d.max_abs, threshold,
                static_cast<long long>(d.bad_nonfinite)),
         ok);
    return ok;
  }
  // Exact check: every element bit-identical.
  bool exact(const std::string& op, const std::string& shape, const Diff& d) {
    const bool ok = d.n_diff == 0 && d.bad_nonfinite == 0;
    line(op, shape, strfmt("exact: %lld of %lld differ", static_cast<long long>(d.n_diff), static_cast<long long>(d.n)),
         ok);
    return ok;
  }
  bool check(const std::string& op, const std::string& shape, bool ok, const std::string& what) {
    line(op, shape, what, ok);
    return ok;
  }
  int passed() const { return passed_; }
  int failed() const { return static_cast<int>(failures_.size()); }
  const std::vector<std::string>& failures() const { return failures_; }

 private:
  void line(const std::string& op, const std::string& shape, const std::string& what, bool ok) {
    std::printf("%-15s %-58s %s  %s\n", op.c_str(), shape.c_str(), what.c_str(), ok ? "ok" : "FAIL");
    std::fflush(stdout);
    if (ok)
      ++passed_;
    else
      failures_.push_back(op + " " + shape);
  }
  int passed_ = 0;
  std::vector<std::string> failures_;
};

}  // namespace dsv4::cudatest
