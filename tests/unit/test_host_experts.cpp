// The host's expert path (backend/host): the SIMD dot products are the scalar
// reference bit for bit, and HostExperts matches the CPU backend's f32
// reference MoE within the 8-bit activation quantisation's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/host/host_experts.h"
#include "core/spin_team.h"
#include "core/float_conv.h"
#include "quant/dot_fast.h"
#include "quant/quant.h"

using namespace dsv4;

namespace {

std::vector<float> normals(std::mt19937& g, size_t n, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

std::vector<uint8_t> quantized(GgmlType t, const std::vector<float>& x, int64_t cols) {
  const auto rows = static_cast<int64_t>(x.size()) / cols;
  const size_t rb = ggml_row_bytes(t, static_cast<uint64_t>(cols));
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) quant::quantize_row(t, x.data() + r * cols, out.data() + r * rb, cols);
  return out;
}

// Q8_K rows with arbitrary int8 values (including -128, which the quantiser never makes) and matching bsums.
std::vector<quant::BlockQ8_K> raw_q8k(std::mt19937& g, int64_t n) {
  std::vector<quant::BlockQ8_K> a(static_cast<size_t>(n / quant::k_qk_k));
  for (auto& b : a) {
    b.d = std::uniform_real_distribution<float>(-0.1f, 0.1f)(g);
    for (auto& q : b.qs) q = static_cast<int8_t>(g() & 0xFF);
    for (int s = 0; s < 16; ++s) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += b.qs[16 * s + i];
      b.bsums[s] = static_cast<int16_t>(sum);
    }
  }
  return a;
}

bool bits_equal(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace

// Every kernel the CPU has: the widest, then each narrower one (set_dot_fast_isa caps them).
TEST(FastDot, EqualsTheScalarReferenceBitForBit) {
  std::mt19937 g(7);
  std::printf("fast dot ISA: %s\n", quant::dot_fast_isa());
  for (quant::DotIsa cap : {quant::DotIsa::AVX512, quant::DotIsa::AVX2})
    for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::MXFP4}) {
      quant::set_dot_fast_isa(cap);
      const bool small_blocks = ggml_type_info(t).block_elems == 32;  // rows of any multiple of 32
      // Small blocks: 7 and 13 blocks too (MXFP4's kernel takes 8 blocks at a time, then a tail).
      for (int64_t n : {int64_t{256}, int64_t{1024}, int64_t{4096}, int64_t{small_blocks ? 224 : 512},
                        int64_t{small_blocks ? 416 : 768}}) {
        for (int trial = 0; trial < 20; ++trial) {
          // Weights quantised from normals (realistic scales) or raw random bytes (every code, any scale).
          std::vector<uint8_t> w;
          if (trial % 2 == 0) {
            w = quantized(t, normals(g, static_cast<size_t>(n)), n);
          } else {
            w.resize(ggml_row_bytes(t, static_cast<uint64_t>(n)));
            for (auto& b : w) b = static_cast<uint8_t>(g());
            // Finite super-scales: the f16 fields of every block set to small values.
            const size_t bb = ggml_type_info(t).block_bytes;
            const int64_t nb = n / static_cast<int64_t>(ggml_type_info(t).block_elems);
            for (int64_t i = 0; i < nb; ++i) {
              uint8_t* blk = w.data() + static_cast<size_t>(i) * bb;
              const uint16_t d = f32_to_f16(std::uniform_real_distribution<float>(-0.01f, 0.01f)(g));
              if (t == GgmlType::MXFP4) {
                blk[0] = static_cast<uint8_t>(100 + g() % 40);  // E8M0 scale 2^-27 .. 2^12
              } else if (t == GgmlType::Q2_K) {
                std::memcpy(blk + 80, &d, 2);
                std::memcpy(blk + 82, &d, 2);
              } else {
                std::memcpy(blk, &d, 2);
                if (t == GgmlType::Q4_K) std::memcpy(blk + 2, &d, 2);
              }
            }
          }
          std::vector<uint8_t> act(quant::act_row_bytes(t, n));
          if (quant::act_type(t) == GgmlType::Q8_K && trial % 3 == 1) {
            auto raw = raw_q8k(g, n);
            std::memcpy(act.data(), raw.data(), act.size());
          } else if (trial % 3 == 1) {  // Q8_0F blocks with arbitrary int8 values (-128 included)
            auto* blocks = reinterpret_cast<quant::BlockQ8_0F*>(act.data());
            for (int64_t i = 0; i < n / quant::k_qk8_0; ++i) {
              blocks[i].d = std::uniform_real_distribution<float>(-0.1f, 0.1f)(g);
              for (auto& q : blocks[i].qs) q = static_cast<int8_t>(g() & 0xFF);
            }
          } else {
            quant::quantize_act(t, normals(g, static_cast<size_t>(n), trial % 4 == 0 ? 100.0f : 1.0f).data(),
                                act.data(), n);
          }
          const float ref = quant::vec_dot_q(t, w.data(), act.data(), n);
          const float fast = quant::vec_dot_q_fast(t, w.data(), act.data(), n);
          ASSERT_TRUE(bits_equal(ref, fast)) << quant::dot_fast_isa() << " " << ggml_type_name(t) << " n=" << n
                                             << " trial " << trial << ": " << ref << " vs " << fast;
        }
      }
    }
  quant::set_dot_fast_isa(quant::DotIsa::AVX512);
}

namespace {

struct Experts {
  GgmlType gu, dn;
  int64_t E, F, D;
  std::vector<uint8_t> gate, up, down;
  Experts(std::mt19937& g, GgmlType gate_up, GgmlType down_t, int64_t e, int64_t f, int64_t d)
      : gu(gate_up), dn(down_t), E(e), F(f), D(d) {
    gate = quantized(gu, normals(g, static_cast<size_t>(E * F * D), 0.05f), D);
    up = quantized(gu, normals(g, static_cast<size_t>(E * F * D), 0.05f), D);
    down = quantized(dn, normals(g, static_cast<size_t>(E * D * F), 0.05f), F);
  }
  HostExpertMatrix mat(const std::vector<uint8_t>& b, GgmlType t, int64_t rows, int64_t cols) const {
    return {t, b.data(), rows, cols, static_cast<int64_t>(b.size()) / E, E};
  }
  HostExpertTask task(int64_t n, int64_t k, const float* x, const int32_t* ex, const float* w, float* y) const {
    HostExpertTask t;
    t.gate = mat(gate, gu, F, D);
    t.up = mat(up, gu, F, D);
    t.down = mat(down, dn, D, F);
    t.n_tokens = n;
    t.k = k;
    t.x = x;
    t.experts = ex;
    t.weights = w;
    t.y = y;
    return t;
  }
};

double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : num;
}

}  // namespace

// Every assignment on the host, y summed per token, against cpu::moe_experts (f32 activations): the error of
// quantising x and mid to 8 bits (NMSE 7e-5 to 3e-4 measured here; bound 1e-3); and the host's rows do not depend on
// which other assignments are the host's, nor on the thread count.
TEST(HostExperts, MatchesTheReferenceMoeWithinTheActivationQuantisation) {
  std::mt19937 g(11);
  struct Case {
    GgmlType gu, dn;
    int64_t E, F, D, k, n;
  };
  for (const Case& c : {Case{GgmlType::IQ2_XXS, GgmlType::Q2_K, 8, 512, 1024, 3, 4},
                        Case{GgmlType::Q4_K, GgmlType::Q4_K, 6, 256, 512, 2, 1},
                        Case{GgmlType::MXFP4, GgmlType::MXFP4, 4, 256, 512, 2, 2},
                        Case{GgmlType::Q8_0, GgmlType::F16, 4, 64, 128, 2, 3}}) {
    Experts ex(g, c.gu, c.dn, c.E, c.F, c.D);
    const int64_t na = c.n * c.k;
    std::vector<float> x = normals(g, static_cast<size_t>(c.n * c.D));
    std::vector<int32_t> e(static_cast<size_t>(na)), host(static_cast<size_t>(na));
    std::vector<float> w(static_cast<size_t>(na));
    for (int64_t a = 0; a < na; ++a) {
      e[static_cast<size_t>(a)] = static_cast<int32_t>((a * 5 + a / c.k) % c.E);
      host[static_cast<size_t>(a)] = -1 - e[static_cast<size_t>(a)];
      w[static_cast<size_t>(a)] = 0.2f + 0.1f * static_cast<float>(a % 3);
    }
    std::vector<float> y(static_cast<size_t>(na * c.D), std::nanf(""));
    HostExperts h4(4), h1(1);
    EXPECT_EQ(h4.run(ex.task(c.n, c.k, x.data(), host.data(), w.data(), y.data())), na);
    std::vector<float> got(static_cast<size_t>(c.n * c.D), 0.0f), ref(got.size());
    for (int64_t a = 0; a < na; ++a)
      for (int64_t d = 0; d < c.D; ++d)
        got[static_cast<size_t>((a / c.k) * c.D + d)] += y[static_cast<size_t>(a * c.D + d)];
    cpu::moe_experts({.out = make_tensor(ref.data(), GgmlType::F32, c.D, c.n),
                      .x = make_tensor(x.data(), GgmlType::F32, c.D, c.n),
                      .gate = make_tensor(ex.gate.data(), c.gu, c.D, c.F, c.E),
                      .up = make_tensor(ex.up.data(), c.gu, c.D, c.F, c.E),
                      .down = make_tensor(ex.down.data(), c.dn, c.F, c.D, c.E),
                      .experts = make_tensor(e.data(), GgmlType::I32, c.k, c.n),
                      .weights = make_tensor(w.data(), GgmlType::F32, c.k, c.n),
                      .clamp = 10.0f});
    const double err = nmse(got, ref);
    std::printf("%s/%s: NMSE vs the f32 reference %.3g\n", ggml_type_name(c.gu), ggml_type_name(c.dn), err);
    EXPECT_LT(err, 1e-3) << ggml_type_name(c.gu);
    EXPECT_GT(err, 0.0) << "the host path quantises activations: an exact match means the test compares nothing";

    // Every other assignment on the host, one thread: those rows equal the all-host rows bitwise, the others are 0.
    std::vector<int32_t> mixed = e;
    for (int64_t a = 0; a < na; a += 2) mixed[static_cast<size_t>(a)] = host[static_cast<size_t>(a)];
    std::vector<float> y1(y.size(), std::nanf(""));
    EXPECT_EQ(h1.run(ex.task(c.n, c.k, x.data(), mixed.data(), w.data(), y1.data())), (na + 1) / 2);
    for (int64_t a = 0; a < na; ++a)
      for (int64_t d = 0; d < c.D; ++d) {
        const size_t i = static_cast<size_t>(a * c.D + d);
        if (a % 2 == 0)
          ASSERT_TRUE(bits_equal(y1[i], y[i])) << "assignment " << a << " row " << d;
        else
          ASSERT_EQ(y1[i], 0.0f) << "assignment " << a << " is the GPU's";
      }
    // zero_others off (the CUDA runner, whose sum reads only the host's rows): the others are left as they were.
    std::vector<float> y2(y.size(), 7.0f);
    HostExpertTask keep = ex.task(c.n, c.k, x.data(), mixed.data(), w.data(), y2.data());
    keep.zero_others = false;
    EXPECT_EQ(h1.run(keep), (na + 1) / 2);
    for (int64_t a = 0; a < na; ++a)
      for (int64_t d = 0; d < c.D; ++d) {
        const size_t i = static_cast<size_t>(a * c.D + d);
        if (a % 2 == 0)
          ASSERT_TRUE(bits_equal(y2[i], y[i])) << "assignment " << a << " row " << d;
        else
          ASSERT_EQ(y2[i], 7.0f) << "assignment " << a << " is the GPU's";
      }
  }
}

// MoeExpertsOp::mid_quant (fast numerics) on the host, in the coarse FP8 format: within the bound of the
// reference that rounds mid the same way, and different from the host without it (the flag takes effect).
// The host's own 8-bit rows of x move mid across FP8 rounding boundaries now and then, so it is not nearer
// that reference than to the unrounded one by a margin a test could demand.
TEST(HostExperts, QuantisesTheMidVectorLikeTheReference) {
  std::mt19937 g(12);
  const int64_t E = 8, F = 256, D = 512, k = 3, n = 2, na = n * k;
  Experts ex(g, GgmlType::IQ2_XXS, GgmlType::Q2_K, E, F, D);
  std::vector<float> x = normals(g, static_cast<size_t>(n * D)), w(static_cast<size_t>(na), 0.4f);
  std::vector<int32_t> e(static_cast<size_t>(na)), host(static_cast<size_t>(na));
  for (int64_t a = 0; a < na; ++a) {
    e[static_cast<size_t>(a)] = static_cast<int32_t>((a * 3 + 1) % E);
    host[static_cast<size_t>(a)] = -1 - e[static_cast<size_t>(a)];
  }
  std::vector<float> y(static_cast<size_t>(na * D));
  HostExperts h(2);
  HostExpertTask t = ex.task(n, k, x.data(), host.data(), w.data(), y.data());
  auto run = [&](ActQuant q) {
    t.mid_quant = q;
    EXPECT_EQ(h.run(t), na);
    std::vector<float> sum(static_cast<size_t>(n * D), 0.0f);
    for (int64_t a = 0; a < na; ++a)
      for (int64_t d = 0; d < D; ++d) sum[static_cast<size_t>((a / k) * D + d)] += y[static_cast<size_t>(a * D + d)];
    return sum;
  };
  const std::vector<float> got = run(ActQuant::FP8_128), unrounded = run(ActQuant::NONE);
  auto reference = [&](ActQuant q) {
    std::vector<float> ref(got.size());
    cpu::moe_experts({.out = make_tensor(ref.data(), GgmlType::F32, D, n),
                      .x = make_tensor(x.data(), GgmlType::F32, D, n),
                      .gate = make_tensor(ex.gate.data(), ex.gu, D, F, E),
                      .up = make_tensor(ex.up.data(), ex.gu, D, F, E),
                      .down = make_tensor(ex.down.data(), ex.dn, F, D, E),
                      .experts = make_tensor(e.data(), GgmlType::I32, k, n),
                      .weights = make_tensor(w.data(), GgmlType::F32, k, n),
                      .clamp = 10.0f,
                      .mid_quant = q});
    return ref;
  };
  const double same = nmse(got, reference(ActQuant::FP8_128)), flag = nmse(got, unrounded);
  std::printf("host with FP8 mid: NMSE vs the reference with FP8 mid %.3g, vs the host without %.3g\n", same, flag);
  EXPECT_LT(same, 2e-3);
  EXPECT_GT(flag, 1e-4);
}

TEST(HostExperts, MismatchedShapesAreRefused) {
  std::mt19937 g(3);
  Experts ex(g, GgmlType::Q8_0, GgmlType::Q8_0, 2, 64, 128);
  std::vector<float> x(128), w(1, 1.0f), y(128);
  std::vector<int32_t> e{-1};
  HostExpertTask t = ex.task(1, 1, x.data(), e.data(), w.data(), y.data());
  t.down.cols = 32;
  HostExperts h(1);
  EXPECT_DEATH(h.run(t), "do not chain");
}

TEST(SpinTeam, ARunFromInsideARunIsInline) {
  SpinTeam team(3);
  std::atomic<int> total{0}, calls{0};
  team.run(8, 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      team.run(10, 2, [&](size_t b2, size_t e2) {
        EXPECT_TRUE(b2 == 0 && e2 == 10) << "inline: the whole range in one call";
        total += static_cast<int>(e2 - b2);
        ++calls;
      });
  });
  EXPECT_EQ(total.load(), 80);
  EXPECT_EQ(calls.load(), 8);
  EXPECT_FALSE(SpinTeam::in_run());  // the caller left its run
}

TEST(SpinTeam, EveryItemOnceOverManyCallsSpinningAndAfterSleeping) {
  std::mt19937 g(9);
  for (int threads : {1, 2, 4, 8}) {
    SpinTeam team(threads);
    EXPECT_EQ(team.size(), std::max(threads, 1));
    std::vector<std::atomic<int>> seen(5000);
    for (int call = 0; call < 600; ++call) {
      const size_t n = g() % 5000, grain = 1 + g() % 64;
      for (size_t i = 0; i < n; ++i) seen[i].store(0);
      team.run(n, grain, [&](size_t b, size_t e) {
        ASSERT_LE(e, n);
        ASSERT_LE(e - b, grain);
        for (size_t i = b; i < e; ++i) seen[i].fetch_add(1);
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << "item " << i << " of " << n << ", call " << call;
      // Now and then a pause longer than the spin: the workers sleep and must wake for the next call.
      if (call % 150 == 149) std::this_thread::sleep_for(SpinTeam::k_default_spin * 3);
    }
  }
}
