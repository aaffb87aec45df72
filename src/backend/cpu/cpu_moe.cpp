// CPU reference: MoE router (sqrt-softplus scores, hash or biased top-k) and the
// routed experts with clamped SwiGLU (model-spec.md §6).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/thread_pool.h"

namespace dsv4::cpu {

namespace {
// Numerically safe softplus (model-spec.md §6.1).
float softplus(float z) {
  if (z > 20.0f) return z;
  if (z < -20.0f) return std::exp(z);
  return std::log1p(std::exp(z));
}
}  // namespace

void moe_route(const MoeRouteOp& op) {
  const int64_t E = op.logits.ne[0], n = op.logits.n_rows(), k = op.experts.ne[0];
  DSV4_ASSERT(k <= E, "moe_route: k > E");
  std::vector<float> s(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const float* z = op.logits.f32() + t * E;
    for (int64_t e = 0; e < E; ++e) s[static_cast<size_t>(e)] = std::sqrt(softplus(z[e]));
    int32_t* sel = op.experts.i32() + t * k;
    if (op.hash) {
      const int32_t id = op.ids.i32()[t];
      DSV4_ASSERT(id >= 0 && id < op.hash.n_rows(), "moe_route: token id %d outside the hash table", id);
      const int32_t* row = op.hash.i32() + static_cast<int64_t>(id) * op.hash.ne[0];
      for (int64_t i = 0; i < k; ++i) sel[i] = row[i];
    } else {
      for (int64_t e = 0; e < E; ++e) biased[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + (op.bias ? op.bias.f32()[e] : 0.0f);
      std::iota(order.begin(), order.end(), 0);
      // Highest biased score first; ties to the lower expert index.
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return biased[static_cast<size_t>(a)] > biased[static_cast<size_t>(b)] ||
               (biased[static_cast<size_t>(a)] == biased[static_cast<size_t>(b)] && a < b);
      });
      for (int64_t i = 0; i < k; ++i) sel[i] = order[static_cast<size_t>(i)];
    }
    // Weights from the unbiased scores, normalised over the selection, times alpha.
    float sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += s[static_cast<size_t>(sel[i])];
    float* w = op.weights.f32() + t * k;
    for (int64_t i = 0; i < k; ++i) {
      float v = s[static_cast<size_t>(sel[i])];
      w[i] = (op.normalize ? v / std::max(sum, 1e-30f) : v) * op.alpha;
    }
  }
}

void moe_experts(const MoeExpertsOp& op) {
  const int64_t D = op.x.ne[0], n = op.x.n_rows(), k = op.experts.ne[0];
  const int64_t F = op.gate.ne[1], E = op.gate.ne[2];
  DSV4_ASSERT(op.gate.ne[0] == D && op.up.ne[0] == D && op.down.ne[0] == F && op.down.ne[1] == D, "moe_experts: shapes");
  const float c = op.clamp;
  // Each (token, slot) assignment is computed independently into its own row,
  // then summed per token in slot order: results do not depend on batching.
  std::vector<float> ys(static_cast<size_t>(n * k * D));
  pool().parallel_for(static_cast<size_t>(n * k), [&](size_t b, size_t e) {
    std::vector<float> wr(static_cast<size_t>(std::max(D, F))), mid(static_cast<size_t>(F));
    for (size_t a = b; a < e; ++a) {
      const int64_t t = static_cast<int64_t>(a) / k, i = static_cast<int64_t>(a) % k;
      const int32_t ex = op.experts.i32()[t * k + i];
      DSV4_ASSERT(ex >= 0 && ex < E, "moe_experts: expert %d out of range", ex);
      const float rw = op.weights.f32()[t * k + i];
      const float* x = op.x.f32() + t * D;
      for (int64_t f = 0; f < F; ++f) {
        weight_row(op.gate, ex * F + f, wr.data());
        float gt = std::min(dot(wr.data(), x, D), c);
        weight_row(op.up, ex * F + f, wr.data());
        float up = std::clamp(dot(wr.data(), x, D), -c, c);
        mid[static_cast<size_t>(f)] = gt * sigmoid(gt) * up * rw;  // routing weight before the down projection
      }
      float* y = ys.data() + a * D;
      for (int64_t r = 0; r < D; ++r) {
        weight_row(op.down, ex * D + r, wr.data());
        y[r] = dot(wr.data(), mid.data(), F);
      }
    }
  });
  for (int64_t t = 0; t < n; ++t) {
    float* out = op.out.f32() + t * D;
    for (int64_t d = 0; d < D; ++d) {
      float s = op.accumulate ? out[d] : 0.0f;
      for (int64_t i = 0; i < k; ++i) s += ys[static_cast<size_t>((t * k + i) * D + d)];
      out[d] = s;
    }
  }
}

}  // namespace dsv4::cpu
