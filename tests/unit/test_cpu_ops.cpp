// CPU reference ops whose fused forms the model uses: RmsNormOp with RoPE is
// the norm then RopeOp on its output, and MatmulOp::accumulate is the matmul
// then AddOp — bit for bit (the CUDA kernels are tested against these).
#include <gtest/gtest.h>

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
