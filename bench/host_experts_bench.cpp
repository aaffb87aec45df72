// The host experts (backend/host) at Flash shapes: one decode token's k = 1, 2, 6 experts per call,
// back to back (as decode layers come), best of 20: ms per call and GB/s of expert bytes; then each dot
// kernel alone on one thread (ns per row of the gate and the down matrix).
//   build/bench/host_experts_bench [threads (default 0: every core but one)] [q2|q4|mxfp4 (default q2)]
//                                  [scalar | avx2: the reference dots, or no kernel wider than AVX2,
//                                   instead of the widest this CPU has]
// q2: IQ2_XXS gate/up, Q2_K down (the q2 file); q4: Q4_K; mxfp4: MXFP4 (the MXFP4Experts file).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/host/host_experts.h"
#include "core/float_conv.h"
#include "quant/dot_fast.h"
#include "quant/quant.h"

using namespace dsv4;

namespace {

// Random bytes with every block's scale fields set to small finite values, so every code is valid.
void fix_scales(GgmlType t, uint8_t* p, int64_t bytes) {
  const uint16_t d = f32_to_f16(1e-3f);
  const auto bb = static_cast<int64_t>(ggml_type_info(t).block_bytes);
  for (int64_t b = 0; b < bytes; b += bb) {
    if (t == GgmlType::MXFP4) {
      p[b] = 117;  // 2^-10
    } else if (t == GgmlType::Q2_K) {
      std::memcpy(p + b + 80, &d, 2);
      std::memcpy(p + b + 82, &d, 2);
    } else {
      std::memcpy(p + b, &d, 2);
      if (t == GgmlType::Q4_K) std::memcpy(p + b + 2, &d, 2);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 0;  // 0: every core but one (HostExperts)
  const std::string mix = argc > 2 ? argv[2] : "q2";
  if (argc > 3 && std::string(argv[3]) == "scalar") quant::set_dot_fast_isa(quant::DotIsa::SCALAR);
  if (argc > 3 && std::string(argv[3]) == "avx2") quant::set_dot_fast_isa(quant::DotIsa::AVX2);
  GgmlType gu = GgmlType::IQ2_XXS, dn = GgmlType::Q2_K;
  if (mix == "q4") {
    gu = dn = GgmlType::Q4_K;
  } else if (mix == "mxfp4") {
    gu = dn = GgmlType::MXFP4;
  } else if (mix != "q2") {
    std::fprintf(stderr, "unknown mix %s (q2, q4 or mxfp4)\n", mix.c_str());
    return 2;
  }
  const int64_t D = 4096, F = 2048, E = 8;
  const auto gb = static_cast<int64_t>(ggml_row_bytes(gu, D)) * F;
  const auto db = static_cast<int64_t>(ggml_row_bytes(dn, F)) * D;
  const int64_t eb = 2 * gb + db;
  std::vector<uint8_t> mem(static_cast<size_t>(E * eb));
  std::mt19937_64 g(1);
  for (size_t i = 0; i + 8 <= mem.size(); i += 8) {
    const uint64_t v = g();
    std::memcpy(&mem[i], &v, 8);
  }
  for (int64_t e = 0; e < E; ++e) {
    uint8_t* x = mem.data() + e * eb;
    fix_scales(gu, x, 2 * gb);
    fix_scales(dn, x + 2 * gb, db);
  }
  HostExperts he(threads);
  std::vector<float> x(D), y(6 * D), w(6, 0.2f);
  for (int64_t i = 0; i < D; ++i) x[i] = std::sin(0.1f * static_cast<float>(i));
  std::printf("%s experts (%s dots), %.1f MB per expert\n", mix.c_str(), quant::dot_fast_isa(), eb / 1e6);
  for (int k : {1, 2, 6}) {
    HostExpertTask t;
    t.gate = {gu, mem.data(), F, D, eb, E};
    t.up = {gu, mem.data() + gb, F, D, eb, E};
    t.down = {dn, mem.data() + 2 * gb, D, F, eb, E};
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
      const auto t0 = std::chrono::steady_clock::now();
      he.run(t);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("threads %d k=%d: %.3f ms per call, %.2f GB/s (%.2f per thread)\n", he.threads(), k, best * 1e3,
                k * eb / best / 1e9, k * eb / best / 1e9 / he.threads());
  }
  // One dot kernel alone on this thread: expert 0's gate rows against x and its down rows against a
  // row of the same length, best of 20 passes over the matrix.
  struct Mat {
    GgmlType type;
    const uint8_t* base;
    int64_t rows, cols;
  };
  for (const Mat m : {Mat{gu, mem.data(), F, D}, Mat{dn, mem.data() + 2 * gb, D, F}}) {
    std::vector<uint8_t> act(quant::act_row_bytes(m.type, m.cols));
    quant::quantize_act(m.type, x.data(), act.data(), m.cols);
    const auto rb = static_cast<int64_t>(ggml_row_bytes(m.type, static_cast<uint64_t>(m.cols)));
    double best = 1e9;
    float sink = 0.0f;
    for (int rep = 0; rep < 20; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t r = 0; r < m.rows; ++r) sink += quant::vec_dot_q_fast(m.type, m.base + r * rb, act.data(), m.cols);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("dot %s x %lld: %.1f ns per row, %.2f GB/s on one thread (%g)\n", ggml_type_name(m.type),
                static_cast<long long>(m.cols), best / static_cast<double>(m.rows) * 1e9,
                static_cast<double>(m.rows * rb) / best / 1e9, static_cast<double>(sink));
  }
}
