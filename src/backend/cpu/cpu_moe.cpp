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
      for (int64_t e = 0; e < E; ++e)
        biased[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + (op.bias ? op.bias.f32()[e] : 0.0f);
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
  const bool placed = static_cast<bool>(op.slots);  // experts partly in the host stacks (MoeExpertsOp::slots)
  const Tensor& gate = placed ? op.gate_host : op.gate;
  const int64_t F = gate.ne[1], E = gate.ne[2];
  DSV4_ASSERT(gate.ne[0] == D && (placed ? op.up_host : op.up).ne[0] == D &&
                  (placed ? op.down_host : op.down).ne[0] == F && (placed ? op.down_host : op.down).ne[1] == D,
              "moe_experts: shapes");
  DSV4_ASSERT(!placed || (op.slots.ne[0] == E && op.up_host.ne[2] == E && op.down_host.ne[2] == E),
              "moe_experts: slots for %lld experts", static_cast<long long>(E));
  // Row r of expert ex's matrix (rows_per rows per expert): from the resident stack at its slot, or the host stack.
  auto expert_row = [&](const Tensor& dev, const Tensor& host, int32_t ex, int64_t rows_per, int64_t r, float* dst) {
    const int32_t slot = placed ? op.slots.i32()[ex] : ex;
    if (slot >= 0)
      weight_row(dev, slot * rows_per + r, dst);
    else
      weight_row(host, ex * rows_per + r, dst);
  };
  const float c = op.clamp;
  // Each (token, slot) assignment a = t*k + i gets its own rows mid[a] [F] and
  // ys[a] [D], summed per token in slot order at the end: results do not
  // depend on batching. The work is grouped by expert so that each expert
  // weight row is dequantised once per batch and dotted with every assignment
  // routed to it (a prefill batch of 512 tokens gives an expert ~12); every
  // output element is the same dot of the same dequantised row as one
  // assignment at a time would compute.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(E));
  for (int64_t a = 0; a < n * k; ++a) {
    const int32_t ex = op.experts.i32()[a];
    DSV4_ASSERT(ex >= 0 && ex < E, "moe_experts: expert %d out of range", ex);
    by_expert[static_cast<size_t>(ex)].push_back(a);
  }
  std::vector<int32_t> active;  // experts with at least one assignment
  for (int64_t e = 0; e < E; ++e)
    if (!by_expert[static_cast<size_t>(e)].empty()) active.push_back(static_cast<int32_t>(e));
  const auto n_active = static_cast<int64_t>(active.size());
  std::vector<float> mid(static_cast<size_t>(n * k * F)), ys(static_cast<size_t>(n * k * D));
  // Gate and up rows f of every active expert: mid[a, f] = silu(min(g, c)) * clamp(u, -c, c) * w_a.
  pool().parallel_for(
      static_cast<size_t>(n_active * F),
      [&](size_t b, size_t e) {
        // Rows f and f + 1 of one expert together where the range holds both: dot4 over gate f, up f, gate f + 1,
        // up f + 1 (each bitwise its dot).
        std::vector<float> w(static_cast<size_t>(4 * D));
        const float* w4[4] = {w.data(), w.data() + D, w.data() + 2 * D, w.data() + 3 * D};
        auto set = [&](int64_t a, int64_t f, float g, float u) {
          const float gt = std::min(g, c);
          const float up = std::clamp(u, -c, c);
          mid[static_cast<size_t>(a * F + f)] = gt * sigmoid(gt) * up * op.weights.f32()[a];  // weight before down
        };
        for (size_t item = b; item < e;) {
          const int32_t ex = active[item / static_cast<size_t>(F)];
          const int64_t f = static_cast<int64_t>(item % static_cast<size_t>(F));
          const bool two = item + 1 < e && f + 1 < F;
          expert_row(op.gate, op.gate_host, ex, F, f, w.data());
          expert_row(op.up, op.up_host, ex, F, f, w.data() + D);
          if (two) {
            expert_row(op.gate, op.gate_host, ex, F, f + 1, w.data() + 2 * D);
            expert_row(op.up, op.up_host, ex, F, f + 1, w.data() + 3 * D);
          }
          for (int64_t a : by_expert[static_cast<size_t>(ex)]) {
            const float* x = op.x.f32() + (a / k) * D;
            if (two) {
              float v[4];
              dot4(x, w4, D, v);
              set(a, f, v[0], v[1]);
              set(a, f + 1, v[2], v[3]);
            } else {
              set(a, f, dot(w4[0], x, D), dot(w4[1], x, D));
            }
          }
          item += two ? 2 : 1;
        }
      },
      16);
  if (op.mid_quant != ActQuant::NONE)
    pool().parallel_for(static_cast<size_t>(n * k), [&](size_t b, size_t e) {
      for (size_t a = b; a < e; ++a) act_quant_row(mid.data() + a * static_cast<size_t>(F), F, op.mid_quant);
    });
  // Down rows r: ys[a, r] = W_down[e_a, r, :] . mid[a].
  pool().parallel_for(
      static_cast<size_t>(n_active * D),
      [&](size_t b, size_t e) {
        // Four rows of one expert together where the range holds them (dot4, each bitwise its dot).
        std::vector<float> w(static_cast<size_t>(4 * F));
        const float* w4[4] = {w.data(), w.data() + F, w.data() + 2 * F, w.data() + 3 * F};
        for (size_t item = b; item < e;) {
          const int32_t ex = active[item / static_cast<size_t>(D)];
          const int64_t r = static_cast<int64_t>(item % static_cast<size_t>(D));
          const bool four = item + 4 <= e && r + 4 <= D;
          for (int j = 0; j < (four ? 4 : 1); ++j) expert_row(op.down, op.down_host, ex, D, r + j, w.data() + j * F);
          for (int64_t a : by_expert[static_cast<size_t>(ex)]) {
            const float* m = mid.data() + a * F;
            if (four) {
              float v[4];
              dot4(m, w4, F, v);
              for (int j = 0; j < 4; ++j) ys[static_cast<size_t>(a * D + r + j)] = v[j];
            } else {
              ys[static_cast<size_t>(a * D + r)] = dot(w4[0], m, F);
            }
          }
          item += four ? 4 : 1;
        }
      },
      16);
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
