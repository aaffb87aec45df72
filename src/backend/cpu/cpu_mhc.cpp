// CPU reference: embedding + mHC expansion, hc_pre (with Sinkhorn), hc_post,
// hc_head (model-spec.md §4). One token per task; all reductions in a fixed order.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/float_conv.h"
#include "core/thread_pool.h"

namespace dsv4::cpu {

void embed(const EmbedOp& op) {
  const int64_t n = op.ids.ne[0], hc = op.out.ne[1], D = op.out.ne[0];
  DSV4_ASSERT(op.table.ne[0] == D, "embed: width mismatch");
  const int32_t* ids = op.ids.i32();
  pool().parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e) {
    for (size_t t = b; t < e; ++t) {
      DSV4_ASSERT(ids[t] >= 0 && ids[t] < op.table.ne[1], "embed: token id %d out of range", ids[t]);
      float* out = op.out.f32() + static_cast<int64_t>(t) * hc * D;
      weight_row(op.table, ids[t], out);
      for (int64_t s = 1; s < hc; ++s) std::copy(out, out + D, out + s * D);
    }
  });
}

namespace {

// rho * (fn · x̄) for all mix rows; x̄ is the flattened [hc*D] state of one token.
void hc_mix(const Tensor& fn, const float* xbar, int64_t len, float norm_eps, float* mix, int64_t n_mix,
            float* rowbuf) {
  double ss = 0;
  for (int64_t i = 0; i < len; ++i) ss += static_cast<double>(xbar[i]) * xbar[i];
  const float rho = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(len) + norm_eps));
  for (int64_t m = 0; m < n_mix; ++m) {
    weight_row(fn, m, rowbuf);
    mix[m] = rho * dot(rowbuf, xbar, len);
  }
}

// Sinkhorn projection of a hc x hc matrix (model-spec.md §4.2 step 4), in place.
void sinkhorn(float* c, int hc, float eps, int iters) {
  for (int i = 0; i < hc; ++i) {  // row softmax, then + eps
    float* row = c + i * hc;
    float mx = row[0];
    for (int j = 1; j < hc; ++j) mx = std::max(mx, row[j]);
    float sum = 0;
    for (int j = 0; j < hc; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
  }
  auto col_norm = [&] {
    for (int j = 0; j < hc; ++j) {
      float s = 0;
      for (int i = 0; i < hc; ++i) s += c[i * hc + j];
      for (int i = 0; i < hc; ++i) c[i * hc + j] /= (s + eps);
    }
  };
  auto row_norm = [&] {
    for (int i = 0; i < hc; ++i) {
      float s = 0;
      for (int j = 0; j < hc; ++j) s += c[i * hc + j];
      for (int j = 0; j < hc; ++j) c[i * hc + j] /= (s + eps);
    }
  };
  col_norm();
  for (int it = 1; it < iters; ++it) {
    row_norm();
    col_norm();
  }
}

}  // namespace

void hc_pre(const HcPreOp& op) {
  const int64_t D = op.state.ne[0], hc = op.state.ne[1], n = op.state.ne[2];
  const int64_t n_mix = (2 + hc) * hc;
  DSV4_ASSERT(op.fn.ne[0] == hc * D && op.fn.ne[1] == n_mix, "hc_pre: fn shape");
  const float* scale = op.scale.f32();
  const float* base = op.base.f32();
  pool().parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e) {
    std::vector<float> rowbuf(static_cast<size_t>(hc * D)), mix(static_cast<size_t>(n_mix));
    for (size_t t = b; t < e; ++t) {
      const float* X = op.state.f32() + static_cast<int64_t>(t) * hc * D;
      hc_mix(op.fn, X, hc * D, op.norm_eps, mix.data(), n_mix, rowbuf.data());
      float* post = op.post.f32() + static_cast<int64_t>(t) * hc;
      float* comb = op.comb.f32() + static_cast<int64_t>(t) * hc * hc;
      std::vector<float> pre_v(static_cast<size_t>(hc));
      for (int64_t i = 0; i < hc; ++i) {
        pre_v[static_cast<size_t>(i)] = sigmoid(scale[0] * mix[static_cast<size_t>(i)] + base[i]) + op.hc_eps;
        post[i] = 2.0f * sigmoid(scale[1] * mix[static_cast<size_t>(hc + i)] + base[hc + i]);
      }
      for (int64_t k = 0; k < hc * hc; ++k)
        comb[k] = scale[2] * mix[static_cast<size_t>(2 * hc + k)] + base[2 * hc + k];
      sinkhorn(comb, static_cast<int>(hc), op.hc_eps, op.sinkhorn_iters);
      float* u = op.u.f32() + static_cast<int64_t>(t) * D;
      for (int64_t d = 0; d < D; ++d) {
        float s = 0;
        for (int64_t i = 0; i < hc; ++i) s += pre_v[static_cast<size_t>(i)] * X[i * D + d];
        u[d] = s;
      }
    }
  });
}

void hc_post(const HcPostOp& op) {
  const int64_t D = op.state.ne[0], hc = op.state.ne[1], n = op.state.ne[2];
  pool().parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e) {
    std::vector<float> nx(static_cast<size_t>(hc * D));
    for (size_t t = b; t < e; ++t) {
      float* X = op.state.f32() + static_cast<int64_t>(t) * hc * D;
      const float* y = op.y.f32() + static_cast<int64_t>(t) * D;
      const float* y2 = op.y2 ? op.y2.f32() + static_cast<int64_t>(t) * D : nullptr;
      const float* post = op.post.f32() + static_cast<int64_t>(t) * hc;
      const float* comb = op.comb.f32() + static_cast<int64_t>(t) * hc * hc;
      for (int64_t j = 0; j < hc; ++j) {
        for (int64_t d = 0; d < D; ++d) {
          const float yv = y2 ? y[d] + y2[d] : y[d];
          float s = post[j] * yv;
          for (int64_t i = 0; i < hc; ++i) s += comb[i * hc + j] * X[i * D + d];
          nx[static_cast<size_t>(j * D + d)] = op.round_bf16 ? bf16_round(s) : s;
        }
      }
      std::copy(nx.begin(), nx.end(), X);
    }
  });
}

void hc_head(const HcHeadOp& op) {
  const int64_t D = op.state.ne[0], hc = op.state.ne[1], n = op.state.ne[2];
  DSV4_ASSERT(op.fn.ne[0] == hc * D && op.fn.ne[1] == hc, "hc_head: fn shape");
  const float s = op.scale.f32()[0];
  const float* base = op.base.f32();
  pool().parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e) {
    std::vector<float> rowbuf(static_cast<size_t>(hc * D)), mix(static_cast<size_t>(hc));
    for (size_t t = b; t < e; ++t) {
      const float* X = op.state.f32() + static_cast<int64_t>(t) * hc * D;
      hc_mix(op.fn, X, hc * D, op.norm_eps, mix.data(), hc, rowbuf.data());
      for (int64_t i = 0; i < hc; ++i)
        mix[static_cast<size_t>(i)] = sigmoid(s * mix[static_cast<size_t>(i)] + base[i]) + op.hc_eps;
      float* h = op.h.f32() + static_cast<int64_t>(t) * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0;
        for (int64_t i = 0; i < hc; ++i) acc += mix[static_cast<size_t>(i)] * X[i * D + d];
        h[d] = acc;
      }
    }
  });
}

}  // namespace dsv4::cpu
