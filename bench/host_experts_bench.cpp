// The host experts (backend/host) at q2 Flash shapes: one decode token's k = 1, 2, 6 experts per call,
// back to back (as decode layers come), best of 20: ms per call and GB/s of expert bytes.
//   build/bench/host_experts_bench [threads (default 0: every core but one)]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include "backend/host/host_experts.h"
#include "core/float_conv.h"

using namespace dsv4;

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 0;  // 0: every core but one (HostExperts)
  const int64_t D = 4096, F = 2048, E = 8;
  const int64_t gb = F * (D / 256) * 66, db = D * (F / 256) * 84, eb = 2 * gb + db;
  std::vector<uint8_t> mem(E * eb);
  std::mt19937_64 g(1);
  for (size_t i = 0; i + 8 <= mem.size(); i += 8) {
    uint64_t v = g();
    memcpy(&mem[i], &v, 8);
  }
  uint16_t d = f32_to_f16(1e-3f);
  for (int64_t e = 0; e < E; ++e) {
    uint8_t* x = mem.data() + e * eb;
    for (int64_t b = 0; b < 2 * gb; b += 66) memcpy(x + b, &d, 2);
    for (int64_t b = 0; b < db; b += 84) {
      memcpy(x + 2 * gb + b + 80, &d, 2);
      memcpy(x + 2 * gb + b + 82, &d, 2);
    }
  }
  HostExperts he(threads);
  std::vector<float> x(D), y(6 * D), w(6, 0.2f);
  for (int64_t i = 0; i < D; ++i) x[i] = std::sin(0.1f * i);
  for (int k : {1, 2, 6}) {
    HostExpertTask t;
    t.gate = {GgmlType::IQ2_XXS, mem.data(), F, D, eb, E};
    t.up = {GgmlType::IQ2_XXS, mem.data() + gb, F, D, eb, E};
    t.down = {GgmlType::Q2_K, mem.data() + 2 * gb, D, F, eb, E};
    t.n_tokens = 1;
    t.k = k;
    t.x = x.data();
    t.weights = w.data();
    t.y = y.data();
    std::vector<int32_t> ids(k);
    for (int i = 0; i < k; ++i) ids[i] = -1 - i;
    t.experts = ids.data();
    double best = 1e9;
    for (int rep = 0; rep < 20; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      he.run(t);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    printf("threads %d k=%d: %.3f ms per call, %.2f GB/s (%.2f per thread)\n", he.threads(), k, best * 1e3,
           k * eb / best / 1e9, k * eb / best / 1e9 / he.threads());
  }
}
