// bench_cuda_ops: times the CUDA backend's weight-streaming ops at DeepSeek V4
// Flash shapes, one kernel family at a time (the llm.c dev/cuda habit: each
// kernel checked by test_cuda_ops, then timed here), in seconds instead of an
// 80 GiB model load.
//
//   bench_cuda_ops [--filter S] [--n N] [--reps R] [--no-tensor-cores]
//
// Cases: every matmul shape a Flash decode step runs (weight type, rows x cols,
// groups; n = 1 by default, --n 512 times the prefill tiles), the layer's
// MatmulsOp sets (projections of one input in one op), and the routed
// experts (256 experts, 6 per token: IQ2_XXS gate/up with Q2_K down, Q4_K, MXFP4), the core
// attention of the three layer kinds (bench_attention), and the mHC ops
// (bench_mhc: hc_pre with its fused norm, hc_post), `fast` numerics' activation
// quantisation fused into its producer against a separate op (bench_act_quant),
// and how much of a small op's time the next op hides (bench_overlap). What a case
// measures: R ops recorded as one CUDA graph (as the decode step runs them,
// back to back) and replayed; µs per op = wall time / (replays x R). Each op of
// the graph reads a different copy of the weights (copies are made until they
// exceed 256 MiB; the experts use random ids over all 256), so the weights come
// from DRAM as in a real step, not from the 60 MiB L2. GB/s = weight bytes
// read per op / time. Weights are random (tests/cuda/cuda_test_util.h); the
// kernels' speed does not depend on the values.
//
// Output: one line per case, then nothing else; exit 0, 77 without a GPU.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/act_quant.h"
#include "core/kv_rows.h"
#include "cuda_test_util.h"

namespace {

using namespace dsv4;
using namespace dsv4::cudatest;

struct Opts {
  std::string filter;       // --filter: '|'-separated substrings, a case runs when its name contains one
  mutable int matched = 0;  // cases --filter let through
  int64_t n = 1;
  int reps = 0;  // ops per graph; 0 = as many as there are weight copies
  bool tensor_cores = true;
  std::string cublas = "auto";
  bool int_dot = true;
  bool int8_matvec = true;
  bool int8_tiles = true;
  bool token_matvec = true;
  int64_t gemm_min_tokens = 128;
  std::string expert_gemm = "auto";
  bool eg_codes = true;
  bool gemm_cache = true;
  int attn_terms = 0;  // --fast-attention-terms: the attention cases as `fast` ops with this many bf16 terms

  // Whether the case `name` runs (and counts it): no filter, or its name contains one of the filter's parts.
  bool wants(const std::string& name) const {
    bool hit = filter.empty();
    for (size_t b = 0; !hit && b <= filter.size();) {
      const size_t e = std::min(filter.find('|', b), filter.size());
      hit = e > b && name.find(filter.substr(b, e - b)) != std::string::npos;
      b = e + 1;
    }
    matched += hit;
    return hit;
  }
};

Tensor upload(Backend& gpu, GgmlType t, const std::vector<uint8_t>& bytes, int64_t n0, int64_t n1, int64_t n2 = 1) {
  const int64_t ne[4] = {n0, n1, n2, 1};
  auto w = gpu.upload_weight(bytes.data(), t, ne);
  if (!w) {
    std::fprintf(stderr, "bench_cuda_ops: upload: %s\n", w.error().message.c_str());
    std::exit(1);
  }
  return *w;
}

// n1 rows of n0 N(0, 1) values, each row quantised as q says (ActQuant::NONE: as drawn).
Tensor f32_input(Backend& gpu, Rng& r, int64_t n0, int64_t n1, ActQuant q = ActQuant::NONE) {
  Tensor t = gpu.alloc(GgmlType::F32, n0, n1);
  std::vector<float> v = random_normal(r, static_cast<size_t>(n0 * n1));
  for (int64_t i = 0; i < n1; ++i) act_quant_row(v.data() + i * n0, n0, q);
  gpu.write(t, v.data(), v.size() * sizeof(float));
  return t;
}

// Runs `op(i)` (op i of the sequence) once eagerly, then records `reps` of them
// as one graph and replays it until ~0.3 s have passed; returns seconds per op.
template <class Op>
double time_ops(Backend& gpu, int reps, Op op) {
  for (int i = 0; i < reps; ++i) op(i);  // sizes scratch buffers, warms up
  gpu.synchronize();
  if (!gpu.capture_begin()) {
    std::fprintf(stderr, "bench_cuda_ops: the backend cannot record graphs\n");
    std::exit(1);
  }
  for (int i = 0; i < reps; ++i) op(i);
  const uint64_t id = gpu.capture_end();
  gpu.replay(id);
  gpu.synchronize();
  int replays = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double s = 0;
  while (s < 0.3) {
    for (int j = 0; j < 4; ++j, ++replays)  // queued back to back; one wait per 4 graphs
      if (!gpu.replay(id)) {
        std::fprintf(stderr, "bench_cuda_ops: graph replay refused\n");
        std::exit(1);
      }
    gpu.synchronize();
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  gpu.drop_replay(id);
  return s / (static_cast<double>(replays) * reps);
}

void row(const char* what, double sec, double bytes, double flops) {
  std::printf("%-46s %10.2f us %9.1f GB/s", what, sec * 1e6, bytes / sec / 1e9);
  if (flops > 0) std::printf(" %8.1f TFLOP/s", flops / sec / 1e12);
  std::printf("\n");
  std::fflush(stdout);
}

void bench_matmuls(Backend& gpu, Rng& r, const Opts& o) {
  struct C {
    GgmlType t;
    int64_t rows, cols;
    int groups;
    ActQuant xq = ActQuant::NONE;  // x as --numerics fast quantises it (the int8 matvec for Q8_0 at n = 1)
  };
  using G = GgmlType;
  constexpr ActQuant I8 = ActQuant::INT8_32;
  // The matmuls of one Flash layer (model-spec.md §12), largest first; then those whose x `fast` quantises.
  const C cases[] = {
      {G::Q8_0, 32768, 1024, 1},     {G::Q8_0, 4096, 8192, 1},     {G::Q8_0, 8192, 4096, 8},
      {G::Q8_0, 2048, 4096, 1},      {G::Q8_0, 4096, 2048, 1},     {G::Q8_0, 1024, 4096, 1},
      {G::Q8_0, 512, 4096, 1},       {G::F16, 8192, 1024, 1},      {G::F16, 1024, 4096, 1},
      {G::F16, 512, 4096, 1},        {G::F16, 256, 4096, 1},       {G::F16, 64, 4096, 1},
      {G::Q8_0, 32768, 1024, 1, I8}, {G::Q8_0, 4096, 8192, 1, I8}, {G::Q8_0, 4096, 2048, 1, I8},
      {G::Q8_0, 8192, 1024, 1, I8},  {G::Q8_0, 1024, 4096, 1, I8},
  };
  for (const C& c : cases) {
    const std::string name = strfmt("matmul %s %lldx%lld%s%s n=%lld", ggml_type_name(c.t), (long long)c.rows,
                                    (long long)c.cols, c.groups > 1 ? strfmt(" g%d", c.groups).c_str() : "",
                                    c.xq == ActQuant::NONE ? "" : " x-int8", (long long)o.n);
    if (!o.wants(name)) continue;
    const double wbytes =
        static_cast<double>(ggml_row_bytes(c.t, static_cast<uint64_t>(c.cols))) * static_cast<double>(c.rows);
    const int copies = static_cast<int>(std::min<double>(64.0, std::max(2.0, std::ceil(256.0 * 1048576.0 / wbytes))));
    const std::vector<uint8_t> bytes = random_weight(r, c.t, c.cols, c.rows);  // one random matrix, copied
    std::vector<Tensor> ws;
    for (int i = 0; i < copies; ++i) ws.push_back(upload(gpu, c.t, bytes, c.cols, c.rows));
    Tensor x = f32_input(gpu, r, c.cols * c.groups, o.n, c.xq);
    Tensor out = gpu.alloc(GgmlType::F32, c.rows, o.n);
    const int reps = o.reps > 0 ? o.reps : copies;
    const double sec = time_ops(gpu, reps, [&](int i) {
      gpu.matmul({.out = out, .w = ws[static_cast<size_t>(i % copies)], .x = x, .groups = c.groups, .x_quant = c.xq});
    });
    row(name.c_str(), sec, wbytes,
        2.0 * static_cast<double>(c.rows) * static_cast<double>(c.cols) * static_cast<double>(o.n));
    gpu.synchronize();
    for (auto& w : ws) gpu.free(w);
    gpu.free(x);
    gpu.free(out);
  }
}

// MatmulsOp: a layer's projections of one normed input in one op (one kernel
// for a single token), e.g. "matmuls F16 1024+1024+64+256+256x4096 n=1".
void bench_matmul_sets(Backend& gpu, Rng& r, const Opts& o) {
  using G = GgmlType;
  struct C {
    G t;
    std::vector<int64_t> rows;
    int64_t cols;
    ActQuant xq = ActQuant::NONE;
  };
  const C cases[] = {{G::Q8_0, {1024, 512}, 4096},
                     {G::Q8_0, {2048, 2048}, 4096},
                     {G::F16, {1024, 1024, 64, 256, 256}, 4096},
                     {G::F16, {512, 512}, 4096},
                     {G::Q8_0, {1024, 512}, 4096, ActQuant::INT8_32},
                     {G::Q8_0, {2048, 2048}, 4096, ActQuant::INT8_32}};
  for (const C& c : cases) {
    std::string name = strfmt("matmuls %s ", ggml_type_name(c.t));
    for (size_t i = 0; i < c.rows.size(); ++i) name += strfmt("%s%lld", i ? "+" : "", (long long)c.rows[i]);
    name += strfmt("x%lld%s n=%lld", (long long)c.cols, c.xq == ActQuant::NONE ? "" : " x-int8", (long long)o.n);
    if (!o.wants(name)) continue;
    double wbytes = 0;
    for (int64_t rows : c.rows)
      wbytes += static_cast<double>(ggml_row_bytes(c.t, static_cast<uint64_t>(c.cols))) * static_cast<double>(rows);
    const int copies = static_cast<int>(std::min<double>(64.0, std::max(2.0, std::ceil(256.0 * 1048576.0 / wbytes))));
    std::vector<std::vector<Tensor>> ws(static_cast<size_t>(copies));
    std::vector<Tensor> outs;
    for (int64_t rows : c.rows) {
      const std::vector<uint8_t> bytes = random_weight(r, c.t, c.cols, rows);
      for (int i = 0; i < copies; ++i) ws[static_cast<size_t>(i)].push_back(upload(gpu, c.t, bytes, c.cols, rows));
      outs.push_back(gpu.alloc(GgmlType::F32, rows, o.n));
    }
    Tensor x = f32_input(gpu, r, c.cols, o.n, c.xq);
    const int reps = o.reps > 0 ? o.reps : copies;
    const double sec = time_ops(gpu, reps, [&](int i) {
      MatmulsOp op;
      op.x = x;
      op.x_quant = c.xq;
      op.count = static_cast<int>(c.rows.size());
      for (int k = 0; k < op.count; ++k) {
        op.w[k] = ws[static_cast<size_t>(i % copies)][static_cast<size_t>(k)];
        op.out[k] = outs[static_cast<size_t>(k)];
      }
      gpu.matmuls(op);
    });
    double flops = 0;
    for (int64_t rows : c.rows)
      flops += 2.0 * static_cast<double>(rows) * static_cast<double>(c.cols) * static_cast<double>(o.n);
    row(name.c_str(), sec, wbytes, flops);
    gpu.synchronize();
    for (auto& set : ws)
      for (auto& w : set) gpu.free(w);
    for (auto& t : outs) gpu.free(t);
    gpu.free(x);
  }
}

// xq = INT8_32: x and the mid vector quantised as `fast` numerics does (MoeExpertsOp::x_quant, mid_quant).
void bench_experts(Backend& gpu, Rng& r, const Opts& o, GgmlType gu, GgmlType dn, ActQuant xq = ActQuant::NONE) {
  const std::string name = strfmt("moe_experts %s/%s E=256 k=6%s n=%lld", ggml_type_name(gu), ggml_type_name(dn),
                                  xq == ActQuant::NONE ? "" : " x-int8", (long long)o.n);
  if (!o.wants(name)) return;
  const int64_t E = 256, F = 2048, D = 4096, k = 6, n = o.n;
  Tensor gate = upload(gpu, gu, random_weight(r, gu, D, F * E), D, F, E);
  Tensor up = upload(gpu, gu, random_weight(r, gu, D, F * E), D, F, E);
  Tensor down = upload(gpu, dn, random_weight(r, dn, F, D * E), F, D, E);
  const int reps = o.reps > 0 ? o.reps : 16;
  // Per op: n tokens x k distinct experts, fresh ids each op (uniform over the 256).
  std::vector<Tensor> ids, wts;
  for (int i = 0; i < reps; ++i) {
    std::vector<int32_t> e(static_cast<size_t>(n * k));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < k; ++j) {
        int32_t v;
        bool dup;
        do {
          v = static_cast<int32_t>(r.below(E));
          dup = false;
          for (int64_t jj = 0; jj < j; ++jj) dup |= e[static_cast<size_t>(t * k + jj)] == v;
        } while (dup);
        e[static_cast<size_t>(t * k + j)] = v;
      }
    Tensor ti = gpu.alloc(GgmlType::I32, k, n);
    gpu.write(ti, e.data(), e.size() * sizeof(int32_t));
    ids.push_back(ti);
    const std::vector<float> w = random_uniform(r, static_cast<size_t>(n * k), 0.1f, 1.0f);
    Tensor tw = gpu.alloc(GgmlType::F32, k, n);
    gpu.write(tw, w.data(), w.size() * sizeof(float));
    wts.push_back(tw);
  }
  Tensor x = f32_input(gpu, r, D, n, xq);
  Tensor out = gpu.alloc(GgmlType::F32, D, n);
  const double sec = time_ops(gpu, reps, [&](int i) {
    gpu.moe_experts({.out = out,
                     .x = x,
                     .gate = gate,
                     .up = up,
                     .down = down,
                     .experts = ids[static_cast<size_t>(i)],
                     .weights = wts[static_cast<size_t>(i)],
                     .clamp = 10.0f,
                     .accumulate = false,
                     .mid_quant = xq,
                     .x_quant = xq});
  });
  // Weight bytes: each distinct expert's three matrices once (n = 1: k experts).
  const double per_expert = static_cast<double>(gate.row_bytes() * F * 2 + down.row_bytes() * D);
  const double distinct = n == 1 ? static_cast<double>(k)
                                 : static_cast<double>(E) * (1.0 - std::pow(1.0 - 1.0 / E, static_cast<double>(n * k)));
  row(name.c_str(), sec, per_expert * distinct, 2.0 * 3.0 * static_cast<double>(F * D) * static_cast<double>(n * k));
  gpu.synchronize();
  for (auto& t : ids) gpu.free(t);
  for (auto& t : wts) gpu.free(t);
  gpu.free(gate);
  gpu.free(up);
  gpu.free(down);
  gpu.free(x);
  gpu.free(out);
}

// A Flash layer's hc_pre (hc = 4 streams of D = 4096, F16 fn) with its fused input norm over n tokens, on fresh
// random tensors, each passed to keep(tensor) (which returns it; the caller frees them).
template <class Keep>
HcPreOp flash_hc_pre(Backend& gpu, Rng& r, int64_t n, Keep&& keep) {
  const int64_t D = 4096, hc = 4, mix = (2 + hc) * hc;
  return HcPreOp{.u = keep(gpu.alloc(GgmlType::F32, D, n)),
                 .post = keep(gpu.alloc(GgmlType::F32, hc, n)),
                 .comb = keep(gpu.alloc(GgmlType::F32, hc, hc, n)),
                 .state = keep(f32_input(gpu, r, D * hc, n)).reshape(D, hc, n),
                 .fn = keep(upload(gpu, GgmlType::F16, random_weight(r, GgmlType::F16, hc * D, mix), hc * D, mix)),
                 .scale = keep(f32_input(gpu, r, 3, 1)),
                 .base = keep(f32_input(gpu, r, mix, 1)),
                 .norm_eps = 1e-6f,
                 .hc_eps = 1e-6f,
                 .sinkhorn_iters = 20,
                 .norm_out = keep(gpu.alloc(GgmlType::F32, D, n)),
                 .norm_w = keep(f32_input(gpu, r, D, 1)),
                 .norm_rms_eps = 1e-6f};
}

// The mHC ops of a Flash sublayer (hc = 4 streams of D = 4096, F16 mix weights
// of 16384 x 24): hc_pre with the fused input norm (as the model runs it) and
// hc_post. GB/s: the state read once (hc_pre; read and written: hc_post) plus
// the D-wide rows written (u and the norm) or read (y), and fn once.
void bench_mhc(Backend& gpu, Rng& r, const Opts& o) {
  const int64_t D = 4096, hc = 4, mix = (2 + hc) * hc, n = o.n;
  const std::string pre_name = strfmt("hc_pre F16 %lldx%lld n=%lld", (long long)hc, (long long)D, (long long)n);
  const std::string post_name = strfmt("hc_post %lldx%lld n=%lld", (long long)hc, (long long)D, (long long)n);
  const bool want_pre = o.wants(pre_name);
  const bool want_post = o.wants(post_name);
  if (!want_pre && !want_post) return;
  const int reps = o.reps > 0 ? o.reps : 8;
  std::vector<Tensor> owned;
  auto keep = [&](Tensor t) {
    owned.push_back(t);
    return t;
  };
  const HcPreOp pre = flash_hc_pre(gpu, r, n, keep);
  const Tensor state = pre.state;
  const double state_bytes = static_cast<double>(D * hc * n) * 4.0, row_bytes = static_cast<double>(D * n) * 4.0;
  if (want_pre) {
    const double sec = time_ops(gpu, reps, [&](int) { gpu.hc_pre(pre); });
    row(pre_name.c_str(), sec, state_bytes + 2.0 * row_bytes + static_cast<double>(pre.fn.row_bytes() * mix),
        2.0 * static_cast<double>(hc * D * mix * n));
  }
  if (want_post) {
    Tensor y = f32_input(gpu, r, D, n);
    Tensor post = gpu.alloc(GgmlType::F32, hc, n), comb = gpu.alloc(GgmlType::F32, hc, hc, n);
    {
      const std::vector<float> pv = random_uniform(r, static_cast<size_t>(hc * n), 0.0f, 2.0f);
      gpu.write(post, pv.data(), pv.size() * sizeof(float));
      // (column sums <= 1: the state stays bounded over the replays, which run in place)
      const std::vector<float> cv = random_uniform(r, static_cast<size_t>(hc * hc * n), 0.0f, 0.25f);
      gpu.write(comb, cv.data(), cv.size() * sizeof(float));
    }
    const double sec = time_ops(gpu, reps, [&](int) {
      gpu.hc_post({.state = state, .y = y, .post = post, .comb = comb, .round_bf16 = false});
    });
    row(post_name.c_str(), sec, 2.0 * state_bytes + row_bytes, 0);
    gpu.synchronize();
    for (Tensor* t : {&y, &post, &comb}) gpu.free(*t);
  }
  gpu.synchronize();
  for (Tensor& t : owned) gpu.free(t);
}

// Core attention of a Flash layer (H = 64, d = 512, KV_FP8 rows, window 128)
// for n tokens at the consecutive positions ending at max(2048, n) - 1: the
// three layer kinds (window only; ratio 4 with the top-512 selection, which
// at these positions holds every visible row; ratio 128 with all visible rows).
// FLOP/s: 4 H d per (token, key) (logits and output); GB/s: KV rows read once per token.
void bench_attention(Backend& gpu, Rng& r, const Opts& o) {
  const int64_t H = 64, d = 512, n = o.n, window = 128, top_k = 512;
  const int64_t end = std::max<int64_t>(2048, n), cap_w = window + n;
  for (const int ratio : {0, 4, 128}) {
    const std::string name = strfmt("attention %s n=%lld ctx=%lld",
                                    ratio == 0   ? "window"
                                    : ratio == 4 ? "ratio 4 top-512"
                                                 : "ratio 128",
                                    (long long)n, (long long)end);
    if (!o.wants(name)) continue;
    const int64_t comp_rows = ratio ? end / ratio : 0;
    auto rows = [&](int64_t count) {
      Tensor t = gpu.alloc(GgmlType::KV_FP8, d, count);
      std::vector<uint8_t> b(static_cast<size_t>(t.row_bytes() * count));
      const std::vector<float> v = random_normal(r, static_cast<size_t>(d * count));
      for (int64_t i = 0; i < count; ++i) kv_fp8_pack_row(b.data() + i * t.row_bytes(), v.data() + i * d, d);
      gpu.write(t, b.data(), b.size());
      return t;
    };
    Tensor ring = rows(cap_w), comp = ratio ? rows(comp_rows) : Tensor{};
    std::vector<int32_t> pos(static_cast<size_t>(n)), sel;
    double keys = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = end - n + i;
      pos[static_cast<size_t>(i)] = static_cast<int32_t>(p);
      const int64_t visible = ratio ? (p + 1) / ratio : 0;
      keys += static_cast<double>(std::min<int64_t>(p + 1, window) + (ratio == 4 ? std::min(visible, top_k) : visible));
      if (ratio == 4)
        for (int64_t j = 0; j < top_k; ++j) sel.push_back(j < visible ? static_cast<int32_t>(j) : -1);
    }
    Tensor tp = gpu.alloc(GgmlType::I32, n);
    gpu.write(tp, pos.data(), pos.size() * sizeof(int32_t));
    Tensor ts = ratio == 4 ? gpu.alloc(GgmlType::I32, top_k, n) : Tensor{};
    if (ratio == 4) gpu.write(ts, sel.data(), sel.size() * sizeof(int32_t));
    Tensor q = gpu.alloc(GgmlType::F32, d, H, n), out = gpu.alloc(GgmlType::F32, d, H, n);
    const std::vector<float> qv = random_normal(r, static_cast<size_t>(d * H * n));
    gpu.write(q, qv.data(), qv.size() * sizeof(float));
    Tensor sinks = f32_input(gpu, r, H, 1);
    AttentionOp op;
    op.out = out, op.q = q, op.ring = ring, op.comp = comp, op.sel = ts, op.sinks = sinks, op.pos = tp;
    op.window = static_cast<int>(window);
    op.ratio = ratio;
    op.scale = 1.0f / std::sqrt(static_cast<float>(d));
    op.keys_bf16 = true;
    op.fast = o.attn_terms != 0;
    const int reps = o.reps > 0 ? o.reps : 4;
    const double sec = time_ops(gpu, reps, [&](int) { gpu.attention(op); });
    row(name.c_str(), sec, keys * static_cast<double>(ring.row_bytes()), 4.0 * H * d * keys);
    gpu.synchronize();
    for (Tensor* t : {&ring, &comp, &tp, &ts, &q, &out, &sinks})
      if (*t) gpu.free(*t);
  }
}

const char* k_usage =
    "usage: bench_cuda_ops [--filter S] [--n N] [--reps R] [--no-tensor-cores] [--cublas auto|off|PATH]\n"
    "                      [--gemm-min-tokens N] [--no-int-dot] [--no-int8-matvec] [--no-int8-tiles]\n"
    "                      [--no-token-matvec] [--no-gemm-cache] [--expert-gemm auto|on|off|N]\n"
    "                      [--no-expert-gemm-codes] [--fast-attention-terms N]\n"
    "  --filter S          only cases whose name contains S (e.g. \"Q8_0\", \"moe\", \"attention\", \"hc_\"), or\n"
    "                      one of S's '|'-separated parts (\"x-int8|act_quant\"); none matching is an error\n"
    "  --n N               tokens per op (default 1: decode; e.g. 512: a prefill batch)\n"
    "  --reps R            ops per recorded graph (default: one per weight copy, 16 for the experts)\n"
    "  --no-tensor-cores   batched matmuls on the FFMA tiles\n"
    "  --cublas L          matmuls of >= --gemm-min-tokens tokens on cuBLAS: auto, off (the tile) or a library path\n"
    "  --gemm-min-tokens N the cuBLAS threshold (default 128)\n"
    "  --no-int-dot        decode experts on the float matvec\n"
    "  --no-int8-matvec    Q8_0 matvecs of int8-quantised x (the x-int8 cases) on the float matvec\n"
    "  --no-int8-tiles     tiles of int8-quantised x (the x-int8 cases, n > 1) on f16 MMAs instead of int8\n"
    "  --no-token-matvec   matmuls of 2..4 tokens on the tiles instead of the token matvec\n"
    "  --no-gemm-cache     the cuBLAS matmuls split their weights every call (the default keeps the splits)\n"
    "  --expert-gemm M     prefill experts with >= N assignments in a batch on the grouped wgmma GEMM:\n"
    "                      auto (default: N by weight type, 32 IQ2_XXS and Q4_K, else 64), on (every expert), off (the "
    "tile), or N\n"
    "  --no-expert-gemm-codes  the grouped GEMM's IQ2_XXS and Q2_K weights as f16 hi/lo splits, not integer codes\n"
    "  --fast-attention-terms N  the attention cases as `fast` ops, q and P as N (1, 2, 3) bf16 terms\n";

}  // namespace

// How much of a small op's time its successor hides (PDL): a graph of R ops
// A, one of R ops B, and one of R pairs A -> B, as a decode step runs them.
// hidden = (A + B - AB) / A: 0 = the pair costs the sum (A's chain is on the
// critical path), 1 = A is free (B's pre-pdl_enter weight loads cover it).
// Pairs at Flash's decode shapes: hc_pre (fused norm) -> the attention's first
// projections (Q8_0 1024+512 x 4096), and the q norm (1024) -> q_b (Q8_0
// 32768 x 1024). Each B reads its own weight copy (from DRAM, not L2).
// `fast` numerics' INT8_32 activation quantisation inside its producer ("fused": RmsNormOp::quant,
// HcPreOp::norm_quant, SwigluOp::quant, MatmulOp::x_quantise on the int8 matvec) against the producer and an
// act_quant op after it ("separate"), at the decode shapes of Flash: the q norm (1024, in place), the
// attention/FFN input norm fused into hc_pre (4 x 4096, a quantised copy), the shared expert's SwiGLU (2048),
// wo_b's input (8192, on the 4096 x 8192 Q8_0 matvec; weight copies past 256 MiB).
void bench_act_quant(Backend& gpu, Rng& r, const Opts& o) {
  const int64_t D = 4096, n = o.n;
  const ActQuant I8 = ActQuant::INT8_32;
  const char* what[4] = {"rms_norm 1024", "hc_pre F16 4x4096 + norm", "swiglu 2048", "matmul Q8_0 4096x8192"};
  for (int which = 0; which < 4; ++which)
    for (const bool fused : {true, false}) {
      const std::string name =
          strfmt("act_quant %s %s n=%lld", fused ? "fused" : "separate", what[which], (long long)n);
      if (!o.wants(name)) continue;
      std::vector<Tensor> owned;
      auto keep = [&](Tensor t) {
        owned.push_back(t);
        return t;
      };
      std::function<void(int)> op;
      double bytes = 0;
      int reps = o.reps > 0 ? o.reps : 16;
      if (which == 0) {
        Tensor q = keep(f32_input(gpu, r, 1024, n)), w = keep(f32_input(gpu, r, 1024, 1));
        op = [=, &gpu](int) {
          gpu.rms_norm({.out = q, .x = q, .w = w, .eps = 1e-6f, .quant = fused ? I8 : ActQuant::NONE});
          if (!fused) gpu.act_quant({.out = q, .x = q, .quant = I8});
        };
      } else if (which == 1) {
        HcPreOp pre = flash_hc_pre(gpu, r, n, keep);
        const Tensor xq = keep(gpu.alloc(GgmlType::F32, D, n));
        if (fused) {
          pre.norm_q = xq;
          pre.norm_quant = I8;
        }
        op = [=, &gpu](int) {
          gpu.hc_pre(pre);
          if (!fused) gpu.act_quant({.out = xq, .x = pre.norm_out, .quant = I8});
        };
      } else if (which == 2) {
        Tensor g = keep(f32_input(gpu, r, 2048, n)), u = keep(f32_input(gpu, r, 2048, n)),
               h = keep(gpu.alloc(GgmlType::F32, 2048, n));
        op = [=, &gpu](int) {
          gpu.swiglu({.out = h, .gate = g, .up = u, .clamp = 10.0f, .quant = fused ? I8 : ActQuant::NONE});
          if (!fused) gpu.act_quant({.out = h, .x = h, .quant = I8});
        };
      } else {
        const int copies = 8;  // 8 x 35.7 MB
        const std::vector<uint8_t> wb = random_weight(r, GgmlType::Q8_0, 8192, 4096);
        std::vector<Tensor> ws;
        for (int i = 0; i < copies; ++i) ws.push_back(keep(upload(gpu, GgmlType::Q8_0, wb, 8192, 4096)));
        Tensor x = keep(f32_input(gpu, r, 8192, n)), y = keep(gpu.alloc(GgmlType::F32, 4096, n));
        bytes = static_cast<double>(ws[0].n_bytes());
        reps = o.reps > 0 ? o.reps : copies;
        op = [=, &gpu](int i) {
          const Tensor& w = ws[static_cast<size_t>(i % copies)];
          if (fused) {
            gpu.matmul({.out = y, .w = w, .x = x, .x_quantise = I8});
          } else {
            gpu.act_quant({.out = x, .x = x, .quant = I8});
            gpu.matmul({.out = y, .w = w, .x = x, .x_quant = I8});
          }
        };
      }
      row(name.c_str(), time_ops(gpu, reps, op), bytes, 0);
      gpu.synchronize();
      for (Tensor& t : owned) gpu.free(t);
    }
}

void bench_overlap(Backend& gpu, Rng& r, const Opts& o) {
  const int64_t D = 4096, n = o.n;
  const std::string names[2] = {strfmt("overlap hc_pre F16 4x4096 > matmuls Q8_0 1024+512x4096 n=%lld", (long long)n),
                                strfmt("overlap rms_norm 1024 > matmul Q8_0 32768x1024 n=%lld", (long long)n)};
  for (int which = 0; which < 2; ++which) {
    if (!o.wants(names[which])) continue;
    std::vector<Tensor> owned;
    auto keep = [&](Tensor t) {
      owned.push_back(t);
      return t;
    };
    std::function<void(int)> op_a, op_b;
    const int copies = which == 0 ? 48 : 8;  // >= 256 MiB of B weights in all
    std::vector<std::vector<Tensor>> ws(static_cast<size_t>(copies));
    if (which == 0) {
      const HcPreOp pre = flash_hc_pre(gpu, r, n, keep);
      const Tensor xn = pre.norm_out;
      Tensor qa = keep(gpu.alloc(GgmlType::F32, 1024, n)), kv = keep(gpu.alloc(GgmlType::F32, 512, n));
      for (const int64_t rows : {1024, 512}) {
        const std::vector<uint8_t> bytes = random_weight(r, GgmlType::Q8_0, D, rows);
        for (int i = 0; i < copies; ++i)
          ws[static_cast<size_t>(i)].push_back(upload(gpu, GgmlType::Q8_0, bytes, D, rows));
      }
      op_a = [=, &gpu](int) { gpu.hc_pre(pre); };
      op_b = [=, &gpu, &ws](int i) {
        MatmulsOp m;
        m.x = xn;
        m.count = 2;
        m.w[0] = ws[static_cast<size_t>(i % copies)][0];
        m.w[1] = ws[static_cast<size_t>(i % copies)][1];
        m.out[0] = qa;
        m.out[1] = kv;
        gpu.matmuls(m);
      };
    } else {
      Tensor x = keep(f32_input(gpu, r, 1024, n)), w = keep(f32_input(gpu, r, 1024, 1));
      Tensor xn = keep(gpu.alloc(GgmlType::F32, 1024, n)), q = keep(gpu.alloc(GgmlType::F32, 32768, n));
      const std::vector<uint8_t> bytes = random_weight(r, GgmlType::Q8_0, 1024, 32768);
      for (int i = 0; i < copies; ++i)
        ws[static_cast<size_t>(i)].push_back(upload(gpu, GgmlType::Q8_0, bytes, 1024, 32768));
      op_a = [=, &gpu](int) { gpu.rms_norm({.out = xn, .x = x, .w = w, .eps = 1e-6f}); };
      op_b = [=, &gpu, &ws](int i) { gpu.matmul({q, ws[static_cast<size_t>(i % copies)][0], xn}); };
    }
    const int reps = o.reps > 0 ? o.reps : copies;
    const double a = time_ops(gpu, reps, op_a), b = time_ops(gpu, reps, op_b);
    const double ab = time_ops(gpu, reps, [&](int i) {
      op_a(i);
      op_b(i);
    });
    std::printf("%-46s %10.2f us   A %.2f us, B %.2f us, hidden %.0f%% of A\n", names[which].c_str(), ab * 1e6, a * 1e6,
                b * 1e6, 100.0 * (a + b - ab) / a);
    std::fflush(stdout);
    gpu.synchronize();
    for (auto& set : ws)
      for (auto& t : set) gpu.free(t);
    for (auto& t : owned) gpu.free(t);
  }
}

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda_ops: %s needs a value\n%s", a.c_str(), k_usage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--filter")
      o.filter = value();
    else if (a == "--n")
      o.n = std::atoll(value());
    else if (a == "--reps")
      o.reps = std::atoi(value());
    else if (a == "--no-tensor-cores")
      o.tensor_cores = false;
    else if (a == "--cublas")
      o.cublas = value();
    else if (a == "--gemm-min-tokens")
      o.gemm_min_tokens = std::atoll(value());
    else if (a == "--no-int-dot")
      o.int_dot = false;
    else if (a == "--no-int8-matvec")
      o.int8_matvec = false;
    else if (a == "--no-int8-tiles")
      o.int8_tiles = false;
    else if (a == "--no-token-matvec")
      o.token_matvec = false;
    else if (a == "--no-gemm-cache")
      o.gemm_cache = false;
    else if (a == "--expert-gemm" && i + 1 < argc)
      o.expert_gemm = argv[++i];
    else if (a == "--no-expert-gemm-codes")
      o.eg_codes = false;
    else if (a == "--fast-attention-terms" && i + 1 < argc)
      o.attn_terms = std::atoi(argv[++i]);
    else if (a == "--help" || a == "-h") {
      std::printf("%s", k_usage);
      return 0;
    } else {
      std::fprintf(stderr, "bench_cuda_ops: unknown option %s\n%s", a.c_str(), k_usage);
      return 2;
    }
  }
  if (o.n < 1 || o.n > 65536 || o.reps < 0 || o.reps > 4096) {
    std::fprintf(stderr, "bench_cuda_ops: --n must be 1..65536 and --reps 0..4096\n");
    return 2;
  }
  if (!cuda_device_present()) {
    std::fprintf(stderr, "bench_cuda_ops: no CUDA device\n");
    return 77;
  }
  CudaBackendOptions gopt;
  gopt.tensor_cores = o.tensor_cores;
  if (auto st = parse_cublas(o.cublas, gopt); !st) {
    std::fprintf(stderr, "bench_cuda_ops: --cublas: %s\n", st.error().message.c_str());
    return 2;
  }
  gopt.gemm_min_tokens = o.gemm_min_tokens;
  gopt.int_dot = o.int_dot;
  gopt.act_quant_fusion = ActQuantFusion::ALL;  // the act_quant cases time every fused form (the norms' too)
  gopt.int8_matvec = o.int8_matvec;
  gopt.int8_tiles = o.int8_tiles;
  gopt.token_matvec = o.token_matvec;
  auto eg = parse_expert_gemm(o.expert_gemm);
  if (!eg) {
    std::fprintf(stderr, "bench_cuda_ops: --expert-gemm: %s\n", eg.error().message.c_str());
    return 2;
  }
  gopt.expert_gemm_min = *eg;
  gopt.expert_gemm_codes = o.eg_codes;
  if (o.attn_terms) gopt.fast_attention_terms = o.attn_terms;
  gopt.gemm_weight_cache = o.gemm_cache;
  gopt.print_properties = false;
  auto gpu = make_cuda_backend(0, gopt);
  if (!gpu) {
    std::fprintf(stderr, "bench_cuda_ops: %s\n", gpu.error().message.c_str());
    return 1;
  }
  std::printf("# bench_cuda_ops on %s; n=%lld\n", (*gpu)->name().c_str(), static_cast<long long>(o.n));
  Rng r(1);
  bench_matmuls(**gpu, r, o);
  bench_matmul_sets(**gpu, r, o);
  bench_experts(**gpu, r, o, GgmlType::IQ2_XXS, GgmlType::Q2_K);                     // the q2 file
  bench_experts(**gpu, r, o, GgmlType::Q4_K, GgmlType::Q4_K);                        // q4
  bench_experts(**gpu, r, o, GgmlType::MXFP4, GgmlType::MXFP4);                      // MXFP4Experts
  bench_experts(**gpu, r, o, GgmlType::IQ2_XXS, GgmlType::Q2_K, ActQuant::INT8_32);  // q2, `fast` numerics
  bench_experts(**gpu, r, o, GgmlType::MXFP4, GgmlType::MXFP4, ActQuant::INT8_32);   // MXFP4, `fast` numerics
  bench_attention(**gpu, r, o);
  bench_mhc(**gpu, r, o);
  bench_act_quant(**gpu, r, o);
  bench_overlap(**gpu, r, o);
  if (o.matched == 0) {
    std::fprintf(stderr, "bench_cuda_ops: no case matches --filter %s\n", o.filter.c_str());
    return 2;
  }
  return 0;
}
