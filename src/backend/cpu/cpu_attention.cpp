// CPU reference: KV compressor, lightning-indexer scores and top-k selection,
// and the mixed window + compressed attention with sinks (model-spec.md §5.5–§5.7).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/float_conv.h"
#include "core/thread_pool.h"

namespace dsv4::cpu {

namespace {
constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();
}

void compress(const CompressOp& op) {
  const int m = op.ratio;
  const int64_t d = op.norm_w.ne[0];  // output row width
  const int64_t w = op.kv.ne[0];      // projected width (c * d)
  const int64_t n = op.kv.n_rows();
  const int64_t R = op.state_a.n_rows();
  DSV4_ASSERT(w == (op.overlap ? 2 : 1) * d, "compress: width %lld for row width %lld", static_cast<long long>(w),
              static_cast<long long>(d));
  DSV4_ASSERT(R == (op.overlap ? 2 * m : m) && op.state_a.ne[0] == w, "compress: frontier shape");
  DSV4_ASSERT(op.ape.ne[0] == w && op.ape.n_rows() == m, "compress: APE shape");
  const int32_t* pos = op.pos.i32();
  float* sa = op.state_a.f32();
  float* sg = op.state_g.f32();

  // APE rows as f32.
  std::vector<float> ape(static_cast<size_t>(m * w));
  for (int r = 0; r < m; ++r) weight_row(op.ape, r, ape.data() + r * w);

  // Which tokens complete a window (row k emitted before that token's attention);
  // their raw pooled rows go to `pooled` [emitted, d] in emission order.
  std::vector<int64_t> emit_tokens, emit_index(static_cast<size_t>(n), -1);
  for (int64_t t = 0; t < n; ++t)
    if ((pos[t] + 1) % m == 0) {
      const int64_t k = pos[t] / m;
      DSV4_ASSERT(k < op.rows.n_rows(), "compress: row %lld beyond capacity %lld", static_cast<long long>(k),
                  static_cast<long long>(op.rows.n_rows()));
      emit_index[static_cast<size_t>(t)] = static_cast<int64_t>(emit_tokens.size());
      emit_tokens.push_back(t);
    }
  std::vector<float> pooled(emit_tokens.size() * static_cast<size_t>(d));

  // Pass 1, parallel over output channels c in [0, d): walk the tokens in order,
  // updating the frontier columns this channel owns (c, and c + d with overlap)
  // and writing the raw pooled value of every completed window.
  const int64_t prev = op.overlap ? m : 0;  // first row of the "current" window
  pool().parallel_for(
      static_cast<size_t>(d),
      [&](size_t cb, size_t ce) {
        for (size_t cc = cb; cc < ce; ++cc) {
          const int64_t c = static_cast<int64_t>(cc);
          for (int64_t t = 0; t < n; ++t) {
            const int32_t p = pos[t];
            const int64_t slot = prev + p % m;
            const float* a = op.kv.f32() + t * w;
            const float* g = op.gate.f32() + t * w;
            const float* ap = ape.data() + (p % m) * w;
            sa[slot * w + c] = a[c];
            sg[slot * w + c] = g[c] + ap[c];
            if (op.overlap) {
              sa[slot * w + c + d] = a[c + d];
              sg[slot * w + c + d] = g[c + d] + ap[c + d];
            }
            if ((p + 1) % m != 0) continue;
            // Candidates: overlap -> lane A (column c) of rows 0..m-1 and lane B (column c+d) of rows m..2m-1;
            // otherwise column c of rows 0..m-1.
            float mx = k_neg_inf;
            auto cand = [&](int64_t r, float* av, float* gv) {
              int64_t col = op.overlap && r >= m ? c + d : c;
              *av = sa[r * w + col];
              *gv = sg[r * w + col];
            };
            for (int64_t r = 0; r < R; ++r) {
              float av, gv;
              cand(r, &av, &gv);
              mx = std::max(mx, gv);
            }
            double num = 0, den = 0;
            for (int64_t r = 0; r < R; ++r) {
              float av, gv;
              cand(r, &av, &gv);
              if (gv == k_neg_inf) continue;
              double e = std::exp(static_cast<double>(gv - mx));
              den += e;
              num += e * av;
            }
            pooled[static_cast<size_t>(emit_index[static_cast<size_t>(t)] * d + c)] = static_cast<float>(num / den);
            // Reset / shift the frontier columns of this channel.
            if (op.overlap) {
              for (int64_t r = 0; r < m; ++r) {
                for (int64_t col : {c, c + d}) {
                  sa[r * w + col] = sa[(r + m) * w + col];
                  sg[r * w + col] = sg[(r + m) * w + col];
                  sa[(r + m) * w + col] = 0.0f;
                  sg[(r + m) * w + col] = k_neg_inf;
                }
              }
            } else {
              for (int64_t r = 0; r < m; ++r) {
                sa[r * w + c] = 0.0f;
                sg[r * w + c] = k_neg_inf;
              }
            }
          }
        }
      },
      8);

  // Pass 2: post-process every emitted row: (bf16) -> RMSNorm -> RoPE at k*m -> sim,
  // then store it as row k in the rows' format.
  std::vector<float> omega(static_cast<size_t>(op.rope.n_rot / 2));
  rope_frequencies(op.rope, omega.data());
  const float* nw = op.norm_w.f32();
  for (size_t e = 0; e < emit_tokens.size(); ++e) {
    const int64_t k = pos[emit_tokens[e]] / m;
    float* row = pooled.data() + e * static_cast<size_t>(d);
    if (op.round_pooled_bf16)
      for (int64_t i = 0; i < d; ++i) row[i] = bf16_round(row[i]);
    rms_norm_row(row, row, nw, d, op.eps);
    rope_row(row, d, op.rope.n_rot, omega.data(), static_cast<int32_t>(k * m), false);
    quant_sim_row(row, d, op.sim, op.n_quant);
    kv_row_store(op.rows, k, row);
  }
}

void indexer_scores(const IndexerScoresOp& op) {
  const int64_t dI = op.q.ne[0], HI = op.q.ne[1], n = op.q.ne[2];
  const int64_t cap = op.rows.n_rows();
  DSV4_ASSERT(op.scores.ne[0] == cap && op.scores.n_rows() == n, "indexer_scores: shape");
  const int32_t* pos = op.pos.i32();
  int64_t max_visible = 0;
  for (int64_t t = 0; t < n; ++t)
    max_visible = std::max<int64_t>(max_visible, std::min<int64_t>((pos[t] + 1) / op.ratio, cap));
  const KvRowView rows(op.rows, max_visible);
  pool().parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e) {
    for (size_t tt = b; tt < e; ++tt) {
      const int64_t t = static_cast<int64_t>(tt);
      const int64_t visible = std::min<int64_t>((pos[t] + 1) / op.ratio, cap);
      float* s = op.scores.f32() + t * cap;
      const float* q = op.q.f32() + t * HI * dI;
      const float* wt = op.w.f32() + t * HI;
      for (int64_t k = 0; k < cap; ++k) {
        if (k >= visible) {
          s[k] = k_neg_inf;
          continue;
        }
        const float* row = rows.row(k);
        float acc = 0;
        int64_t h = 0;
        for (; h + 4 <= HI; h += 4) {  // four heads' dots at a time (each bitwise its dot), added in head order
          const float* q4[4] = {q + h * dI, q + (h + 1) * dI, q + (h + 2) * dI, q + (h + 3) * dI};
          float v[4];
          dot4(row, q4, dI, v);
          for (int j = 0; j < 4; ++j) acc += wt[h + j] * std::max(0.0f, v[j]);
        }
        for (; h < HI; ++h) acc += wt[h] * std::max(0.0f, dot(q + h * dI, row, dI));
        s[k] = acc;
      }
    }
  });
}

void topk(const TopKOp& op) {
  const int64_t K = op.sel.ne[0], n = op.sel.n_rows(), cap = op.scores.ne[0];
  const int32_t* pos = op.pos.i32();
  pool().parallel_for(static_cast<size_t>(n), [&](size_t b, size_t e) {
    std::vector<int32_t> idx;
    for (size_t tt = b; tt < e; ++tt) {
      const int64_t t = static_cast<int64_t>(tt);
      const int64_t visible = std::min<int64_t>((pos[t] + 1) / op.ratio, cap);
      int32_t* sel = op.sel.i32() + t * K;
      const float* s = op.scores.f32() + t * cap;
      idx.resize(static_cast<size_t>(visible));
      std::iota(idx.begin(), idx.end(), 0);
      if (visible > K) {
        // Largest scores first, ties to the lower index; then keep ascending index order.
        std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                          [&](int32_t x, int32_t y) { return s[x] > s[y] || (s[x] == s[y] && x < y); });
        idx.resize(static_cast<size_t>(K));
        std::sort(idx.begin(), idx.end());
      }
      for (int64_t i = 0; i < K; ++i) sel[i] = i < static_cast<int64_t>(idx.size()) ? idx[static_cast<size_t>(i)] : -1;
    }
  });
}

void attention(const AttentionOp& op) {
  const int64_t d = op.q.ne[0], H = op.q.ne[1], n = op.q.ne[2];
  const int64_t cap_w = op.ring.n_rows();
  const int32_t* pos = op.pos.i32();
  const float* sinks = op.sinks.f32();
  const int64_t n_sel = op.sel ? op.sel.ne[0] : 0;
  DSV4_ASSERT(cap_w >= op.window, "attention: ring smaller than the window");
  // Unpack (compact formats) the rows the batch reads: the ring's rows of positions [min pos - window + 1,
  // max pos] (all of the ring when they wrap around it; a decode step reads window rows of the window + batch
  // the ring holds), and the selected or all visible compressed rows.
  int64_t max_visible = 0;
  if (op.ratio > 0 && op.comp)
    for (int64_t t = 0; t < n; ++t)
      max_visible = std::max<int64_t>(max_visible, std::min<int64_t>((pos[t] + 1) / op.ratio, op.comp.n_rows()));
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = -1;
  for (int64_t t = 0; t < n; ++t) {
    lo = std::min<int64_t>(lo, std::max<int64_t>(0, pos[t] - op.window + 1));
    hi = std::max<int64_t>(hi, pos[t]);
  }
  std::vector<int32_t> ring_rows;  // empty: every row (the positions wrap around the ring)
  if (hi - lo + 1 < cap_w)
    for (int64_t s = lo; s <= hi; ++s) ring_rows.push_back(static_cast<int32_t>(s % cap_w));
  const KvRowView ring(op.ring, ring_rows.empty() ? cap_w : 0, ring_rows.data(),
                       static_cast<int64_t>(ring_rows.size()));
  const KvRowView comp(op.comp, op.sel ? 0 : max_visible, op.sel ? op.sel.i32() : nullptr, op.sel ? n * n_sel : 0);
  pool().parallel_for(static_cast<size_t>(n * H), [&](size_t b, size_t e) {
    std::vector<const float*> keys;
    std::vector<float> logit;
    for (size_t th = b; th < e; ++th) {
      const int64_t t = static_cast<int64_t>(th) / H, h = static_cast<int64_t>(th) % H;
      const int64_t p = pos[t];
      keys.clear();
      for (int64_t s = std::max<int64_t>(0, p - op.window + 1); s <= p; ++s) keys.push_back(ring.row(s % cap_w));
      if (op.ratio > 0 && op.comp) {
        const int64_t visible = std::min<int64_t>((p + 1) / op.ratio, op.comp.n_rows());
        if (op.sel) {
          const int32_t* sel = op.sel.i32() + t * n_sel;
          for (int64_t i = 0; i < n_sel; ++i)
            if (sel[i] >= 0 && sel[i] < visible) keys.push_back(comp.row(sel[i]));
        } else {
          for (int64_t k = 0; k < visible; ++k) keys.push_back(comp.row(k));
        }
      }
      const float* q = op.q.f32() + (t * H + h) * d;
      logit.resize(keys.size());
      float mx = -std::numeric_limits<float>::infinity();
      size_t s4 = 0;
      for (; s4 + 4 <= keys.size(); s4 += 4) {  // four keys at a time: each bitwise its dot
        float v[4];
        dot4(q, keys.data() + s4, d, v);
        for (int j = 0; j < 4; ++j) logit[s4 + j] = v[j] * op.scale;
      }
      for (; s4 < keys.size(); ++s4) logit[s4] = dot(q, keys[s4], d) * op.scale;
      for (size_t s = 0; s < keys.size(); ++s) mx = std::max(mx, logit[s]);
      double den = std::exp(static_cast<double>(sinks[h]) - mx);
      std::vector<double> acc(static_cast<size_t>(d), 0.0);
      for (size_t s = 0; s < keys.size(); ++s) {
        double pr = std::exp(static_cast<double>(logit[s] - mx));
        den += pr;
        for (int64_t i = 0; i < d; ++i) acc[static_cast<size_t>(i)] += pr * keys[s][i];
      }
      float* out = op.out.f32() + (t * H + h) * d;
      for (int64_t i = 0; i < d; ++i) out[i] = static_cast<float>(acc[static_cast<size_t>(i)] / den);
    }
  });
}

}  // namespace dsv4::cpu
