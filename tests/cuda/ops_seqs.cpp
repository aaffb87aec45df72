// Op harness cases: the per-sequence ops of several sequences in one call
// (Backend::*_seqs: store_rows, compress, indexer_scores, topk, attention), as
// Model::step issues them for a batched decode step. Each sequence has its own
// state (ring, compressed rows, frontier, indexer rows) of its own capacity;
// the per-token tensors are consecutive rows. The CUDA backend launches the
// single-token sequences together (cuda_seqs.cuh); it is held to the CPU's
// one call per sequence with the single-op thresholds, and to its own one
// call per sequence bitwise (the arithmetic per token is the same).
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops_harness.h"

namespace dsv4::cudatest {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

// Tokens [r0, r0 + n) of a per-token tensor: [T, w] -> [n, w], [T, H, d] -> [n, H, d].
Tensor token_rows(const Tensor& t, int64_t r0, int64_t n) {
  Tensor v = t;
  const bool heads = t.ne[2] > 1;
  v.data = static_cast<uint8_t*>(t.data) + static_cast<size_t>(r0 * (heads ? t.ne[1] : 1)) * t.row_bytes();
  (heads ? v.ne[2] : v.ne[1]) = n;
  return v;
}
// Positions [i0, i0 + n) of an [T] i32 tensor.
Tensor elems_of(const Tensor& t, int64_t i0, int64_t n) {
  return make_tensor(static_cast<int32_t*>(t.data) + i0, t.type, n);
}

// Of two comparisons, the one that fails first: differing bits, non-finite mismatches, then the larger NMSE.
Diff worst(const Diff& a, const Diff& b) {
  Diff d = a.nmse >= b.nmse ? a : b;
  d.max_abs = std::max(a.max_abs, b.max_abs);
  d.n = a.n + b.n;
  d.n_diff = a.n_diff + b.n_diff;
  d.bad_nonfinite = a.bad_nonfinite + b.bad_nonfinite;
  return d;
}

struct Seq {
  int64_t n;    // tokens this step
  int32_t p0;   // first position
  int64_t cap;  // compressed rows (ratio 4) and indexer rows
};

}  // namespace

void cases_seqs(Harness& h) {
  if (!h.want("seqs")) return;
  Rng& r = h.rng;
  struct C {
    std::vector<Seq> seqs;
    int64_t H, d, dI, HI, K, cap_w;
    bool flash;
    const char* what;
  };
  auto many = [&](int count, int32_t max_pos) {
    std::vector<Seq> v;
    for (int i = 0; i < count; ++i) {
      const int32_t p = static_cast<int32_t>(r.below(max_pos));
      v.push_back({1, p, (max_pos + 1) / 4 + static_cast<int64_t>(r.below(64))});
    }
    return v;
  };
  const std::vector<C> cases = {
      {{{1, 0, 200}, {1, 3, 180}, {3, 128, 190}, {1, 699, 176}, {1, 255, 300}},
       4,
       128,
       128,
       4,
       16,
       192,
       false,
       "tiny: 5 sequences, one of 3 tokens"},
      {many(40, 8191), 64, 512, 128, 64, 512, 640, true, "flash: 40 single-token sequences"},
  };
  const RopeParams rope{.n_rot = 64, .theta = 160000.0f};
  for (const C& c : cases) {
    if (c.flash && !h.flash) continue;
    Bufs b(h);
    const size_t S = c.seqs.size();
    std::vector<int64_t> row0(S);
    std::vector<int32_t> pos;
    for (size_t j = 0; j < S; ++j) {
      row0[j] = static_cast<int64_t>(pos.size());
      for (int64_t i = 0; i < c.seqs[j].n; ++i) pos.push_back(c.seqs[j].p0 + static_cast<int32_t>(i));
    }
    const int64_t T = static_cast<int64_t>(pos.size());
    Pair p = b.i32(pos, Shape(T));
    const std::string s = strfmt("%zu sequences, %lld tokens (%s)", S, (long long)T, c.what);
    const GgmlType FP8 = GgmlType::KV_FP8, FP4 = GgmlType::KV_FP4;

    // store_rows: each token's row into its sequence's ring (every ring its own capacity).
    {
      Pair rows = b.f32(random_normal(r, static_cast<size_t>(T * c.d)), Shape(c.d, T));
      std::vector<Pair> rings;
      std::vector<StoreRowsOp> oc, og;
      for (size_t j = 0; j < S; ++j) {
        const int64_t cap = c.cap_w + static_cast<int64_t>(j % 3);
        rings.push_back(b.kv_rows(FP8, random_normal(r, static_cast<size_t>(cap * c.d)), Shape(c.d, cap)));
        oc.push_back({rings[j].c, token_rows(rows.c, row0[j], c.seqs[j].n), elems_of(p.c, row0[j], c.seqs[j].n)});
        og.push_back({rings[j].g, token_rows(rows.g, row0[j], c.seqs[j].n), elems_of(p.g, row0[j], c.seqs[j].n)});
      }
      h.cpu.store_rows_seqs(oc);
      h.gpu.store_rows_seqs(og);
      Diff d;
      for (const Pair& ring : rings) d = worst(d, b.diff_bytes(ring));
      h.report.exact("store_rows_seqs", s, d);
    }

    // compress (main compressor, ratio 4 with overlap, KV_FP8 rows): two copies of every
    // state on the GPU, one for the joint call and one for a call per sequence.
    {
      const int m = 4, R = 2 * m;
      const int64_t w = 2 * c.d;
      Pair kv = b.f32(random_normal(r, static_cast<size_t>(T * w)), Shape(w, T));
      Pair gate = b.f32(random_normal(r, static_cast<size_t>(T * w), 2.0f), Shape(w, T));
      Pair ape = b.random_weight(GgmlType::F16, Shape(w, m));
      Pair norm = b.weight_f32(random_uniform(r, static_cast<size_t>(c.d), 0.5f, 1.5f), Shape(c.d));
      struct State {
        Pair sa, sg, rows;
      };
      std::vector<State> st[2];
      std::vector<CompressOp> oc, og, og1;
      for (size_t j = 0; j < S; ++j) {
        std::vector<float> a = random_normal(r, static_cast<size_t>(R * w)), g = random_normal(r, a.size());
        for (float& x : g)
          if (r.below(3) == 0) x = k_neg_inf;  // empty frontier entries
        const std::vector<float> rows = random_normal(r, static_cast<size_t>(c.seqs[j].cap * c.d));
        for (auto& v : st)
          v.push_back({b.f32(a, Shape(w, R)), b.f32(g, Shape(w, R)), b.kv_rows(FP8, rows, Shape(c.d, c.seqs[j].cap))});
        CompressOp op;
        op.ratio = m;
        op.overlap = true;
        op.eps = 1e-6f;
        op.rope = rope;
        op.sim = KvQuantSim::FP8_BF16;
        op.n_quant = static_cast<int>(c.d - 64);
        op.round_pooled_bf16 = true;
        CompressOp o = op;
        o.rows = st[0][j].rows.c, o.state_a = st[0][j].sa.c, o.state_g = st[0][j].sg.c;
        o.kv = token_rows(kv.c, row0[j], c.seqs[j].n), o.gate = token_rows(gate.c, row0[j], c.seqs[j].n);
        o.ape = ape.c, o.norm_w = norm.c, o.pos = elems_of(p.c, row0[j], c.seqs[j].n);
        oc.push_back(o);
        o.rows = st[0][j].rows.g, o.state_a = st[0][j].sa.g, o.state_g = st[0][j].sg.g;
        o.kv = token_rows(kv.g, row0[j], c.seqs[j].n), o.gate = token_rows(gate.g, row0[j], c.seqs[j].n);
        o.ape = ape.g, o.norm_w = norm.g, o.pos = elems_of(p.g, row0[j], c.seqs[j].n);
        og.push_back(o);
        o.rows = st[1][j].rows.g, o.state_a = st[1][j].sa.g, o.state_g = st[1][j].sg.g;
        og1.push_back(o);
      }
      h.cpu.compress_seqs(oc);
      h.gpu.compress_seqs(og);
      for (const CompressOp& o : og1) h.gpu.compress(o);
      Diff frontier, rows, self;
      for (size_t j = 0; j < S; ++j) {
        frontier = worst(frontier, b.diff(st[0][j].sa));
        frontier = worst(frontier, b.diff(st[0][j].sg));
        rows = worst(rows, b.diff_kv(st[0][j].rows));
        for (const auto& [x, y] : {std::pair{st[0][j].sa.g, st[1][j].sa.g}, std::pair{st[0][j].sg.g, st[1][j].sg.g}})
          self = worst(self, diff_f32(b.get_f32(x, h.gpu), b.get_f32(y, h.gpu)));
        self = worst(self, diff_f32(b.get_kv_f32(st[0][j].rows.g, h.gpu), b.get_kv_f32(st[1][j].rows.g, h.gpu)));
      }
      h.report.exact("compress_seqs state", s, frontier);
      h.report.nmse("compress_seqs rows", s, rows, k_thr_sim);
      h.report.exact("compress_seqs == compress per sequence (cuda)", s, self);
    }

    // indexer_scores and topk: every sequence's own KV_FP4 rows and scores.
    {
      Pair q = b.f32(random_normal(r, static_cast<size_t>(T * c.HI * c.dI)), Shape(c.dI, c.HI, T));
      Pair w = b.f32(random_normal(r, static_cast<size_t>(T * c.HI), 0.1f), Shape(c.HI, T));
      std::vector<Pair> rows, sc, sc1;
      std::vector<IndexerScoresOp> oc, og, og1;
      for (size_t j = 0; j < S; ++j) {
        const int64_t cap = c.seqs[j].cap, n = c.seqs[j].n;
        rows.push_back(b.kv_rows(FP4, random_normal(r, static_cast<size_t>(cap * c.dI)), Shape(c.dI, cap)));
        sc.push_back(b.out(GgmlType::F32, Shape(cap, n)));
        sc1.push_back(b.out(GgmlType::F32, Shape(cap, n)));
        IndexerScoresOp o{.ratio = 4};
        o.q = token_rows(q.c, row0[j], n), o.w = token_rows(w.c, row0[j], n), o.rows = rows[j].c;
        o.pos = elems_of(p.c, row0[j], n), o.scores = sc[j].c;
        oc.push_back(o);
        o.q = token_rows(q.g, row0[j], n), o.w = token_rows(w.g, row0[j], n), o.rows = rows[j].g;
        o.pos = elems_of(p.g, row0[j], n), o.scores = sc[j].g;
        og.push_back(o);
        o.scores = sc1[j].g;
        og1.push_back(o);
      }
      h.cpu.indexer_scores_seqs(oc);
      h.gpu.indexer_scores_seqs(og);
      for (const IndexerScoresOp& o : og1) h.gpu.indexer_scores(o);
      // One NMSE over every sequence's scores: a sequence with few visible rows can have all its scores near 0,
      // where f32 rounding alone gives a large NMSE (seed 12125571718938178224: 1.8e-10 for one sequence).
      Diff self;
      std::vector<float> got, want;
      for (size_t j = 0; j < S; ++j) {
        const std::vector<float> g = b.get_f32(sc[j].g, h.gpu), want_j = b.get_f32(sc[j].c, h.cpu);
        got.insert(got.end(), g.begin(), g.end());
        want.insert(want.end(), want_j.begin(), want_j.end());
        self = worst(self, diff_f32(g, b.get_f32(sc1[j].g, h.gpu)));
      }
      h.report.nmse("indexer_scores_seqs", s, diff_f32(got, want), k_thr_f32);
      h.report.exact("indexer_scores_seqs == indexer_scores per sequence (cuda)", s, self);

      // Top-k of each sequence's scores (the CPU's scores on both sides: exact selections).
      Pair sel = b.out(GgmlType::I32, Shape(c.K, T));
      std::vector<TopKOp> tc, tg;
      for (size_t j = 0; j < S; ++j) {
        const std::vector<float> v = b.get_f32(sc[j].c, h.cpu);
        b.set(sc[j], v.data());
        tc.push_back({token_rows(sel.c, row0[j], c.seqs[j].n), sc[j].c, elems_of(p.c, row0[j], c.seqs[j].n), 4});
        tg.push_back({token_rows(sel.g, row0[j], c.seqs[j].n), sc[j].g, elems_of(p.g, row0[j], c.seqs[j].n), 4});
      }
      h.cpu.topk_seqs(tc);
      h.gpu.topk_seqs(tg);
      h.report.exact("topk_seqs", s, b.diff_ids(sel));
    }

    // attention: every sequence's own ring and compressed rows, and its selection. Tiny: f32
    // rows (the FFMA kernel); Flash: KV_FP8 rows (the tensor-core kernel where there are tensor cores).
    {
      const GgmlType att_rows = c.flash ? FP8 : GgmlType::F32;
      Pair q = b.f32(random_normal(r, static_cast<size_t>(T * c.H * c.d)), Shape(c.d, c.H, T));
      Pair sinks = b.weight_f32(random_normal(r, static_cast<size_t>(c.H)), Shape(c.H));
      std::vector<int32_t> sv(static_cast<size_t>(T * c.K));
      for (size_t j = 0; j < S; ++j)
        for (int64_t t = row0[j]; t < row0[j] + c.seqs[j].n; ++t) {
          const int64_t visible = std::min<int64_t>((pos[t] + 1) / 4, c.seqs[j].cap);
          for (int64_t i = 0; i < c.K; ++i)
            sv[static_cast<size_t>(t * c.K + i)] =
                visible > 0 && r.below(8) ? static_cast<int32_t>(r.below(visible)) : -1;
        }
      Pair sel = b.i32(sv, Shape(c.K, T));
      Pair out = b.out(GgmlType::F32, Shape(c.d, c.H, T)), out1 = b.out(GgmlType::F32, Shape(c.d, c.H, T));
      std::vector<Pair> ring, comp;
      std::vector<AttentionOp> oc, og, og1;
      for (size_t j = 0; j < S; ++j) {
        const int64_t n = c.seqs[j].n, cap = c.seqs[j].cap;
        ring.push_back(b.kv_rows(att_rows, random_normal(r, static_cast<size_t>(c.cap_w * c.d)), Shape(c.d, c.cap_w)));
        comp.push_back(b.kv_rows(att_rows, random_normal(r, static_cast<size_t>(cap * c.d)), Shape(c.d, cap)));
        AttentionOp o;
        o.window = 128;
        o.ratio = 4;
        o.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
        o.keys_bf16 = c.flash;
        o.out = token_rows(out.c, row0[j], n), o.q = token_rows(q.c, row0[j], n), o.ring = ring[j].c;
        o.comp = comp[j].c, o.sel = token_rows(sel.c, row0[j], n), o.sinks = sinks.c;
        o.pos = elems_of(p.c, row0[j], n);
        oc.push_back(o);
        o.out = token_rows(out.g, row0[j], n), o.q = token_rows(q.g, row0[j], n), o.ring = ring[j].g;
        o.comp = comp[j].g, o.sel = token_rows(sel.g, row0[j], n), o.sinks = sinks.g;
        o.pos = elems_of(p.g, row0[j], n);
        og.push_back(o);
        o.out = token_rows(out1.g, row0[j], n);
        og1.push_back(o);
      }
      h.cpu.attention_seqs(oc);
      h.gpu.attention_seqs(og);
      for (const AttentionOp& o : og1) h.gpu.attention(o);
      h.report.nmse("attention_seqs", s, b.diff(out), k_thr_f32);
      h.report.exact("attention_seqs == attention per sequence (cuda)", s,
                     diff_f32(b.get_f32(out.g, h.gpu), b.get_f32(out1.g, h.gpu)));
    }
  }
}

}  // namespace dsv4::cudatest
