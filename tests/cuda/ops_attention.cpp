// Cases: KV compressor (multi-call sequences through window boundaries),
// lightning-indexer scores, top-k selection (ties, fewer visible rows than k),
// and core attention (window-only, selected and all compressed rows).
#include <cmath>
#include <limits>

#include "ops_harness.h"

namespace dsv4::cudatest {

namespace {

constexpr float k_neg_inf = -std::numeric_limits<float>::infinity();

RopeParams rope_compress() {
  RopeParams p;
  p.n_rot = 64;
  p.theta = 160000.0f;
  p.yarn = true;
  p.factor = 16.0f;
  p.orig_ctx = 65536;
  return p;
}

const char* sim_name(KvQuantSim s) {
  switch (s) {
    case KvQuantSim::NONE: return "none";
    case KvQuantSim::FP8_BF16: return "fp8";
    case KvQuantSim::HADAMARD_FP4: return "hadamard-fp4";
  }
  return "?";
}

}  // namespace

void cases_compress(Harness& h) {
  if (!h.want("compress")) return;
  Rng& r = h.rng;
  struct C {
    int ratio;
    bool overlap;
    int64_t d;
    KvQuantSim sim;
    int n_quant;
    bool round;
    std::vector<int64_t> chunks;
    bool flash;
    const char* what;
    GgmlType rows_type = GgmlType::F32;
    GgmlType ape_type = GgmlType::F16;  // GGUF files: F16 (read in place, as F32); others go through dequantize_rows
  };
  const GgmlType FP8 = GgmlType::KV_FP8, FP4 = GgmlType::KV_FP4, F32 = GgmlType::F32;
  const std::vector<C> cases = {
      {4, true, 128, KvQuantSim::FP8_BF16, 64, true, {1, 3, 4, 7, 1, 16, 30, 2}, false, "tiny main ratio 4"},
      {4, true, 128, KvQuantSim::NONE, 0, false, {5, 11, 48}, false, "tiny main ratio 4, plain"},
      {4, true, 128, KvQuantSim::NONE, 0, false, {5, 11, 48}, false, "tiny main ratio 4, plain, F32 APE", F32, F32},
      {4,
       true,
       128,
       KvQuantSim::NONE,
       0,
       false,
       {5, 11, 48},
       false,
       "tiny main ratio 4, plain, Q8_0 APE",
       F32,
       GgmlType::Q8_0},
      {128, false, 128, KvQuantSim::FP8_BF16, 64, true, {1, 126, 1, 130, 300}, false, "tiny main ratio 128"},
      {128, false, 128, KvQuantSim::NONE, 0, false, {255, 1, 2}, false, "tiny ratio 128, plain"},
      {4, true, 128, KvQuantSim::HADAMARD_FP4, 0, true, {2, 6, 40, 1, 1}, false, "tiny indexer ratio 4"},
      {4,
       true,
       128,
       KvQuantSim::FP8_BF16,
       64,
       true,
       {1, 3, 4, 7, 1, 16, 30, 2},
       false,
       "tiny main ratio 4, KV_FP8 rows",
       FP8},
      {128,
       false,
       128,
       KvQuantSim::FP8_BF16,
       64,
       true,
       {1, 126, 1, 130, 300},
       false,
       "tiny main ratio 128, KV_FP8 rows",
       FP8},
      {4,
       true,
       128,
       KvQuantSim::HADAMARD_FP4,
       0,
       true,
       {2, 6, 40, 1, 1},
       false,
       "tiny indexer ratio 4, KV_FP4 rows",
       FP4},
      {4, true, 512, KvQuantSim::FP8_BF16, 448, true, {3, 64, 1}, true, "flash main ratio 4"},
      {128, false, 512, KvQuantSim::FP8_BF16, 448, true, {127, 1, 300}, true, "flash main ratio 128"},
      // (2000 / 1000: prefill-sized batches completing hundreds of windows at once)
      {4,
       true,
       512,
       KvQuantSim::FP8_BF16,
       448,
       true,
       {3, 64, 1, 2000, 1},
       true,
       "flash main ratio 4, KV_FP8 rows",
       FP8},
      {128,
       false,
       512,
       KvQuantSim::FP8_BF16,
       448,
       true,
       {127, 1, 300, 1000, 1},
       true,
       "flash main ratio 128, KV_FP8 rows",
       FP8},
      {4, true, 128, KvQuantSim::HADAMARD_FP4, 0, true, {511, 1, 300}, true, "flash indexer ratio 4, KV_FP4 rows", FP4},
  };
  for (const C& c : cases) {
    if (c.flash && !h.flash) continue;
    Bufs b(h);
    const int m = c.ratio;
    const int64_t w = (c.overlap ? 2 : 1) * c.d, R = c.overlap ? 2 * m : m;
    int64_t total = 0;
    for (int64_t n : c.chunks) total += n;
    const int64_t cap_rows = total / m + 1;
    Pair sa = b.f32(std::vector<float>(static_cast<size_t>(R * w), 0.0f), Shape(w, R));
    Pair sg = b.f32(std::vector<float>(static_cast<size_t>(R * w), k_neg_inf), Shape(w, R));
    Pair rows = b.kv_rows(c.rows_type, random_normal(r, static_cast<size_t>(cap_rows * c.d)),
                          Shape(c.d, cap_rows));  // earlier rows: kept
    Pair ape = b.random_weight(c.ape_type, Shape(w, m));
    Pair norm = b.weight_f32(random_uniform(r, static_cast<size_t>(c.d), 0.5f, 1.5f), Shape(c.d));
    Diff frontier, worst_rows;
    int64_t p0 = 0;
    for (int64_t n : c.chunks) {
      Pair kv = b.f32(random_normal(r, static_cast<size_t>(n * w)), Shape(w, n));
      Pair gate = b.f32(random_normal(r, static_cast<size_t>(n * w), 2.0f), Shape(w, n));
      std::vector<int32_t> pos(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(p0 + i);
      Pair p = b.i32(pos, Shape(n));
      CompressOp op;
      op.ratio = m;
      op.overlap = c.overlap;
      op.eps = 1e-6f;
      op.rope = rope_compress();
      op.sim = c.sim;
      op.n_quant = c.n_quant;
      op.round_pooled_bf16 = c.round;
      CompressOp oc = op, og = op;
      oc.rows = rows.c, oc.state_a = sa.c, oc.state_g = sg.c, oc.kv = kv.c, oc.gate = gate.c, oc.ape = ape.c,
      oc.norm_w = norm.c, oc.pos = p.c;
      og.rows = rows.g, og.state_a = sa.g, og.state_g = sg.g, og.kv = kv.g, og.gate = gate.g, og.ape = ape.g,
      og.norm_w = norm.g, og.pos = p.g;
      h.cpu.compress(oc);
      h.gpu.compress(og);
      const Diff da = b.diff(sa), dg = b.diff(sg), dr = b.diff_kv(rows);
      frontier.n += da.n + dg.n;
      frontier.n_diff += da.n_diff + dg.n_diff;
      frontier.bad_nonfinite += da.bad_nonfinite + dg.bad_nonfinite;
      if (dr.nmse >= worst_rows.nmse || dr.bad_nonfinite) worst_rows = dr;
      p0 += n;
    }
    const std::string s = strfmt("d=%lld m=%d %s%s, %zu calls to pos %lld (%s)", (long long)c.d, m, sim_name(c.sim),
                                 c.round ? "+bf16" : "", c.chunks.size(), (long long)total, c.what);
    h.report.exact("compress state", s, frontier);
    h.report.nmse("compress rows", s, worst_rows, c.sim == KvQuantSim::NONE && !c.round ? k_thr_f32 : k_thr_sim);
  }
}

void cases_indexer(Harness& h) {
  Rng& r = h.rng;
  if (h.want("indexer_scores")) {
    struct C {
      int64_t HI, dI, cap;
      std::vector<int32_t> pos;
      bool flash;
      GgmlType rows_type = GgmlType::F32;
      bool exact =
          false;  // q and rows bf16-exact, IndexerScoresOp::inputs_bf16 (the tensor-core kernel for >= 8 queries)
    };
    auto queries = [&](int n, int32_t lo, int32_t hi) {
      std::vector<int32_t> v(static_cast<size_t>(n));
      for (auto& x : v) x = lo + static_cast<int32_t>(r.below(hi - lo + 1));
      v[0] = lo;
      return v;
    };
    const GgmlType FP4 = GgmlType::KV_FP4, F32 = GgmlType::F32;
    const std::vector<C> cases = {
        {4, 128, 175, {0, 2, 3, 10, 699, 350}, false},
        {4, 128, 175, {699}, false},
        {4, 128, 175, {0, 2, 3, 10, 699, 350}, false, FP4},
        {4, 128, 175, queries(24, 0, 699), false, FP4, true},
        {20, 128, 300, queries(12, 0, 1199), false, F32, true},
        {4, 128, 175, queries(12, 0, 699), false, F32},
        {64, 128, 4096, {16383, 100, 8000}, true},
        {64, 128, 262144, {1048575}, true},
        {64, 128, 4096, {16383, 100, 8000}, true, FP4},
        {64, 128, 4096, queries(40, 0, 16383), true, FP4, true},
        {64, 128, 5000, queries(9, 15000, 19999), true, F32, true},
    };
    for (const C& c : cases) {
      if (c.flash && !h.flash) continue;
      Bufs b(h);
      const int64_t n = static_cast<int64_t>(c.pos.size());
      auto values = [&](size_t count) {
        std::vector<float> v = random_normal(r, count);
        if (c.exact)
          for (float& x : v) x = bf16_round(x);
        return v;
      };
      Pair q = b.f32(values(static_cast<size_t>(n * c.HI * c.dI)), Shape(c.dI, c.HI, n));
      Pair w = b.f32(random_normal(r, static_cast<size_t>(n * c.HI), 0.1f), Shape(c.HI, n));
      Pair rows = b.kv_rows(c.rows_type, values(static_cast<size_t>(c.cap * c.dI)), Shape(c.dI, c.cap));
      Pair p = b.i32(c.pos, Shape(n));
      Pair sc = b.out(GgmlType::F32, Shape(c.cap, n));
      h.cpu.indexer_scores(
          {.scores = sc.c, .q = q.c, .w = w.c, .rows = rows.c, .pos = p.c, .ratio = 4, .inputs_bf16 = c.exact});
      h.gpu.indexer_scores(
          {.scores = sc.g, .q = q.g, .w = w.g, .rows = rows.g, .pos = p.g, .ratio = 4, .inputs_bf16 = c.exact});
      h.report.nmse(
          "indexer_scores",
          strfmt("H_I=%lld d_I=%lld rows=%lld %s%s n=%lld pos %d..", (long long)c.HI, (long long)c.dI, (long long)c.cap,
                 ggml_type_name(c.rows_type), c.exact ? " bf16-exact" : "", (long long)n, c.pos[0]),
          b.diff(sc), k_thr_f32);
    }
  }
  if (h.want("topk")) {
    enum class Fill { RANDOM, TIES, ZEROS, NEGATIVE, WIDE };
    struct C {
      int64_t K, cap;
      std::vector<int32_t> pos;
      Fill fill;
      bool flash;
    };
    const std::vector<C> cases = {
        {16, 175, {2, 40, 63, 67, 699, 300}, Fill::RANDOM, false},
        {16, 175, {699, 67, 130}, Fill::TIES, false},
        {16, 175, {699, 99}, Fill::ZEROS, false},
        {16, 175, {699, 130}, Fill::NEGATIVE, false},  // keys in the low bins only
        {40, 600, {2399, 1000}, Fill::WIDE, false},    // keys spread over most bins
        {512, 16384, {1199, 2047, 65535, 40000}, Fill::RANDOM, true},
        {512, 16384, {65535, 2051}, Fill::TIES, true},
        {512, 262144, {1048575}, Fill::RANDOM, true},
    };
    for (const C& c : cases) {
      if (c.flash && !h.flash) continue;
      Bufs b(h);
      const int64_t n = static_cast<int64_t>(c.pos.size());
      std::vector<float> s(static_cast<size_t>(n * c.cap));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t visible = std::min<int64_t>((c.pos[t] + 1) / 4, c.cap);
        for (int64_t k = 0; k < c.cap; ++k) {
          float v = r.normal();
          if (c.fill == Fill::TIES) v = static_cast<float>(r.below(3));                         // three distinct values
          if (c.fill == Fill::ZEROS) v = r.below(4) == 0 ? 1.0f : (r.below(2) ? 0.0f : -0.0f);  // +0 and -0 tie
          if (c.fill == Fill::NEGATIVE) v = -1.0f - std::fabs(v);
          if (c.fill == Fill::WIDE) v = (r.below(2) ? 1.0f : -1.0f) * std::exp(20.0f * v);
          s[static_cast<size_t>(t * c.cap + k)] =
              k < visible ? v : (k % 2 ? k_neg_inf : 1e30f);  // past visible: ignored
        }
      }
      Pair sc = b.f32(s, Shape(c.cap, n));
      Pair p = b.i32(c.pos, Shape(n));
      Pair sel = b.out(GgmlType::I32, Shape(c.K, n));
      h.cpu.topk({.sel = sel.c, .scores = sc.c, .pos = p.c, .ratio = 4});
      h.gpu.topk({.sel = sel.g, .scores = sc.g, .pos = p.g, .ratio = 4});
      h.report.exact("topk",
                     strfmt("k=%lld rows=%lld n=%lld %s", (long long)c.K, (long long)c.cap, (long long)n,
                            c.fill == Fill::TIES       ? "ties"
                            : c.fill == Fill::ZEROS    ? "+0/-0 ties"
                            : c.fill == Fill::NEGATIVE ? "negative"
                            : c.fill == Fill::WIDE     ? "wide range"
                                                       : "random"),
                     b.diff_ids(sel));
    }
  }
}

void cases_attention(Harness& h) {
  if (!h.want("attention")) return;
  Rng& r = h.rng;
  struct C {
    int64_t H, d, cap_w, comp_rows, n_sel;
    int window, ratio;
    std::vector<int32_t> pos;
    bool flash;
    const char* what;
    GgmlType rows_type = GgmlType::F32;  // ring and comp
    bool keys_bf16 = false;              // F32 rows: values rounded to bf16 and AttentionOp::keys_bf16 set
  };
  const GgmlType FP8 = GgmlType::KV_FP8, F32 = GgmlType::F32;
  // Prefill-sized batches (>= 8 tokens: the tensor-core kernel when the rows are bf16-exact).
  auto positions = [&](int n, int32_t lo, int32_t hi) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = lo + static_cast<int32_t>(r.below(hi - lo + 1));
    v[0] = lo;
    return v;
  };
  const std::vector<C> cases = {
      {4, 128, 192, 0, 0, 128, 0, {0, 5, 127, 128, 129, 600}, false, "tiny window only"},
      {4, 128, 192, 176, 16, 128, 4, {0, 3, 4, 130, 600, 699}, false, "tiny ratio 4, top-16, KV_FP8 rows", FP8},
      {4, 128, 192, 6, 0, 128, 128, {126, 127, 128, 255, 256, 699}, false, "tiny ratio 128, KV_FP8 rows", FP8},
      {64, 512, 640, 2049, 512, 128, 4, {8191, 3000, 1500}, true, "flash ratio 4, top-512, KV_FP8 rows", FP8},
      {64, 512, 640, 8193, 0, 128, 128, {1048575}, true, "flash ratio 128 at 1M, KV_FP8 rows", FP8},
      {4, 128, 192, 176, 16, 128, 4, {0, 3, 4, 130, 600, 699}, false, "tiny ratio 4, top-16"},
      {4, 128, 192, 6, 0, 128, 128, {126, 127, 128, 255, 256, 699}, false, "tiny ratio 128, all rows"},
      {4, 128, 129, 0, 0, 128, 0, {1000}, false, "ring = window + 1"},
      {64, 512, 640, 0, 0, 128, 0, {0, 200}, true, "flash window only"},
      {64, 512, 640, 2049, 512, 128, 4, {8191, 3000, 1500}, true, "flash ratio 4, top-512"},
      {64, 512, 640, 65, 0, 128, 128, {8191, 127}, true, "flash ratio 128"},
      {64, 512, 640, 8193, 0, 128, 128, {1048575}, true, "flash ratio 128 at 1M"},
      {4, 128, 192, 176, 16, 128, 4, positions(40, 0, 699), false, "tiny batch, ratio 4, top-16, KV_FP8 rows", FP8},
      {4, 128, 192, 6, 0, 128, 128, positions(24, 100, 699), false, "tiny batch, ratio 128, bf16 f32 rows", F32, true},
      {4, 128, 192, 6, 0, 128, 128, positions(24, 100, 699), false, "tiny batch, ratio 128, f32 rows (FFMA)"},
      {40, 256, 300, 40, 0, 128, 128, positions(20, 0, 5000), false, "40 heads (padded block), ratio 128, KV_FP8 rows",
       FP8},
      {20, 128, 200, 60, 8, 128, 4, positions(12, 0, 239), false, "20 heads (padded block), top-8, bf16 f32 rows", F32,
       true},
      {64, 512, 640, 2049, 512, 128, 4, positions(48, 0, 8191), true, "flash batch, ratio 4, top-512, KV_FP8 rows",
       FP8},
      {64, 512, 640, 65, 0, 128, 128, positions(32, 0, 8191), true, "flash batch, ratio 128, KV_FP8 rows", FP8},
      {64, 512, 640, 0, 0, 128, 0, positions(16, 0, 3000), true, "flash batch, window only, bf16 f32 rows", F32, true},
      {64, 512, 640, 8193, 0, 128, 128, positions(8, 1040000, 1048575), true,
       "flash batch, ratio 128 near 1M, KV_FP8 rows", FP8},
  };
  for (const C& c : cases) {
    if (c.flash && !h.flash) continue;
    Bufs b(h);
    const int64_t n = static_cast<int64_t>(c.pos.size());
    Pair q = b.f32(random_normal(r, static_cast<size_t>(n * c.H * c.d)), Shape(c.d, c.H, n));
    auto key_values = [&](int64_t rows) {
      std::vector<float> v = random_normal(r, static_cast<size_t>(rows * c.d));
      if (c.keys_bf16)
        for (float& x : v) x = bf16_round(x);
      return v;
    };
    Pair ring = b.kv_rows(c.rows_type, key_values(c.cap_w), Shape(c.d, c.cap_w));
    Pair comp = c.comp_rows ? b.kv_rows(c.rows_type, key_values(c.comp_rows), Shape(c.d, c.comp_rows)) : Pair{};
    Pair sel{};
    if (c.n_sel) {
      std::vector<int32_t> s(static_cast<size_t>(n * c.n_sel));
      for (int64_t t = 0; t < n; ++t) {
        const int64_t visible = std::min<int64_t>((c.pos[t] + 1) / c.ratio, c.comp_rows);
        for (int64_t i = 0; i < c.n_sel; ++i) {
          const int64_t kind = r.below(10);
          int32_t v = visible > 0 ? static_cast<int32_t>(r.below(visible)) : -1;
          if (kind == 0) v = -1;                                          // padding
          if (kind == 1) v = static_cast<int32_t>(visible + r.below(4));  // not visible yet: skipped
          s[static_cast<size_t>(t * c.n_sel + i)] = v;
        }
      }
      sel = b.i32(s, Shape(c.n_sel, n));
    }
    Pair sinks = b.weight_f32(random_normal(r, static_cast<size_t>(c.H)), Shape(c.H));
    Pair p = b.i32(c.pos, Shape(n));
    Pair out = b.out(GgmlType::F32, Shape(c.d, c.H, n));
    AttentionOp op;
    op.window = c.window;
    op.ratio = c.ratio;
    op.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    op.keys_bf16 = c.keys_bf16;
    AttentionOp oc = op, og = op;
    oc.out = out.c, oc.q = q.c, oc.ring = ring.c, oc.comp = comp.c, oc.sel = sel.c, oc.sinks = sinks.c, oc.pos = p.c;
    og.out = out.g, og.q = q.g, og.ring = ring.g, og.comp = comp.g, og.sel = sel.g, og.sinks = sinks.g, og.pos = p.g;
    h.cpu.attention(oc);
    h.gpu.attention(og);
    const std::string sp =
        strfmt("H=%lld d=%lld n=%lld pos %d.. (%s)", (long long)c.H, (long long)c.d, (long long)n, c.pos[0], c.what);
    h.report.nmse("attention", sp, b.diff(out), k_thr_f32);
    // `fast` (AttentionOp::fast): with 3 terms, or where the tensor-core kernel does not run or takes no fewer
    // (head widths other than 512), bitwise the op above; with fewer, q and P rounded to 16 or 8 significant
    // bits (relative 2^-17 or 2^-9 per value): NMSE bounds far above those roundings' and far below a wrong key
    // or head (~1).
    Pair fout = b.out(GgmlType::F32, Shape(c.d, c.H, n));
    AttentionOp of = og;
    of.out = fout.g;
    of.fast = true;
    h.gpu.attention(of);
    const bool rounds =
        h.tensor_cores && c.d == 512 && h.fast_attention_terms < 3 && (c.rows_type == GgmlType::KV_FP8 || c.keys_bf16);
    if (rounds)
      h.report.nmse("attention fast", sp + strfmt(", %d bf16 terms", h.fast_attention_terms),
                    diff_f32(b.get_f32(fout.g, h.gpu), b.get_f32(out.c, h.cpu)),
                    h.fast_attention_terms == 2 ? 1e-8 : 1e-4);
    else
      h.report.exact("attention fast", sp + " == reference",
                     diff_f32(b.get_f32(fout.g, h.gpu), b.get_f32(out.g, h.gpu)));
  }
  {
    // The KV_FP8 key decode bit for bit, e4m3 subnormal codes included (NMSE could
    // not see them: they are ~2^-15 of their block's largest value). Every ring
    // and compressed row is the same row R (per 64-block one value of 300, so the
    // scale is 1, the others within +-0.03: most codes subnormal) and q = 0: every
    // logit is 0, p = 1 for every key, e^(sink) = 0, so o = n_keys R / n_keys = R
    // exactly on any path (sums of <= 2^10 equal bf16 values are exact).
    Bufs b(h);
    const int64_t H = 32, d = 512, cap_w = 256, comp_rows = 8;
    std::vector<int32_t> pos(16);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>(900 + i);
    const int64_t n = static_cast<int64_t>(pos.size());
    std::vector<float> row = random_uniform(r, static_cast<size_t>(d), -0.03f, 0.03f);
    for (int64_t i = 0; i < d - 64; i += 64) row[static_cast<size_t>(i + r.below(64))] = 300.0f;
    auto rows = [&](int64_t count) {
      std::vector<float> v;
      for (int64_t i = 0; i < count; ++i) v.insert(v.end(), row.begin(), row.end());
      return b.kv_rows(GgmlType::KV_FP8, v, Shape(d, count));
    };
    Pair ring = rows(cap_w), comp = rows(comp_rows);
    Pair q = b.f32(std::vector<float>(static_cast<size_t>(n * H * d), 0.0f), Shape(d, H, n));
    Pair sinks = b.weight_f32(std::vector<float>(static_cast<size_t>(H), -200.0f), Shape(H));
    Pair p = b.i32(pos, Shape(n));
    Pair out = b.out(GgmlType::F32, Shape(d, H, n));
    AttentionOp op;
    op.window = 128;
    op.ratio = 128;
    op.scale = 1.0f / std::sqrt(static_cast<float>(d));
    op.keys_bf16 = true;
    AttentionOp oc = op, og = op;
    oc.out = out.c, oc.q = q.c, oc.ring = ring.c, oc.comp = comp.c, oc.sinks = sinks.c, oc.pos = p.c;
    og.out = out.g, og.q = q.g, og.ring = ring.g, og.comp = comp.g, og.sinks = sinks.g, og.pos = p.g;
    h.cpu.attention(oc);
    h.gpu.attention(og);
    h.report.exact("attention", "H=32 d=512 n=16, identical KV_FP8 rows with subnormal e4m3 codes, q = 0: o = the row",
                   b.diff(out));
  }
}

}  // namespace dsv4::cudatest
