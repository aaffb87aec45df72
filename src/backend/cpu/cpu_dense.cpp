// CPU reference: RMSNorm, matmul (dequantise each weight row once, then f32
// dots), RoPE, quantisation simulations, SwiGLU, ring stores.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/float_conv.h"
#include "core/thread_pool.h"

namespace dsv4::cpu {

void rms_norm_row(float* out, const float* x, const float* w, int64_t d, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float r = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
  for (int64_t i = 0; i < d; ++i) out[i] = w ? x[i] * r * w[i] : x[i] * r;
}

void rms_norm(const RmsNormOp& op) {
  const int64_t d = op.x.ne[0], rows = op.x.n_rows();
  DSV4_ASSERT(op.out.ne[0] == d && op.out.n_rows() == rows, "rms_norm: shape mismatch");
  DSV4_ASSERT(!op.w || op.w.ne[0] == d, "rms_norm: weight length %lld != %lld", static_cast<long long>(op.w.ne[0]),
              static_cast<long long>(d));
  const float* w = op.w ? op.w.f32() : nullptr;
  pool().parallel_for(
      static_cast<size_t>(rows),
      [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) rms_norm_row(op.out.f32() + r * d, op.x.f32() + r * d, w, d, op.eps);
      },
      16);
  if (op.rope_pos) {
    const int64_t per_tok = op.rope_rows_per_token;
    DSV4_ASSERT(per_tok >= 1 && rows % per_tok == 0, "rms_norm: %lld rows are not whole tokens of %lld",
                static_cast<long long>(rows), static_cast<long long>(per_tok));
    rope({op.out.reshape(d, per_tok, rows / per_tok), op.rope_pos, op.rope, false});
  }
  if (op.quant != ActQuant::NONE) act_quant({op.q ? op.q : op.out, op.out, op.quant});
}

void matmul(const MatmulOp& op) {
  if (op.x_quantise != ActQuant::NONE) act_quant({op.x, op.x, op.x_quantise});  // in place (MatmulOp::x_quantise)
  const int64_t cols = op.w.ne[0], rows = op.w.n_rows();
  const int64_t n = op.x.n_rows();
  const int groups = op.groups;
  DSV4_ASSERT(op.x.ne[0] == cols * groups, "matmul: input width %lld != %lld x %d", static_cast<long long>(op.x.ne[0]),
              static_cast<long long>(cols), groups);
  DSV4_ASSERT(op.out.ne[0] == rows && op.out.n_rows() == n, "matmul: output shape");
  DSV4_ASSERT(rows % groups == 0, "matmul: rows not divisible by groups");
  const int64_t rows_per_group = rows / groups;
  const float* x = op.x.f32();
  float* out = op.out.f32();
  auto store = [&](int64_t t, int64_t r, float v) {
    float& o = out[t * rows + r];
    o = op.accumulate ? o + v : v;
  };
  auto x_of = [&](int64_t t, int64_t r) { return x + t * cols * groups + (r / rows_per_group) * cols; };
  // Every output is dot(row, x) in dot's order; dot4 computes four of them together: four tokens against one row
  // (batches of 4+), or four rows of one group against one token (the rows dequantised first).
  pool().parallel_for(static_cast<size_t>(rows), [&](size_t b, size_t e) {
    std::vector<float> wr(static_cast<size_t>(4 * cols));
    for (auto r = static_cast<int64_t>(b); r < static_cast<int64_t>(e);) {
      if (n < 4 && r + 4 <= static_cast<int64_t>(e) && r / rows_per_group == (r + 3) / rows_per_group) {
        const float* w4[4];
        for (int j = 0; j < 4; ++j) {
          weight_row(op.w, r + j, wr.data() + j * cols);
          w4[j] = wr.data() + j * cols;
        }
        for (int64_t t = 0; t < n; ++t) {
          float v[4];
          dot4(x_of(t, r), w4, cols, v);
          for (int j = 0; j < 4; ++j) store(t, r + j, v[j]);
        }
        r += 4;
        continue;
      }
      weight_row(op.w, r, wr.data());
      int64_t t = 0;
      for (; t + 4 <= n; t += 4) {
        const float* x4[4] = {x_of(t, r), x_of(t + 1, r), x_of(t + 2, r), x_of(t + 3, r)};
        float v[4];
        dot4(wr.data(), x4, cols, v);
        for (int j = 0; j < 4; ++j) store(t + j, r, v[j]);
      }
      for (; t < n; ++t) store(t, r, dot(wr.data(), x_of(t, r), cols));
      ++r;
    }
  });
}

void rope_row(float* x, int64_t d, int n_rot, const float* omega, int32_t pos, bool inverse) {
  float* tail = x + (d - n_rot);
  for (int j = 0; j < n_rot / 2; ++j) {
    float ang = static_cast<float>(pos) * omega[j];
    float c = std::cos(ang), s = std::sin(ang);
    if (inverse) s = -s;
    float a = tail[2 * j], b = tail[2 * j + 1];
    tail[2 * j] = a * c - b * s;
    tail[2 * j + 1] = a * s + b * c;
  }
}

void rope(const RopeOp& op) {
  const int64_t d = op.x.ne[0], per_tok = op.x.ne[1], n = op.x.ne[2] * op.x.ne[3];
  DSV4_ASSERT(op.pos.ne[0] == n, "rope: %lld positions for %lld tokens", static_cast<long long>(op.pos.ne[0]),
              static_cast<long long>(n));
  DSV4_ASSERT(op.rope.n_rot <= d && op.rope.n_rot % 2 == 0, "rope: bad n_rot");
  std::vector<float> omega(static_cast<size_t>(op.rope.n_rot / 2));
  rope_frequencies(op.rope, omega.data());
  const int32_t* pos = op.pos.i32();
  pool().parallel_for(
      static_cast<size_t>(n * per_tok),
      [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r)
          rope_row(op.x.f32() + r * d, d, op.rope.n_rot, omega.data(), pos[static_cast<int64_t>(r) / per_tok],
                   op.inverse);
      },
      16);
}

namespace {

// In-place orthonormal Hadamard transform of a power-of-two-length vector:
// butterflies with strides 1, 2, 4, ... then a 1/sqrt(d) scale.
void hadamard(float* v, int64_t d) {
  for (int64_t h = 1; h < d; h *= 2)
    for (int64_t i = 0; i < d; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  const float s = 1.0f / std::sqrt(static_cast<float>(d));
  for (int64_t i = 0; i < d; ++i) v[i] *= s;
}

}  // namespace

void quant_sim_row(float* x, int64_t d, KvQuantSim sim, int n_quant) {
  switch (sim) {
    case KvQuantSim::NONE: return;
    case KvQuantSim::FP8_BF16:
      // Blocks of 64: amax = max(|v|, 1e-4), scale = 2^ceil(log2(amax/448)), v = e4m3(v/scale) * scale.
      for (int64_t b0 = 0; b0 < n_quant; b0 += 64) fp8_block_round(x + b0, std::min<int64_t>(64, n_quant - b0));
      for (int64_t i = 0; i < d; ++i) x[i] = bf16_round(x[i]);
      return;
    case KvQuantSim::HADAMARD_FP4:
      hadamard(x, d);
      // Blocks of 32: amax = max(|v|, 6 * 2^-126), scale = 2^ceil(log2(amax/6)), v = e2m1(v/scale) * scale.
      for (int64_t b0 = 0; b0 < d; b0 += 32) {
        int64_t b1 = std::min<int64_t>(b0 + 32, d);
        float amax = 6.0f * 0x1p-126f;
        for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
        float scale = pow2_ceil(amax / k_fp4_e2m1_max);
        for (int64_t i = b0; i < b1; ++i)
          x[i] = bf16_round(fp4_e2m1_round(std::clamp(x[i] / scale, -k_fp4_e2m1_max, k_fp4_e2m1_max)) * scale);
      }
      return;
  }
}

void quant_sim(const QuantSimOp& op) {
  if (op.sim == KvQuantSim::NONE) return;
  const int64_t d = op.x.ne[0], rows = op.x.n_rows();
  DSV4_ASSERT(op.sim != KvQuantSim::HADAMARD_FP4 || (d & (d - 1)) == 0, "Hadamard needs a power-of-two width");
  pool().parallel_for(
      static_cast<size_t>(rows),
      [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) quant_sim_row(op.x.f32() + r * d, d, op.sim, op.n_quant);
      },
      16);
}

void act_quant(const ActQuantOp& op) {
  const int64_t d = op.x.ne[0], rows = op.x.n_rows();
  DSV4_ASSERT(op.out.ne[0] == d && op.out.n_rows() == rows, "act_quant: shapes");
  pool().parallel_for(
      static_cast<size_t>(rows),
      [&](size_t b, size_t e) {
        for (size_t r = b; r < e; ++r) {
          float* o = op.out.f32() + r * d;
          if (o != op.x.f32() + r * d) std::copy_n(op.x.f32() + r * d, d, o);
          act_quant_row(o, d, op.quant);
        }
      },
      16);
}

void swiglu(const SwigluOp& op) {
  const int64_t n = op.out.n_elements();
  const float c = op.clamp;
  const float* g = op.gate.f32();
  const float* u = op.up.f32();
  float* o = op.out.f32();
  for (int64_t i = 0; i < n; ++i) {
    float gt = std::min(g[i], c);
    float up = std::clamp(u[i], -c, c);
    o[i] = gt * sigmoid(gt) * up;
  }
  if (op.quant != ActQuant::NONE) act_quant({op.out, op.out, op.quant});
}

void store_rows(const StoreRowsOp& op) {
  const int64_t d = op.rows.ne[0], n = op.rows.n_rows(), cap = op.ring.n_rows();
  DSV4_ASSERT(op.ring.ne[0] == d, "store_rows: width mismatch");
  const int32_t* pos = op.pos.i32();
  for (int64_t t = 0; t < n; ++t) kv_row_store(op.ring, pos[t] % cap, op.rows.f32() + t * d);
}

}  // namespace dsv4::cpu
