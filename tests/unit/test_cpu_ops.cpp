// CPU reference ops whose fused forms the model uses: RmsNormOp with RoPE is
// the norm then RopeOp on its output, MatmulOp::accumulate is the matmul
// then AddOp, and the activation quantisation of RmsNormOp / HcPreOp / SwigluOp
// is the op then ActQuantOp on its output — bit for bit (the CUDA kernels are
// tested against these).
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

using namespace dsv4;

namespace {

std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(g);
  return v;
}

Tensor filled(Backend& b, const std::vector<float>& v, int64_t n0, int64_t n1 = 1) {
  Tensor t = b.alloc(GgmlType::F32, n0, n1);
  b.write(t, v.data(), v.size() * sizeof(float));
  return t;
}

std::vector<float> get(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  b.read(t, v.data(), v.size() * sizeof(float));
  return v;
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(CpuOps, RmsNormWithRopeIsNormThenRope) {
  auto be = make_cpu_backend(2);
  RopeParams rp;
  rp.n_rot = 64;
  rp.theta = 10000.0f;
  const int64_t d = 128, per_tok = 4, n = 3;
  const std::vector<float> xv = normal(static_cast<size_t>(d * per_tok * n), 1, 3.0f);
  Tensor fused = filled(*be, xv, d, per_tok * n), sep = filled(*be, xv, d, per_tok * n);
  Tensor w = filled(*be, normal(static_cast<size_t>(d), 2), d);
  const std::vector<int32_t> pv = {0, 7, 100000};
  Tensor pos = be->alloc(GgmlType::I32, n);
  be->write(pos, pv.data(), pv.size() * sizeof(int32_t));
  be->rms_norm(
      {.out = fused, .x = fused, .w = w, .eps = 1e-6f, .rope_pos = pos, .rope = rp, .rope_rows_per_token = per_tok});
  be->rms_norm({.out = sep, .x = sep, .w = w, .eps = 1e-6f});
  be->rope({.x = sep.reshape(d, per_tok, n), .pos = pos, .rope = rp, .inverse = false});
  const std::vector<float> a = get(*be, fused), b = get(*be, sep);
  EXPECT_TRUE(same_bytes(a, b));
  EXPECT_FALSE(same_bytes(a, xv));  // it did something
}

TEST(CpuOps, MatmulAccumulateIsMatmulThenAdd) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 48, cols = 64, n = 3;
  Tensor w = filled(*be, normal(static_cast<size_t>(rows * cols), 3), cols, rows);
  Tensor x = filled(*be, normal(static_cast<size_t>(cols * n), 4), cols, n);
  const std::vector<float> base = normal(static_cast<size_t>(rows * n), 5);
  Tensor acc = filled(*be, base, rows, n), sum = filled(*be, base, rows, n);
  Tensor prod = be->alloc(GgmlType::F32, rows, n);
  be->matmul({.out = acc, .w = w, .x = x, .groups = 1, .accumulate = true});
  be->matmul({prod, w, x});
  be->add({sum, prod});
  EXPECT_TRUE(same_bytes(get(*be, acc), get(*be, sum)));
  EXPECT_FALSE(same_bytes(get(*be, acc), base));
}

TEST(CpuOps, MatmulQuantisingXIsActQuantThenMatmul) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 40, cols = 96, n = 2;
  Tensor w = filled(*be, normal(static_cast<size_t>(rows * cols), 15), cols, rows);
  const std::vector<float> xv = normal(static_cast<size_t>(cols * n), 16, 2.0f);
  Tensor x = filled(*be, xv, cols, n), xs = filled(*be, xv, cols, n);
  Tensor out = be->alloc(GgmlType::F32, rows, n), want = be->alloc(GgmlType::F32, rows, n);
  be->matmul({.out = out, .w = w, .x = x, .x_quantise = ActQuant::INT8_32});
  be->act_quant({.out = xs, .x = xs, .quant = ActQuant::INT8_32});
  be->matmul({.out = want, .w = w, .x = xs, .x_quant = ActQuant::INT8_32});
  EXPECT_TRUE(same_bytes(get(*be, out), get(*be, want)));
  EXPECT_FALSE(same_bytes(get(*be, xs), xv));  // the quantisation did something
}

TEST(CpuOps, ActQuantIsTheRowFunctionInPlaceOrNot) {
  auto be = make_cpu_backend(2);
  const int64_t d = 300, rows = 5;
  const std::vector<float> xv = normal(static_cast<size_t>(d * rows), 6, 2.0f);
  Tensor x = filled(*be, xv, d, rows), out = be->alloc(GgmlType::F32, d, rows);
  be->act_quant({.out = out, .x = x, .quant = ActQuant::FP8_128});
  std::vector<float> want = xv;
  for (int64_t r = 0; r < rows; ++r) act_quant_row(want.data() + r * d, d, ActQuant::FP8_128);
  EXPECT_TRUE(same_bytes(get(*be, out), want));
  EXPECT_TRUE(same_bytes(get(*be, x), xv));  // the input is left alone
  be->act_quant({.out = x, .x = x, .quant = ActQuant::FP8_128});
  EXPECT_TRUE(same_bytes(get(*be, x), want));
  EXPECT_FALSE(same_bytes(want, xv));
}

TEST(CpuOps, QuantisedNormAndSwigluAreTheOpThenActQuant) {
  auto be = make_cpu_backend(2);
  const int64_t d = 300, rows = 4;  // a short last block of 12
  const std::vector<float> xv = normal(static_cast<size_t>(d * rows), 7, 3.0f);
  Tensor w = filled(*be, normal(static_cast<size_t>(d), 8), d);
  for (ActQuant q : {ActQuant::INT8_32, ActQuant::FP8_128}) {
    // RmsNormOp: into q (out keeps the unquantised rows) and in place.
    Tensor x = filled(*be, xv, d, rows), out = be->alloc(GgmlType::F32, d, rows),
           qo = be->alloc(GgmlType::F32, d, rows);
    be->rms_norm({.out = out, .x = x, .w = w, .eps = 1e-6f, .quant = q, .q = qo});
    Tensor sep = filled(*be, xv, d, rows);
    be->rms_norm({.out = sep, .x = sep, .w = w, .eps = 1e-6f});
    const std::vector<float> normed = get(*be, sep);
    be->act_quant({.out = sep, .x = sep, .quant = q});
    const std::vector<float> want = get(*be, sep);
    EXPECT_TRUE(same_bytes(get(*be, out), normed)) << act_quant_name(q);
    EXPECT_TRUE(same_bytes(get(*be, qo), want)) << act_quant_name(q);
    EXPECT_FALSE(same_bytes(want, normed));
    be->rms_norm({.out = x, .x = x, .w = w, .eps = 1e-6f, .quant = q});
    EXPECT_TRUE(same_bytes(get(*be, x), want)) << act_quant_name(q);

    // SwigluOp (in place by definition).
    Tensor g = filled(*be, normal(static_cast<size_t>(d * rows), 9, 8.0f), d, rows);
    Tensor u = filled(*be, normal(static_cast<size_t>(d * rows), 10, 8.0f), d, rows);
    Tensor h = be->alloc(GgmlType::F32, d, rows), hs = be->alloc(GgmlType::F32, d, rows);
    be->swiglu({.out = h, .gate = g, .up = u, .clamp = 10.0f, .quant = q});
    be->swiglu({.out = hs, .gate = g, .up = u, .clamp = 10.0f});
    be->act_quant({.out = hs, .x = hs, .quant = q});
    EXPECT_TRUE(same_bytes(get(*be, h), get(*be, hs))) << act_quant_name(q);
  }
}

TEST(CpuOps, HcPreQuantisedNormIsTheNormThenActQuant) {
  auto be = make_cpu_backend(2);
  const int64_t D = 64, hc = 4, n = 3, mix = (2 + hc) * hc;
  Tensor state = filled(*be, normal(static_cast<size_t>(D * hc * n), 11), D, hc * n).reshape(D, hc, n);
  Tensor fn = filled(*be, normal(static_cast<size_t>(hc * D * mix), 12, 0.1f), hc * D, mix);
  Tensor scale = filled(*be, {1.0f, 0.5f, 2.0f}, 3), base = filled(*be, normal(static_cast<size_t>(mix), 13), mix);
  Tensor nw = filled(*be, normal(static_cast<size_t>(D), 14), D);
  Tensor u = be->alloc(GgmlType::F32, D, n), post = be->alloc(GgmlType::F32, hc, n);
  Tensor comb = be->alloc(GgmlType::F32, hc * hc, n).reshape(hc, hc, n);
  Tensor xn = be->alloc(GgmlType::F32, D, n), xq = be->alloc(GgmlType::F32, D, n);
  be->hc_pre({.u = u,
              .post = post,
              .comb = comb,
              .state = state,
              .fn = fn,
              .scale = scale,
              .base = base,
              .norm_out = xn,
              .norm_w = nw,
              .norm_q = xq,
              .norm_quant = ActQuant::INT8_32});
  std::vector<float> want = get(*be, xn);
  for (int64_t t = 0; t < n; ++t) act_quant_row(want.data() + t * D, D, ActQuant::INT8_32);
  EXPECT_TRUE(same_bytes(get(*be, xq), want));
  EXPECT_FALSE(same_bytes(want, get(*be, xn)));
}

TEST(CpuOps, MoeMidQuantQuantisesTheDownProjectionsInput) {
  // One expert per token (k = 1, weight 1): out = W_down act_quant(silu(min(W_gate x, c)) * clamp(W_up x)),
  // built here from matmul, swiglu and act_quant.
  auto be = make_cpu_backend(2);
  const int64_t D = 64, F = 256, E = 3, n = 4;
  Tensor gate = filled(*be, normal(static_cast<size_t>(E * F * D), 7, 0.2f), D, F * E);
  Tensor up = filled(*be, normal(static_cast<size_t>(E * F * D), 8, 0.2f), D, F * E);
  Tensor down = filled(*be, normal(static_cast<size_t>(E * D * F), 9, 0.1f), F, D * E);
  Tensor x = filled(*be, normal(static_cast<size_t>(D * n), 10), D, n);
  const std::vector<int32_t> ev = {2, 0, 2, 1};
  Tensor experts = be->alloc(GgmlType::I32, 1, n);
  be->write(experts, ev.data(), ev.size() * sizeof(int32_t));
  Tensor weights = filled(*be, std::vector<float>(static_cast<size_t>(n), 1.0f), 1, n);
  auto run = [&](ActQuant q) {
    Tensor out = be->alloc(GgmlType::F32, D, n);
    be->moe_experts({.out = out,
                     .x = x,
                     .gate = gate.reshape(D, F, E),
                     .up = up.reshape(D, F, E),
                     .down = down.reshape(F, D, E),
                     .experts = experts,
                     .weights = weights,
                     .clamp = 10.0f,
                     .mid_quant = q});
    return get(*be, out);
  };
  const std::vector<float> quant = run(ActQuant::FP8_128), plain = run(ActQuant::NONE);
  EXPECT_FALSE(same_bytes(quant, plain));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t e = ev[static_cast<size_t>(t)];
    Tensor g = be->alloc(GgmlType::F32, F, 1), u = be->alloc(GgmlType::F32, F, 1), h = be->alloc(GgmlType::F32, F, 1);
    Tensor y = be->alloc(GgmlType::F32, D, 1);
    be->matmul({g, gate.rows(e * F, F), x.rows(t, 1)});
    be->matmul({u, up.rows(e * F, F), x.rows(t, 1)});
    be->swiglu({.out = h, .gate = g, .up = u, .clamp = 10.0f});
    be->act_quant({.out = h, .x = h, .quant = ActQuant::FP8_128});
    be->matmul({y, down.rows(e * D, D), h});
    const std::vector<float> want = get(*be, y);
    for (int64_t i = 0; i < D; ++i)
      EXPECT_NEAR(quant[static_cast<size_t>(t * D + i)], want[static_cast<size_t>(i)], 1e-5f) << t << "," << i;
  }
}

// dot4 is four dots computed together: each result bitwise dot's, for every length (the 8-wide body and the
// tail), and dot(a, b) == dot(b, a) (the matmul's row groups rely on it).
TEST(CpuOps, Dot4IsFourDotsBitwise) {
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 31, 64, 100, 1000, 4096}) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(4 * n));
    for (auto& v : a) v = d(g);
    for (auto& v : b) v = d(g) * 1e3f;
    const float* rows[4] = {b.data(), b.data() + n, b.data() + 2 * n, b.data() + 3 * n};
    float out[4];
    cpu::dot4(a.data(), rows, n, out);
    for (int j = 0; j < 4; ++j) {
      const float want = cpu::dot(a.data(), rows[j], n);
      EXPECT_EQ(std::bit_cast<uint32_t>(out[j]), std::bit_cast<uint32_t>(want)) << "n " << n << " row " << j;
      EXPECT_EQ(std::bit_cast<uint32_t>(cpu::dot(rows[j], a.data(), n)), std::bit_cast<uint32_t>(want));
    }
  }
}
