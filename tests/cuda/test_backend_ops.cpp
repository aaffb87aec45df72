// test_backend_ops: every op of the CUDA backend against the CPU backend
// (the oracle), on fresh random inputs each run (the seed is printed; --seed
// repeats a run), with outputs poisoned with NaN before each run. One line per
// case (op, shape, NMSE or exact-match count, ok/FAIL), a summary last; the
// exit code is non-zero on any failure (77 when there is no CUDA device).
//
//   test_cuda_ops [--seed N] [--filter OP] [--no-flash] [--no-tensor-cores]
//
// --no-flash skips the DeepSeek V4 Flash shapes (several GiB of weights).
// --no-tensor-cores runs the batched matmuls on the FFMA tiles (then the
// batched and the one-token kernels must agree bitwise; with tensor cores, to
// k_thr_f32). scripts/gpu.sh check runs both.
// Thresholds and their reasons: ops_harness.h.
#include <chrono>
#include <cstdlib>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "ops_harness.h"

namespace dsv4::cudatest {

// ---------------------------------------------------------------------------
// Backend memory: zero-initialised allocations, write/read at offsets, fill, copy.
void cases_memory(Harness& h) {
  if (!h.want("memory")) return;
  Backend& g = h.gpu;
  Tensor a = g.alloc(GgmlType::F32, 1000, 3);
  Tensor b = g.alloc(GgmlType::I32, 77);
  std::vector<float> va(3000, 1.0f);
  std::vector<int32_t> vb(77, 5);
  g.read(a, va.data(), va.size() * 4);
  g.read(b, vb.data(), vb.size() * 4);
  bool zero = true;
  for (float v : va) zero &= v == 0.0f && !std::signbit(v);
  for (int32_t v : vb) zero &= v == 0;
  h.report.check("memory", "alloc F32[3,1000] + I32[77] zero-initialised", zero, zero ? "all zero" : "non-zero bytes");

  std::vector<float> src = random_normal(h.rng, 3000);
  g.write(a, src.data(), 400 * 4, 100 * 4);  // elements [100, 500)
  std::vector<float> back(3000);
  g.read(a, back.data(), back.size() * 4);
  bool ok = true;
  for (int i = 0; i < 3000; ++i) ok &= (i >= 100 && i < 500) ? back[i] == src[i - 100] : back[i] == 0.0f;
  std::vector<float> part(50);
  g.read(a, part.data(), 50 * 4, 120 * 4);
  for (int i = 0; i < 50; ++i) ok &= part[i] == src[20 + i];
  h.report.check("memory", "write/read at byte offsets", ok, ok ? "round trip exact" : "mismatch");

  g.fill(a, -3.25f);
  g.read(a, back.data(), back.size() * 4);
  ok = true;
  for (float v : back) ok &= v == -3.25f;
  h.report.check("memory", "fill F32[3,1000]", ok, ok ? "all -3.25" : "mismatch");

  Tensor c = g.alloc(GgmlType::F32, 1000, 3);
  g.write(a, src.data(), src.size() * 4);
  g.copy(c, a);
  g.read(c, back.data(), back.size() * 4);
  h.report.check("memory", "copy device to device", back == src, back == src ? "exact" : "mismatch");
  g.free(a);
  g.free(b);
  g.free(c);
  h.report.check("memory", "free", a.data == nullptr && b.data == nullptr, "pointers cleared");
}

// ---------------------------------------------------------------------------
namespace {

RopeParams rope_main() {
  RopeParams p;
  p.n_rot = 64;
  p.theta = 10000.0f;
  return p;
}
RopeParams rope_compress() {
  RopeParams p;
  p.n_rot = 64;
  p.theta = 160000.0f;
  p.yarn = true;
  p.factor = 16.0f;
  p.orig_ctx = 65536;
  p.beta_fast = 32.0f;
  p.beta_slow = 1.0f;
  return p;
}

// Rows with a wide spread of magnitudes, exact zeros, outliers and FP8/FP4 rounding ties.
std::vector<float> sim_rows(Rng& r, int64_t d, int64_t rows) {
  std::vector<float> v(static_cast<size_t>(d * rows));
  for (int64_t i = 0; i < rows; ++i) {
    float* x = v.data() + i * d;
    const int kind = static_cast<int>(i % 6);
    const float scale = std::ldexp(1.0f, static_cast<int>(r.below(40)) - 20);
    for (int64_t j = 0; j < d; ++j) x[j] = r.normal() * scale;
    if (kind == 1)
      for (int64_t j = 0; j < d; j += 3) x[j] = 0.0f;
    if (kind == 2) x[r.below(d)] *= 1000.0f;
    if (kind == 3)  // halfway cases: k/16 + 1/32 between e4m3 steps once scaled (ties to even)
      for (int64_t j = 0; j < d; ++j)
        x[j] = (static_cast<float>(r.below(64)) / 16.0f + 1.0f / 32.0f) * (j % 2 ? -1.0f : 1.0f);
    if (kind == 4)  // e2m1 ties: 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 times a power of two
      for (int64_t j = 0; j < d; ++j) {
        static const float ties[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
        x[j] = ties[r.below(7)] * (j % 3 ? 1.0f : -1.0f);
      }
    if (kind == 5)
      for (int64_t j = 0; j < d; ++j) x[j] = 0.0f;
  }
  return v;
}

}  // namespace

void cases_dense(Harness& h) {
  Rng& r = h.rng;
  if (h.want("rms_norm")) {
    struct C {
      int64_t d, rows;
      bool w, alias;
    };
    for (C c : {C{256, 1, true, false}, C{256, 37, true, false}, C{512, 64 * 3, false, true}, C{64, 5, true, true},
                C{4096, 7, true, false}, C{1024, 3, true, false}, C{1000, 2, true, false}, C{128, 9, true, true},
                C{2048, 4, false, false}}) {
      Bufs b(h);
      Pair x = b.f32(random_normal(r, static_cast<size_t>(c.d * c.rows), r.uniform(0.01f, 10.0f)), Shape(c.d, c.rows));
      Pair w = c.w ? b.weight_f32(random_normal(r, static_cast<size_t>(c.d)), Shape(c.d)) : Pair{};
      Pair out = c.alias ? x : b.out(GgmlType::F32, Shape(c.d, c.rows));
      h.cpu.rms_norm({.out = out.c, .x = x.c, .w = w.c, .eps = 1e-6f});
      h.gpu.rms_norm({.out = out.g, .x = x.g, .w = w.g, .eps = 1e-6f});
      h.report.nmse(
          "rms_norm",
          strfmt("[%lld,%lld]%s%s", (long long)c.rows, (long long)c.d, c.w ? " w" : "", c.alias ? " in-place" : ""),
          b.diff(out), k_thr_elem);
    }
  }
  if (h.want("rms_norm")) {
    // RmsNormOp with RoPE (the attention q and kv rows): vs the CPU (norm then
    // rope), and bitwise vs the separate CUDA norm and rope kernels.
    struct C {
      int64_t d, per_tok, n;
      bool w, compress;
    };
    for (C c :
         {C{512, 64, 3, false, true}, C{512, 1, 5, true, false}, C{128, 4, 7, true, true}, C{64, 2, 1, false, false}}) {
      Bufs b(h);
      const int64_t rows = c.per_tok * c.n;
      const std::vector<float> xv = random_normal(r, static_cast<size_t>(c.d * rows), r.uniform(0.01f, 10.0f));
      Pair x = b.f32(xv, Shape(c.d, rows));
      Pair sep = b.f32(xv, Shape(c.d, rows));
      Pair w = c.w ? b.weight_f32(random_normal(r, static_cast<size_t>(c.d)), Shape(c.d)) : Pair{};
      std::vector<int32_t> pos(static_cast<size_t>(c.n));
      for (int64_t i = 0; i < c.n; ++i) pos[i] = static_cast<int32_t>(r.below(1 << 20));
      Pair p = b.i32(pos, Shape(c.n));
      const RopeParams rp = c.compress ? rope_compress() : rope_main();
      h.cpu.rms_norm({.out = x.c,
                      .x = x.c,
                      .w = w.c,
                      .eps = 1e-6f,
                      .rope_pos = p.c,
                      .rope = rp,
                      .rope_rows_per_token = c.per_tok});
      h.gpu.rms_norm({.out = x.g,
                      .x = x.g,
                      .w = w.g,
                      .eps = 1e-6f,
                      .rope_pos = p.g,
                      .rope = rp,
                      .rope_rows_per_token = c.per_tok});
      const std::string s = strfmt("[%lld,%lld,%lld]%s + rope %s", (long long)c.n, (long long)c.per_tok, (long long)c.d,
                                   c.w ? " w" : "", c.compress ? "yarn" : "plain");
      h.report.nmse("rms_norm", s, b.diff(x), k_thr_elem);
      h.gpu.rms_norm({.out = sep.g, .x = sep.g, .w = w.g, .eps = 1e-6f});
      h.gpu.rope({.x = sep.g.reshape(c.d, c.per_tok, c.n), .pos = p.g, .rope = rp, .inverse = false});
      h.report.exact("rms_norm", s + " vs norm, rope kernels",
                     diff_f32(b.get_f32(x.g, h.gpu), b.get_f32(sep.g, h.gpu)));
    }
  }
  if (h.want("rms_norm")) {
    // RmsNormOp::quant (`fast` numerics' linear-layer inputs): against the CPU's norm + act_quant at
    // k_thr_sim (a value within f32 rounding of an int8 boundary may move one step), and bitwise against the
    // host quantiser applied to the GPU's own unquantised rows. INT8_32 inside the warp kernel (d <= 1024),
    // the block kernel's register path (d <= 16 x its threads), rows with a short last block, into q and in
    // place; longer rows, FP8_128 and RoPE + quant by the act_quant launch after the norm.
    const ActQuant I8 = ActQuant::INT8_32, FP8 = ActQuant::FP8_128;
    struct C {
      int64_t d, rows;
      ActQuant q;
      bool in_place, rope;
    };
    for (C c : {C{1024, 3, I8, true, false}, C{512, 9, I8, false, false}, C{100, 5, I8, false, false},
                C{4096, 2, I8, false, false}, C{4096, 1, I8, true, false}, C{1000, 3, I8, false, false},
                C{8192, 2, I8, false, false}, C{5000, 2, I8, true, false}, C{4096, 2, FP8, false, false},
                C{512, 4, I8, true, true}}) {
      Bufs b(h);
      const std::vector<float> xv = random_normal(r, static_cast<size_t>(c.d * c.rows), r.uniform(0.01f, 10.0f));
      Pair x = b.f32(xv, Shape(c.d, c.rows));
      Pair plain = b.f32(xv, Shape(c.d, c.rows));  // the GPU's unquantised norm, for the in-place cases
      Pair w = b.weight_f32(random_normal(r, static_cast<size_t>(c.d)), Shape(c.d));
      Pair out = c.in_place ? x : b.out(GgmlType::F32, Shape(c.d, c.rows));
      Pair q = c.in_place ? Pair{} : b.out(GgmlType::F32, Shape(c.d, c.rows));
      std::vector<int32_t> pos(static_cast<size_t>(c.rows));
      for (auto& p : pos) p = static_cast<int32_t>(r.below(1 << 20));
      Pair p = b.i32(pos, Shape(c.rows));
      auto op = [&](Tensor Pair::*side, Tensor o, Tensor in, ActQuant quant) {
        return RmsNormOp{.out = o,
                         .x = in,
                         .w = w.*side,
                         .eps = 1e-6f,
                         .rope_pos = c.rope ? p.*side : Tensor{},
                         .rope = rope_main(),
                         .quant = quant,
                         .q = quant == ActQuant::NONE ? Tensor{} : q.*side};
      };
      h.cpu.rms_norm(op(&Pair::c, out.c, x.c, c.q));
      h.gpu.rms_norm(op(&Pair::g, out.g, x.g, c.q));
      const std::string s = strfmt("[%lld,%lld] w %s%s%s", (long long)c.rows, (long long)c.d, act_quant_name(c.q),
                                   c.in_place ? " in place" : " into q", c.rope ? " + rope" : "");
      const Pair& res = c.in_place ? out : q;
      h.report.nmse("rms_norm", s, b.diff(res), k_thr_sim);
      if (!c.in_place) h.report.nmse("rms_norm", s + ": out unquantised", b.diff(out), k_thr_elem);
      if (c.in_place) h.gpu.rms_norm(op(&Pair::g, plain.g, plain.g, ActQuant::NONE));  // (x was overwritten)
      const std::vector<float> want = host_act_quant(b.get_f32(c.in_place ? plain.g : out.g, h.gpu), c.d, c.q);
      h.report.exact("rms_norm", s + " vs the GPU norm quantised", diff_f32(b.get_f32(res.g, h.gpu), want));
    }
  }
  if (h.want("rope")) {
    struct C {
      int64_t d, per_tok, n;
      bool compress, inverse, large_pos;
    };
    for (C c : {C{128, 4, 5, true, false, false}, C{128, 1, 9, false, false, true}, C{128, 4, 3, true, true, true},
                C{512, 64, 3, true, false, true}, C{512, 64, 2, false, true, false}, C{128, 64, 4, true, false, true},
                C{512, 1, 1, true, false, true}}) {
      Bufs b(h);
      Pair x = b.f32(random_normal(r, static_cast<size_t>(c.d * c.per_tok * c.n)), Shape(c.d, c.per_tok, c.n));
      std::vector<int32_t> pos(static_cast<size_t>(c.n));
      for (int64_t i = 0; i < c.n; ++i) pos[i] = static_cast<int32_t>(c.large_pos ? r.below(1 << 20) : i);
      Pair p = b.i32(pos, Shape(c.n));
      const RopeParams rp = c.compress ? rope_compress() : rope_main();
      h.cpu.rope({.x = x.c, .pos = p.c, .rope = rp, .inverse = c.inverse});
      h.gpu.rope({.x = x.g, .pos = p.g, .rope = rp, .inverse = c.inverse});
      h.report.nmse(
          "rope",
          strfmt("[%lld,%lld,%lld] %s%s%s", (long long)c.n, (long long)c.per_tok, (long long)c.d,
                 c.compress ? "yarn" : "plain", c.inverse ? " inverse" : "", c.large_pos ? " pos<2^20" : " pos 0.."),
          b.diff(x), k_thr_elem);
    }
  }
  if (h.want("quant_sim")) {
    struct C {
      KvQuantSim sim;
      int64_t d, rows;
      int n_quant;
    };
    for (C c : {C{KvQuantSim::FP8_BF16, 512, 24, 448}, C{KvQuantSim::FP8_BF16, 128, 33, 64},
                C{KvQuantSim::FP8_BF16, 160, 12, 96}, C{KvQuantSim::FP8_BF16, 512, 7, 512},
                C{KvQuantSim::HADAMARD_FP4, 128, 128, 0}, C{KvQuantSim::HADAMARD_FP4, 64, 12, 0},
                C{KvQuantSim::HADAMARD_FP4, 256, 18, 0}, C{KvQuantSim::HADAMARD_FP4, 512, 6, 0},
                C{KvQuantSim::HADAMARD_FP4, 1024, 3, 0}, C{KvQuantSim::HADAMARD_FP4, 32, 5, 0},
                C{KvQuantSim::HADAMARD_FP4, 2048, 2, 0}}) {
      Bufs b(h);
      Pair x = b.f32(sim_rows(r, c.d, c.rows), Shape(c.d, c.rows));
      h.cpu.quant_sim({x.c, c.sim, c.n_quant});
      h.gpu.quant_sim({x.g, c.sim, c.n_quant});
      h.report.exact("quant_sim",
                     strfmt("[%lld,%lld] %s n_quant %d", (long long)c.rows, (long long)c.d,
                            c.sim == KvQuantSim::FP8_BF16 ? "fp8+bf16" : "hadamard+fp4", c.n_quant),
                     b.diff(x));
    }
  }
  if (h.want("act_quant")) {
    // Both formats, rows with a short last block, in place and not; rows of sim_rows' kinds (magnitudes
    // 2^-20..2^20, zeros, one large value, e4m3 ties) plus int8 ties ((q + 1/2) s with s = 2^-3), NaN and Inf.
    struct C {
      ActQuant q;
      int64_t d, rows;
      bool in_place;
    };
    for (C c : {C{ActQuant::FP8_128, 4096, 24, false}, C{ActQuant::FP8_128, 300, 13, true},
                C{ActQuant::FP8_128, 2048, 7, true}, C{ActQuant::INT8_32, 4096, 24, true},
                C{ActQuant::INT8_32, 100, 13, false}, C{ActQuant::INT8_32, 1024, 9, false}}) {
      Bufs b(h);
      std::vector<float> v = sim_rows(r, c.d, c.rows);
      for (int64_t j = 0; j < c.d; ++j)  // row 0: int8 ties under s = 2^-3 (|x| up to 15.875)
        v[static_cast<size_t>(j)] = (static_cast<float>(r.below(240)) - 120.0f + 0.5f) * 0.125f;
      v[static_cast<size_t>(c.d + 3)] = NAN;            // row 1: NaN in its first block
      v[static_cast<size_t>(2 * c.d + 1)] = -INFINITY;  // row 2: its first block becomes NaN
      Pair x = b.f32(v, Shape(c.d, c.rows));
      Pair out = c.in_place ? x : b.out(GgmlType::F32, Shape(c.d, c.rows));
      h.cpu.act_quant({out.c, x.c, c.q});
      h.gpu.act_quant({out.g, x.g, c.q});
      h.report.exact("act_quant",
                     strfmt("[%lld,%lld] %s%s", (long long)c.rows, (long long)c.d, act_quant_name(c.q),
                            c.in_place ? " in place" : ""),
                     b.diff(out));
    }
  }
  if (h.want("store_rows")) {
    struct C {
      int64_t cap, d;
      std::vector<int32_t> pos;
      GgmlType type;
    };
    const GgmlType F32 = GgmlType::F32, FP8 = GgmlType::KV_FP8;
    for (const C& c : {C{136, 128, {135}, F32}, C{136, 128, {130, 131, 132, 133, 134, 135, 136, 137}, F32},
                       C{136, 128, {3, 139, 3 + 272, 7, 143}, F32}, C{640, 512, {1000, 1001, 1002}, F32},
                       C{192, 128, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21}, F32},
                       C{136, 128, {3, 139, 3 + 272, 7, 143}, FP8}, C{640, 512, {1000, 1001, 1002, 1640}, FP8}}) {
      Bufs b(h);
      const int64_t n = static_cast<int64_t>(c.pos.size());
      Pair ring = b.kv_rows(c.type, random_normal(r, static_cast<size_t>(c.cap * c.d)), Shape(c.d, c.cap));
      std::vector<float> v = random_normal(r, static_cast<size_t>(n * c.d));
      for (size_t i = 0; i < v.size(); i += 7) v[i] *= 1e4f;  // uneven blocks: the scales must follow
      Pair rows = b.f32(v, Shape(c.d, n));
      Pair p = b.i32(c.pos, Shape(n));
      h.cpu.store_rows({ring.c, rows.c, p.c});
      h.gpu.store_rows({ring.g, rows.g, p.g});
      h.report.exact("store_rows",
                     strfmt("ring[%lld,%lld] %s n=%lld from pos %d", (long long)c.cap, (long long)c.d,
                            ggml_type_name(c.type), (long long)n, c.pos[0]),
                     b.diff_bytes(ring));
    }
  }
  if (h.want("swiglu")) {
    for (int64_t n : {int64_t{256 * 3}, int64_t{2048 * 5 + 3}, int64_t{1}}) {
      Bufs b(h);
      Pair g = b.f32(random_normal(r, static_cast<size_t>(n), 8.0f), Shape(n));
      Pair u = b.f32(random_normal(r, static_cast<size_t>(n), 8.0f), Shape(n));
      Pair o = b.out(GgmlType::F32, Shape(n));
      h.cpu.swiglu({.out = o.c, .gate = g.c, .up = u.c, .clamp = 10.0f});
      h.gpu.swiglu({.out = o.g, .gate = g.g, .up = u.g, .clamp = 10.0f});
      h.report.nmse("swiglu", strfmt("[%lld] clamp 10", (long long)n), b.diff(o), k_thr_elem);
    }
    // SwigluOp::quant: INT8_32 in the kernel (rows of whole 32-value blocks: the shared expert's F = 2048),
    // rows with a short last block and FP8_128 by an act_quant launch after it; bitwise against the host
    // quantiser on the GPU's unquantised SwiGLU.
    struct Q {
      int64_t F, n;
      ActQuant q;
    };
    for (Q c : {Q{2048, 1, ActQuant::INT8_32}, Q{2048, 5, ActQuant::INT8_32}, Q{100, 3, ActQuant::INT8_32},
                Q{256, 2, ActQuant::FP8_128}}) {
      Bufs b(h);
      Pair g = b.f32(random_normal(r, static_cast<size_t>(c.F * c.n), 8.0f), Shape(c.F, c.n));
      Pair u = b.f32(random_normal(r, static_cast<size_t>(c.F * c.n), 8.0f), Shape(c.F, c.n));
      Pair o = b.out(GgmlType::F32, Shape(c.F, c.n)), plain = b.out(GgmlType::F32, Shape(c.F, c.n));
      h.cpu.swiglu({.out = o.c, .gate = g.c, .up = u.c, .clamp = 10.0f, .quant = c.q});
      h.gpu.swiglu({.out = o.g, .gate = g.g, .up = u.g, .clamp = 10.0f, .quant = c.q});
      h.gpu.swiglu({.out = plain.g, .gate = g.g, .up = u.g, .clamp = 10.0f});
      const std::string s = strfmt("[%lld,%lld] clamp 10 %s", (long long)c.n, (long long)c.F, act_quant_name(c.q));
      h.report.nmse("swiglu", s, b.diff(o), k_thr_sim);
      h.report.exact("swiglu", s + " vs the GPU SwiGLU quantised",
                     diff_f32(b.get_f32(o.g, h.gpu), host_act_quant(b.get_f32(plain.g, h.gpu), c.F, c.q)));
    }
  }
  if (h.want("add") || h.want("scale")) {
    for (int64_t n : {int64_t{4096}, int64_t{4096 * 3 + 17}}) {
      Bufs b(h);
      Pair o = b.f32(random_normal(r, static_cast<size_t>(n)), Shape(n));
      Pair x = b.f32(random_normal(r, static_cast<size_t>(n)), Shape(n));
      h.cpu.add({o.c, x.c});
      h.gpu.add({o.g, x.g});
      h.report.exact("add", strfmt("[%lld]", (long long)n), b.diff(o));
      h.cpu.scale({x.c, 0.0883883f});
      h.gpu.scale({x.g, 0.0883883f});
      h.report.exact("scale", strfmt("[%lld]", (long long)n), b.diff(x));
    }
  }
}

}  // namespace dsv4::cudatest

int main(int argc, char** argv) {
  using namespace dsv4;
  using namespace dsv4::cudatest;
  uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                  static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  bool flash = true, tensor_cores = true, cublas = true, int_dot = true, int8_tiles = true, gemm_cache = true,
       gather = true, eg_codes = true;
  std::string expert_gemm = "auto";
  std::string filter;
  float cpu_experts = 0.0f;
  int attn_terms = 3;
  const std::string usage =
      std::string("usage: ") + argv[0] +
      " [--seed N] [--filter OP] [--no-flash] [--no-tensor-cores] [--no-cublas] [--no-int-dot] [--no-int8-tiles] "
      "[--no-gemm-cache] "
      "[--expert-gemm auto|on|off|N] [--no-expert-gemm-codes] [--no-expert-gather] [--cpu-experts SHARE] "
      "[--fast-attention-terms N]\n"
      "  --no-cublas   batched matmuls on the tensor-core tile also at >= 128 tokens\n"
      "  --no-gemm-cache  the cuBLAS matmuls split their weights every call (no GemmWeightCache)\n"
      "  --no-int-dot  decode experts on the float matvec\n"
      "  --no-int8-tiles  tiles of int8-quantised x on f16 MMAs (x hi + lo) instead of int8 ones\n"
      "  --expert-gemm M  prefill experts with >= N assignments in a batch on the grouped wgmma GEMM:\n"
      "                 auto (default: N by weight type, 32 IQ2_XXS and Q4_K, else 64), on (every expert), off (the "
      "tile), or N\n"
      "  --no-expert-gemm-codes  the grouped GEMM's IQ2_XXS and Q2_K weights as f16 hi/lo splits, not integer codes\n"
      "  --no-expert-gather  experts placed in host memory read in place (not gathered into GPU memory)\n"
      "  --cpu-experts S  decode batches leave this share of their host experts to the CPU (default 0: none)\n"
      "  --fast-attention-terms N  bf16 terms of q and P in `fast` attention (1, 2 or 3, the default)\n";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--filter" && i + 1 < argc)
      filter = argv[++i];
    else if (a == "--no-flash")
      flash = false;
    else if (a == "--no-tensor-cores")
      tensor_cores = false;
    else if (a == "--no-cublas")
      cublas = false;
    else if (a == "--no-int-dot")
      int_dot = false;
    else if (a == "--no-int8-tiles")
      int8_tiles = false;
    else if (a == "--no-gemm-cache")
      gemm_cache = false;
    else if (a == "--no-expert-gather")
      gather = false;
    else if (a == "--cpu-experts" && i + 1 < argc)
      cpu_experts = std::strtof(argv[++i], nullptr);
    else if (a == "--expert-gemm" && i + 1 < argc)
      expert_gemm = argv[++i];
    else if (a == "--no-expert-gemm-codes")
      eg_codes = false;
    else if (a == "--fast-attention-terms" && i + 1 < argc)
      attn_terms = std::atoi(argv[++i]);
    else if (a == "--help") {
      std::printf("%s", usage.c_str());
      return 0;
    } else {
      std::fprintf(stderr, "%s", usage.c_str());
      return 2;
    }
  }
  std::printf("test_backend_ops: seed %llu (repeat with --seed %llu)%s%s%s%s\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed), flash ? "" : ", Flash shapes skipped",
              tensor_cores ? "" : ", FFMA tiles (--no-tensor-cores)", cublas ? "" : ", no cuBLAS (--no-cublas)",
              int_dot ? "" : ", float decode experts (--no-int-dot)");
  if (expert_gemm != "auto") std::printf("test_backend_ops: --expert-gemm %s\n", expert_gemm.c_str());
  if (!gemm_cache) std::printf("test_backend_ops: --no-gemm-cache\n");
  if (!int8_tiles) std::printf("test_backend_ops: --no-int8-tiles\n");
  if (!gather) std::printf("test_backend_ops: --no-expert-gather\n");
  if (!eg_codes) std::printf("test_backend_ops: --no-expert-gemm-codes\n");
  if (cpu_experts != 0.0f) std::printf("test_backend_ops: --cpu-experts %.2f\n", static_cast<double>(cpu_experts));
  if (attn_terms != 3) std::printf("test_backend_ops: --fast-attention-terms %d\n", attn_terms);
  if (!cuda_device_present()) {
    std::fprintf(stderr, "test_backend_ops: no CUDA device: nothing to test\n");
    return 77;
  }
  CudaBackendOptions gopt;
  gopt.tensor_cores = tensor_cores;
  gopt.cublas = cublas ? CublasMode::AUTO : CublasMode::OFF;
  gopt.int_dot = int_dot;
  gopt.int8_tiles = int8_tiles;
  // Every fused activation quantisation (the norms' too: not the engine's default), each checked bitwise
  // against the separate quantiser; the separate act_quant kernel has cases of its own.
  gopt.act_quant_fusion = ActQuantFusion::ALL;
  gopt.gemm_weight_cache = gemm_cache;
  gopt.expert_gather = gather;
  gopt.cpu_experts = cpu_experts;
  auto eg = parse_expert_gemm(expert_gemm);
  if (!eg) {
    std::fprintf(stderr, "test_backend_ops: --expert-gemm: %s\n", eg.error().message.c_str());
    return 2;
  }
  gopt.expert_gemm_min = *eg;
  gopt.expert_gemm_codes = eg_codes;
  gopt.fast_attention_terms = attn_terms;
  auto gpu = make_cuda_backend(0, gopt);
  if (!gpu) {
    std::fprintf(stderr, "test_backend_ops: %s\n", gpu.error().message.c_str());
    return 1;
  }
  auto cpu = make_cpu_backend(0);
  std::printf("cpu: %s\ngpu: %s\n", cpu->name().c_str(), (*gpu)->name().c_str());
  Harness h{*cpu, **gpu, Rng(seed), Report{}, flash, filter, tensor_cores, gather, cpu_experts, attn_terms};
  struct Group {
    const char* name;
    void (*fn)(Harness&);
  };
  const Group groups[] = {{"memory", cases_memory},       {"dense", cases_dense},       {"mhc", cases_mhc},
                          {"matmul", cases_matmul},       {"compress", cases_compress}, {"indexer", cases_indexer},
                          {"attention", cases_attention}, {"seqs", cases_seqs},         {"moe", cases_moe}};
  for (const Group& g : groups) {
    const auto t0 = std::chrono::steady_clock::now();
    g.fn(h);
    (*gpu)->synchronize();
    std::printf("-- %s: %.1f s\n", g.name,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  for (const auto& f : h.report.failures()) std::printf("FAILED: %s\n", f.c_str());
  std::printf("SUMMARY test_backend_ops: %d passed, %d failed (seed %llu)\n", h.report.passed(), h.report.failed(),
              static_cast<unsigned long long>(seed));
  return h.report.failed() == 0 ? 0 : 1;
}
