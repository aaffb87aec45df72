// The Hugging Face golden fixture (tests/fixtures/golden/flash_tiny, made by
// tools/golden/make_golden.py with transformers on the GPU machine): token
// sequences and transformers' logits at every position, plus the per-position
// comparison both the CPU test (tests/unit/test_golden.cpp) and the CUDA test
// (tests/cuda/test_cuda_golden.cpp) apply.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::golden {

struct Golden {
  std::vector<std::vector<int32_t>> sequences;
  std::vector<std::vector<float>> logits;  // [seq][pos * V + v]
  uint32_t vocab = 0;
  std::string error;  // non-empty when the fixture could not be read
};

inline Golden load_golden(const std::string& dir) {
  Golden g;
  std::ifstream in(dir + "/tokens.json");
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) {
    g.error = "missing or malformed " + dir + "/tokens.json (run tools/golden/make_golden.py on the GPU machine)";
    return g;
  }
  g.vocab = j["vocab_size"].get<uint32_t>();
  for (const auto& s : j["sequences"]) g.sequences.push_back(s.get<std::vector<int32_t>>());
  for (size_t i = 0; i < g.sequences.size(); ++i) {
    std::ifstream f(dir + "/logits_" + std::to_string(i) + ".f32", std::ios::binary);
    std::vector<float> v(g.sequences[i].size() * g.vocab);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
    if (!f.good()) g.error = "logits_" + std::to_string(i) + ".f32 is short";
    g.logits.push_back(std::move(v));
  }
  return g;
}

// Agreement of our logits with a reference, accumulated over positions.
struct Compare {
  size_t positions = 0, top1_same = 0;
  double max_rel = 0;  // max |Δ| / spread (the reference's max - min logit at that position)
  double kl_sum = 0;   // KL(ref || ours) of the softmax distributions
};

inline void compare(const float* ref, const float* ours, uint32_t V, Compare& c) {
  double rmx = ref[0], rmn = ref[0], omx = ours[0];
  uint32_t rarg = 0, oarg = 0;
  for (uint32_t v = 1; v < V; ++v) {
    if (ref[v] > rmx) rmx = ref[v], rarg = v;
    if (ref[v] < rmn) rmn = ref[v];
    if (ours[v] > omx) omx = ours[v], oarg = v;
  }
  double maxd = 0, zr = 0, zo = 0;
  for (uint32_t v = 0; v < V; ++v) {
    maxd = std::max(maxd, std::fabs(double(ref[v]) - ours[v]));
    zr += std::exp(ref[v] - rmx);
    zo += std::exp(ours[v] - omx);
  }
  double kl = 0;
  for (uint32_t v = 0; v < V; ++v) {
    double lp = ref[v] - rmx - std::log(zr), lq = ours[v] - omx - std::log(zo);
    kl += std::exp(lp) * (lp - lq);
  }
  c.positions++;
  c.top1_same += rarg == oarg;
  c.max_rel = std::max(c.max_rel, maxd / std::max(rmx - rmn, 1e-6));
  c.kl_sum += kl;
}

}  // namespace dsv4::golden
