// Cases: embedding, mHC (hc_pre, hc_post (also y + y2), hc_head) and matmul (every weight
// type, grouped, batch invariance), tiny-model and Flash shapes.
#include "ops_harness.h"

namespace dsv4::cudatest {

namespace {

// hc_pre's tensors on both backends (xq, nq: the norm's quantised copy, optional) and the op over one side's
// (side: &Pair::c, the CPU's, or &Pair::g).
struct HcPreTensors {
  Pair u, post, comb, state, fn, scale, base, xn, nw, xq;
  ActQuant nq = ActQuant::NONE;
  HcPreOp op(Tensor Pair::*side) const {
    return {.u = u.*side,
            .post = post.*side,
            .comb = comb.*side,
            .state = state.*side,
            .fn = fn.*side,
            .scale = scale.*side,
            .base = base.*side,
            .norm_eps = 1e-6f,
            .hc_eps = 1e-6f,
            .sinkhorn_iters = 20,
            .norm_out = xn.*side,
            .norm_w = nw.*side,
            .norm_rms_eps = 1e-6f,
            .norm_q = xq.*side,
            .norm_quant = nq};
  }
};

}  // namespace

void cases_mhc(Harness& h) {
  Rng& r = h.rng;
  if (h.want("embed")) {
    struct C {
      GgmlType t;
      int64_t V, D, hc, n;
      bool flash;
    };
    for (C c : {C{GgmlType::F16, 512, 256, 4, 1, false}, C{GgmlType::F16, 512, 256, 4, 37, false},
                C{GgmlType::F32, 512, 256, 4, 8, false}, C{GgmlType::BF16, 300, 128, 1, 5, false},
                C{GgmlType::Q8_0, 100, 256, 2, 3, false}, C{GgmlType::F16, 129280, 4096, 4, 6, true},
                // The block-quantised decoders on the device, bit for bit (the matvec and FFMA tiles use them).
                C{GgmlType::IQ2_XXS, 64, 1024, 1, 5, false}, C{GgmlType::Q2_K, 64, 1024, 1, 5, false},
                C{GgmlType::Q4_K, 64, 512, 1, 3, false}}) {
      if (c.flash && !h.flash) continue;
      Bufs b(h);
      Pair table = b.random_weight(c.t, Shape(c.D, c.V));
      std::vector<int32_t> ids(static_cast<size_t>(c.n));
      for (auto& id : ids) id = static_cast<int32_t>(r.below(c.V));
      ids[0] = static_cast<int32_t>(c.V - 1);
      if (c.n > 1) ids[1] = 0;
      Pair id = b.i32(ids, Shape(c.n));
      Pair out = b.out(GgmlType::F32, Shape(c.D, c.hc, c.n));
      h.cpu.embed({out.c, table.c, id.c});
      h.gpu.embed({out.g, table.g, id.g});
      h.report.exact("embed",
                     strfmt("%s[%lld,%lld] -> [%lld,%lld,%lld]", ggml_type_name(c.t), (long long)c.V, (long long)c.D,
                            (long long)c.n, (long long)c.hc, (long long)c.D),
                     b.diff(out));
    }
  }
  struct C {
    int64_t D, hc, n;
    GgmlType fn;
    bool flash;
  };
  const C shapes[] = {{256, 4, 1, GgmlType::F16, false},  {256, 4, 5, GgmlType::F16, false},
                      {256, 4, 33, GgmlType::F32, false}, {128, 2, 3, GgmlType::BF16, false},
                      {4096, 4, 1, GgmlType::F16, true},  {4096, 4, 3, GgmlType::F16, true},
                      {4096, 4, 40, GgmlType::F16, true}};
  if (h.want("hc_pre")) {
    for (const C& c : shapes) {
      if (c.flash && !h.flash) continue;
      const int64_t mix = (2 + c.hc) * c.hc;
      Bufs b(h);
      Pair state = b.f32(random_normal(r, static_cast<size_t>(c.n * c.hc * c.D)), Shape(c.D, c.hc, c.n));
      Pair fn = b.random_weight(c.fn, Shape(c.hc * c.D, mix));
      Pair scale = b.weight_f32(random_uniform(r, 3, 0.5f, 2.0f), Shape(3));
      Pair base = b.weight_f32(random_normal(r, static_cast<size_t>(mix), 0.5f), Shape(mix));
      Pair u = b.out(GgmlType::F32, Shape(c.D, c.n));
      Pair post = b.out(GgmlType::F32, Shape(c.hc, c.n));
      Pair comb = b.out(GgmlType::F32, Shape(c.hc, c.hc, c.n));
      // With the fused input norm (as the model runs it): xn = RMSNorm(u; w).
      Pair xn = b.out(GgmlType::F32, Shape(c.D, c.n));
      Pair nw = b.weight_f32(random_uniform(r, static_cast<size_t>(c.D), 0.5f, 1.5f), Shape(c.D));
      // And its quantised copy (`fast` numerics): INT8_32 in the finalize's norm, FP8_128 (n = 5) by a
      // launch after it.
      Pair xq = b.out(GgmlType::F32, Shape(c.D, c.n));
      const ActQuant nq = c.n == 5 ? ActQuant::FP8_128 : ActQuant::INT8_32;
      const HcPreTensors tp{u, post, comb, state, fn, scale, base, xn, nw, xq, nq};
      h.cpu.hc_pre(tp.op(&Pair::c));
      h.gpu.hc_pre(tp.op(&Pair::g));
      const std::string s =
          strfmt("[%lld,%lld,%lld] fn %s", (long long)c.n, (long long)c.hc, (long long)c.D, ggml_type_name(c.fn));
      h.report.nmse("hc_pre u", s, b.diff(u), k_thr_f32);
      h.report.nmse("hc_pre post", s, b.diff(post), k_thr_f32);
      h.report.nmse("hc_pre comb", s, b.diff(comb), k_thr_f32);
      h.report.nmse("hc_pre norm", s, b.diff(xn), k_thr_f32);
      // A value within f32 rounding of a quantisation boundary may move one step against the CPU; the
      // quantiser itself is checked bitwise on the GPU's own norm.
      h.report.nmse("hc_pre norm", s + " " + act_quant_name(nq), b.diff(xq), k_thr_sim);
      h.report.exact("hc_pre norm", s + " " + act_quant_name(nq) + " vs the GPU norm quantised",
                     diff_f32(b.get_f32(xq.g, h.gpu), host_act_quant(b.get_f32(xn.g, h.gpu), c.D, nq)));
    }
  }
  if (h.want("hc_pre")) {
    // The mix partials' kernels by batch size (one token; tokens; lanes, from 128 tokens: cuda_mhc.cu) give
    // every token the same bits: a batch's rows equal each of its tokens' hc_pre alone (a partial last slice:
    // D = 200, hc = 4).
    const C inv[] = {{256, 4, 150, GgmlType::F16, false},
                     {128, 2, 131, GgmlType::BF16, false},
                     {200, 4, 129, GgmlType::F32, false},
                     {256, 4, 40, GgmlType::F16, false},
                     {4096, 4, 300, GgmlType::F16, true}};
    for (const C& c : inv) {
      if (c.flash && !h.flash) continue;
      const int64_t mix = (2 + c.hc) * c.hc, w = c.hc * c.D;
      Bufs b(h);
      const std::vector<float> sv = random_normal(r, static_cast<size_t>(c.n * w));
      Pair fn = b.random_weight(c.fn, Shape(w, mix));
      Pair scale = b.weight_f32(random_uniform(r, 3, 0.5f, 2.0f), Shape(3));
      Pair base = b.weight_f32(random_normal(r, static_cast<size_t>(mix), 0.5f), Shape(mix));
      Pair nw = b.weight_f32(random_uniform(r, static_cast<size_t>(c.D), 0.5f, 1.5f), Shape(c.D));
      // hc_pre of tokens [j0, j0 + n) on the GPU: u, post, comb, xn one after another.
      auto run = [&](int64_t j0, int64_t n) {
        Pair state = b.f32(std::vector<float>(sv.begin() + j0 * w, sv.begin() + (j0 + n) * w), Shape(c.D, c.hc, n));
        Pair u = b.out(GgmlType::F32, Shape(c.D, n)), post = b.out(GgmlType::F32, Shape(c.hc, n));
        Pair comb = b.out(GgmlType::F32, Shape(c.hc, c.hc, n)), xn = b.out(GgmlType::F32, Shape(c.D, n));
        h.gpu.hc_pre(HcPreTensors{u, post, comb, state, fn, scale, base, xn, nw}.op(&Pair::g));
        std::vector<float> all;
        for (const Pair* p : {&u, &post, &comb, &xn}) {
          const std::vector<float> v = b.get_f32(p->g, h.gpu);
          all.insert(all.end(), v.begin(), v.end());
        }
        return all;
      };
      const std::vector<float> batch = run(0, c.n);
      const int64_t per = c.D + c.hc + c.hc * c.hc + c.D;  // one token's values in run's order
      for (const int64_t j : {int64_t{0}, c.n / 2, c.n - 1}) {
        const std::vector<float> one = run(j, 1);
        std::vector<float> want;
        int64_t at = 0;
        for (const int64_t k : {c.D, c.hc, c.hc * c.hc, c.D}) {
          want.insert(want.end(), batch.begin() + at + j * k, batch.begin() + at + (j + 1) * k);
          at += c.n * k;
        }
        DSV4_ASSERT(static_cast<int64_t>(want.size()) == per, "hc_pre invariance: %zu values", want.size());
        h.report.exact("hc_pre batch == one token",
                       strfmt("[%lld of %lld,%lld,%lld] fn %s", (long long)j, (long long)c.n, (long long)c.hc,
                              (long long)c.D, ggml_type_name(c.fn)),
                       diff_f32(one, want));
      }
    }
  }
  if (h.want("hc_post")) {
    for (const C& c : shapes) {
      if (c.flash && !h.flash) continue;
      for (int mode = 0; mode < 3;
           ++mode) {  // 0 plain, 1 bf16 rounding, 2 with y2 (y + y2: the decode FFN's shared expert)
        const bool round = mode == 1, with_y2 = mode == 2;
        Bufs b(h);
        Pair state = b.f32(random_normal(r, static_cast<size_t>(c.n * c.hc * c.D)), Shape(c.D, c.hc, c.n));
        Pair y = b.f32(random_normal(r, static_cast<size_t>(c.n * c.D)), Shape(c.D, c.n));
        Pair post = b.f32(random_uniform(r, static_cast<size_t>(c.n * c.hc), 0.0f, 2.0f), Shape(c.hc, c.n));
        Pair comb =
            b.f32(random_uniform(r, static_cast<size_t>(c.n * c.hc * c.hc), 0.0f, 1.0f), Shape(c.hc, c.hc, c.n));
        Pair y2 = with_y2 ? b.f32(random_normal(r, static_cast<size_t>(c.n * c.D)), Shape(c.D, c.n)) : Pair{};
        h.cpu.hc_post({.state = state.c, .y = y.c, .post = post.c, .comb = comb.c, .round_bf16 = round, .y2 = y2.c});
        h.gpu.hc_post({.state = state.g, .y = y.g, .post = post.g, .comb = comb.g, .round_bf16 = round, .y2 = y2.g});
        h.report.exact("hc_post",
                       strfmt("[%lld,%lld,%lld]%s", (long long)c.n, (long long)c.hc, (long long)c.D,
                              round     ? " bf16"
                              : with_y2 ? " y+y2"
                                        : ""),
                       b.diff(state));
      }
    }
  }
  if (h.want("hc_head")) {
    for (const C& c : shapes) {
      if (c.flash && !h.flash) continue;
      Bufs b(h);
      Pair state = b.f32(random_normal(r, static_cast<size_t>(c.n * c.hc * c.D)), Shape(c.D, c.hc, c.n));
      Pair fn = b.random_weight(c.fn, Shape(c.hc * c.D, c.hc));
      Pair scale = b.weight_f32(random_uniform(r, 1, 0.5f, 2.0f), Shape(1));
      Pair base = b.weight_f32(random_normal(r, static_cast<size_t>(c.hc), 0.5f), Shape(c.hc));
      Pair out = b.out(GgmlType::F32, Shape(c.D, c.n));
      h.cpu.hc_head({.h = out.c,
                     .state = state.c,
                     .fn = fn.c,
                     .scale = scale.c,
                     .base = base.c,
                     .norm_eps = 1e-6f,
                     .hc_eps = 1e-6f});
      h.gpu.hc_head({.h = out.g,
                     .state = state.g,
                     .fn = fn.g,
                     .scale = scale.g,
                     .base = base.g,
                     .norm_eps = 1e-6f,
                     .hc_eps = 1e-6f});
      h.report.nmse(
          "hc_head",
          strfmt("[%lld,%lld,%lld] fn %s", (long long)c.n, (long long)c.hc, (long long)c.D, ggml_type_name(c.fn)),
          b.diff(out), k_thr_f32);
    }
  }
}

// Whether the token matvec takes a batch of n tokens of x rows of `cols` (cuda_matmul.cu, launch_matvec_tokens):
// the n padded x copies (units of U floats + 4) and, for Q8_0, the staged ring at 2 rows a warp within 227 KiB.
bool token_copies_fit(GgmlType t, int64_t cols, int64_t n) {
  const int64_t U = t == GgmlType::Q8_0 ? 32 : t == GgmlType::F32 ? 4 : 8;
  const int64_t ring = t == GgmlType::Q8_0 ? 8 * 2 * 2 * 32 * 34 : 0;
  return n * (cols / U) * (U + 4) * 4 + ring <= 227 * 1024;
}

void cases_matmul(Harness& h) {
  if (!h.want("matmul")) return;
  Rng& r = h.rng;
  using G = GgmlType;
  struct C {
    G t;
    int64_t rows, cols;
    int groups;
    std::vector<int64_t> ns;
    bool flash;
    const char* what;
    float xscale = 1.0f;           // x = xscale * N(0, 1)
    ActQuant xq = ActQuant::NONE;  // x quantised so (each row), and MatmulOp::x_quant says so
  };
  const std::vector<C> cases = {
      // tiny model shapes (D = 256, q_lora 64, H*hd = 512, o_groups 2 x 64, vocab 512)
      {G::Q8_0, 64, 256, 1, {1, 2, 9, 37}, false, "tiny attn_q_a"},
      {G::Q8_0, 512, 64, 1, {1, 8}, false, "tiny attn_q_b"},
      {G::Q8_0, 128, 256, 2, {1, 9}, false, "tiny attn_output_a (grouped)"},
      {G::Q8_0, 512, 256, 1, {1, 3, 16}, false, "tiny output head"},
      {G::F16, 256, 256, 1, {1, 5}, false, "tiny compressor kv"},
      {G::F16, 4, 256, 1, {1, 7}, false, "tiny indexer proj"},
      {G::F32, 24, 1024, 1, {1, 10}, false, "f32 rows"},
      {G::BF16, 100, 264, 1, {1, 9}, false, "bf16, rows % 8 != 0"},
      {G::IQ2_XXS, 256, 256, 1, {1, 9}, false, "iq2_xxs expert-like"},
      {G::Q2_K, 300, 768, 1, {1, 9}, false, "q2_k, 24 units < 32 lanes"},
      {G::Q4_K, 256, 512, 1, {1, 17}, false, "q4_k"},
      {G::Q4_K, 96, 256, 3, {2}, false, "q4_k grouped x3"},
      {G::F16, 33, 8, 1, {1, 4}, false, "one unit per row"},
      {G::MXFP4, 256, 512, 1, {1, 17}, false, "mxfp4 (staged matvec)"},
      {G::MXFP4, 300, 96, 1, {1, 2, 40, 70}, false, "mxfp4, 3 units per row: rows at every byte phase"},
      {G::MXFP4, 96, 256, 3, {1, 2}, false, "mxfp4 grouped x3"},
      {G::MXFP4, 256, 256, 1, {9, 40}, false, "mxfp4, |x| ~ 1e6", 1e6f},
      {G::MXFP4, 260, 2048, 1, {9, 16, 130}, false, "mxfp4, K slices; 130: no GEMM path for MXFP4"},
      // tensor-core tile edges: tokens per block 8/16/32 and their remainders, rows % 256 != 0,
      // chunks of 4 units cut short, x beyond the f16 range and far below it
      {G::Q8_0, 300, 96, 1, {2, 40, 70}, false, "q8_0, 3 units per row"},
      // the token matvec (2..4 tokens; Q8_0 rows of whole 8-unit chunks, F32/F16/BF16; x copies within
      // 227 KiB): bitwise the decode matvec per token; 1 or 2 rows per warp, x copied per token (past 113 KiB:
      // one block per SM) or (groups not aligned to blocks) read from global memory; 5+ tokens on the tiles
      {G::Q8_0, 1000, 512, 1, {2, 3, 4, 5}, false, "q8_0 token matvec, rows % 8 != 0"},
      {G::Q8_0, 4096, 256, 1, {3, 4}, false, "q8_0 token matvec, 2 rows per warp"},
      {G::Q8_0, 60, 256, 3, {2, 4}, false, "q8_0 grouped x3, 20 rows a group (token matvec, global x)"},
      {G::Q8_0, 256, 256, 1, {4}, false, "q8_0 token matvec, |x| ~ 1e30", 1e30f},
      {G::F32, 24, 1024, 1, {3}, false, "f32 token matvec"},
      {G::BF16, 100, 264, 1, {3, 4}, false, "bf16 token matvec, rows % 8 != 0"},
      {G::F16, 256, 512, 2, {3}, false, "f16 grouped x2 token matvec"},
      {G::F16, 2048, 1024, 1, {2, 4}, false, "f16 token matvec, 2 rows per warp"},
      {G::Q8_0, 256, 8192, 1, {3, 4}, false, "q8_0, 256 units, token matvec, one block per SM"},
      {G::Q8_0, 256, 16384, 1, {3, 4}, false, "q8_0, 512 units: x copies past 227 KiB, the tile"},
      {G::F32, 64, 8192, 1, {2, 4}, false, "f32, token matvec one block per SM (2), the tile (4)"},
      {G::BF16, 66, 16384, 1, {4}, false, "bf16, rows % 4 = 2: x copies past 227 KiB, the tile"},
      {G::IQ2_XXS, 512, 512, 1, {12, 33, 64}, false, "iq2_xxs, 16 units per row"},
      {G::Q2_K, 260, 256, 1, {16, 50}, false, "q2_k, rows % 256 = 4"},
      {G::Q4_K, 256, 768, 2, {23}, false, "q4_k grouped x2, 12 units"},
      {G::IQ2_XXS, 256, 256, 1, {9, 40}, false, "iq2_xxs, |x| ~ 1e6", 1e6f},
      {G::Q2_K, 256, 256, 1, {9, 40}, false, "q2_k, |x| ~ 1e-6", 1e-6f},
      {G::Q8_0, 64, 256, 1, {20}, false, "q8_0, |x| ~ 1e30", 1e30f},
      {G::F16, 300, 96, 1, {2, 40, 70}, false, "f16 on tensor cores, 3 units per row"},
      {G::F16, 256, 512, 2, {23}, false, "f16 grouped x2"},
      {G::F16, 64, 256, 1, {9, 20}, false, "f16, |x| ~ 1e-6", 1e-6f},
      // batches of >= 128 tokens: one cuBLAS GEMM on hi/lo splits when libcublas loads (cuda_gemm.cu),
      // else the tile again; K' = 3 cols, scales per row and per token
      {G::Q8_0, 64, 256, 1, {128, 130}, false, "q8_0, GEMM path"},
      {G::Q8_0, 128, 256, 2, {150}, false, "q8_0 grouped x2, GEMM path"},
      {G::IQ2_XXS, 256, 512, 1, {129}, false, "iq2_xxs, GEMM path"},
      {G::Q2_K, 260, 256, 1, {140}, false, "q2_k, rows % 8 = 4, GEMM path"},
      {G::Q4_K, 96, 256, 3, {128}, false, "q4_k grouped x3, GEMM path"},
      {G::F16, 300, 96, 1, {200}, false, "f16, GEMM path"},
      {G::Q8_0, 64, 256, 1, {130}, false, "q8_0, |x| ~ 1e30, GEMM path", 1e30f},
      {G::Q2_K, 256, 256, 1, {131}, false, "q2_k, |x| ~ 1e-6, GEMM path", 1e-6f},
      {G::IQ2_XXS, 256, 256, 1, {132}, false, "iq2_xxs, |x| ~ 1e6, GEMM path", 1e6f},
      {G::F16, 64, 256, 1, {133}, false, "f16, |x| ~ 1e-15, GEMM path", 1e-15f},
      {G::Q8_0, 66, 256, 1, {128}, false, "q8_0, rows % 4 = 2, GEMM path (scale-out 1 row per thread)"},
      {G::Q8_0, 64, 1024, 1, {130}, false, "q8_0, GEMM in 2 K slices"},
      {G::IQ2_XXS, 64, 4096, 1, {128}, false, "iq2_xxs, GEMM in 6 K slices"},
      // x from an activation quantiser (fast numerics): the GEMM drops the x_lo third (K' = 2 cols); a Q8_0
      // matvec of int8-32 x and >= 4096 rows runs as int8 dot products (tensor cores on; codes recovered from x
      // per unit: scales far from 1, rows in groups); the other paths read x as they always do
      {G::Q8_0, 64, 256, 1, {1, 9, 130}, false, "q8_0, x int8-32 (64 rows: float matvec)", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 4096, 256, 1, {1}, false, "q8_0, x int8-32 (int8 matvec)", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 4096, 256, 1, {1}, false, "q8_0, x int8-32 |x| ~ 1e-6", 1e-6f, ActQuant::INT8_32},
      {G::Q8_0, 4096, 256, 1, {1}, false, "q8_0, x int8-32 |x| ~ 1e6", 1e6f, ActQuant::INT8_32},
      {G::Q8_0, 8192, 512, 2, {1}, false, "q8_0 grouped x2, x int8-32 (a group per block)", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 300, 96, 1, {1}, false, "q8_0, x int8-32, rows not staged (float matvec)", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 64, 1024, 1, {130}, false, "q8_0, x int8-32, GEMM in K slices", 1.0f, ActQuant::INT8_32},
      {G::IQ2_XXS, 256, 512, 1, {129}, false, "iq2_xxs, x int8-32, GEMM path", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 128, 256, 2, {150}, false, "q8_0 grouped x2, x int8-32, GEMM path", 1.0f, ActQuant::INT8_32},
      {G::F16, 300, 96, 1, {200}, false, "f16, x fp8-128, GEMM path", 1.0f, ActQuant::FP8_128},
      // ... and the tiles (5 .. 127 tokens; >= 128 with --no-cublas) on int8 MMAs for Q8_0, IQ2_XXS, Q4_K, Q2_K
      // and MXFP4 (cuda_mma_i8.cuh: x's codes recovered per unit; K slices, groups, row remainders, scales far
      // from 1); F16 keeps the f16 tile
      {G::Q8_0, 300, 1024, 1, {5, 16, 40}, false, "q8_0, x int8-32, int8 tile in K slices", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 300, 96, 1, {9, 70}, false, "q8_0, x int8-32, int8 tile, 3 units per row", 1.0f, ActQuant::INT8_32},
      {G::IQ2_XXS, 512, 512, 1, {12, 33, 64}, false, "iq2_xxs, x int8-32, int8 tile", 1.0f, ActQuant::INT8_32},
      {G::Q2_K, 260, 256, 1, {16, 50}, false, "q2_k, x int8-32, int8 tile, rows % 256 = 4", 1.0f, ActQuant::INT8_32},
      {G::Q4_K, 256, 768, 2, {23}, false, "q4_k grouped x2, x int8-32, int8 tile", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 256, 1024, 2, {5}, false, "q8_0 grouped x2, x int8-32, int8 tile in K slices", 1.0f, ActQuant::INT8_32},
      {G::Q2_K, 256, 256, 1, {9, 40}, false, "q2_k, x int8-32 |x| ~ 1e-6, int8 tile", 1e-6f, ActQuant::INT8_32},
      {G::IQ2_XXS, 256, 256, 1, {9, 40}, false, "iq2_xxs, x int8-32 |x| ~ 1e6, int8 tile", 1e6f, ActQuant::INT8_32},
      {G::Q8_0, 64, 256, 1, {20}, false, "q8_0, x int8-32 |x| ~ 1e30, int8 tile", 1e30f, ActQuant::INT8_32},
      {G::MXFP4, 256, 512, 1, {17}, false, "mxfp4, x int8-32, int8 tile", 1.0f, ActQuant::INT8_32},
      {G::MXFP4,
       300,
       96,
       1,
       {9, 40},
       false,
       "mxfp4, x int8-32, int8 tile, rows at every byte phase",
       1.0f,
       ActQuant::INT8_32},
      {G::MXFP4, 96, 256, 3, {9}, false, "mxfp4 grouped x3, x int8-32, int8 tile", 1e6f, ActQuant::INT8_32},
      {G::F16, 64, 256, 1, {9}, false, "f16, x int8-32 (f16 tile)", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 64, 256, 1, {130}, false, "q8_0, x fp8-128 |x| ~ 1e6, GEMM path", 1e6f, ActQuant::FP8_128},
      // small batches on few row blocks: the tensor-core tile in K slices of whole 8-unit chunks
      {G::Q8_0, 300, 1024, 1, {3, 16, 32}, false, "q8_0, K slices"},
      {G::Q2_K, 260, 2048, 1, {9, 16}, false, "q2_k, K slices"},
      {G::Q8_0, 256, 1024, 2, {5}, false, "q8_0 grouped x2, K slices"},
      {G::IQ2_XXS, 256, 2304, 1, {7}, false, "iq2_xxs, 72 units in 9 K slices"},
      // DeepSeek V4 Flash shapes
      {G::Q8_0, 1024, 4096, 1, {1, 3, 8, 16, 32}, true, "flash attn_q_a"},
      {G::Q8_0, 32768, 1024, 1, {1, 2, 3, 4, 64}, true, "flash attn_q_b"},
      {G::Q8_0, 8192, 4096, 8, {1, 2, 16, 256}, true, "flash attn_output_a (8 groups)"},
      {G::Q8_0, 4096, 8192, 1, {1, 2, 3, 4, 16, 256}, true, "flash attn_output_b"},
      {G::Q8_0, 4096, 8192, 1, {1, 256}, true, "flash attn_output_b, x int8-32", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 32768, 1024, 1, {1}, true, "flash attn_q_b, x int8-32", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 4096, 2048, 1, {1}, true, "flash shared expert down, x int8-32", 1.0f, ActQuant::INT8_32},
      {G::Q8_0, 1024, 4096, 1, {8, 32}, true, "flash attn_q_a, x int8-32 (int8 tile)", 1.0f, ActQuant::INT8_32},
      {G::IQ2_XXS, 2048, 4096, 1, {3, 48}, true, "flash expert gate, x int8-32 (int8 tile)", 1.0f, ActQuant::INT8_32},
      {G::Q2_K, 4096, 2048, 1, {48}, true, "flash expert down, x int8-32 (int8 tile)", 1.0f, ActQuant::INT8_32},
      {G::MXFP4,
       2048,
       4096,
       1,
       {3, 48},
       true,
       "flash mxfp4 expert gate, x int8-32 (int8 tile)",
       1.0f,
       ActQuant::INT8_32},
      {G::Q8_0, 4096, 2048, 1, {1, 5, 16}, true, "flash shared expert down"},
      {G::Q8_0, 512, 4096, 1, {1, 16}, true, "flash attn_kv"},
      {G::Q8_0, 129280, 4096, 1, {1, 2}, true, "flash output head"},
      {G::F16, 1024, 4096, 1, {1, 3, 4, 9, 64}, true, "flash compressor kv"},
      {G::F16, 256, 4096, 1, {1, 4}, true, "flash router"},
      {G::IQ2_XXS, 2048, 4096, 1, {1, 3, 48}, true, "flash expert gate (one expert)"},
      {G::Q2_K, 4096, 2048, 1, {1, 3, 48}, true, "flash expert down (one expert)"},
      {G::Q4_K, 2048, 4096, 1, {1}, true, "flash q4 expert gate"},
      {G::MXFP4, 2048, 4096, 1, {1, 3, 48}, true, "flash mxfp4 expert gate (one expert)"},
      {G::MXFP4, 4096, 2048, 1, {1, 48}, true, "flash mxfp4 expert down (one expert)"},
  };
  for (const C& c : cases) {
    if (c.flash && !h.flash) continue;
    Bufs b(h);
    Pair w = b.random_weight(c.t, Shape(c.cols, c.rows));
    for (int64_t n : c.ns) {
      const int64_t xw = c.cols * c.groups;
      std::vector<float> xv = random_normal(r, static_cast<size_t>(n * xw));
      for (float& v : xv) v *= c.xscale;
      for (int64_t t = 0; t < n; ++t) act_quant_row(xv.data() + t * xw, xw, c.xq);
      Pair x = b.f32(xv, Shape(xw, n));
      Pair out = b.out(GgmlType::F32, Shape(c.rows, n));
      h.cpu.matmul({.out = out.c, .w = w.c, .x = x.c, .groups = c.groups, .x_quant = c.xq});
      h.gpu.matmul({.out = out.g, .w = w.g, .x = x.g, .groups = c.groups, .x_quant = c.xq});
      const std::string s =
          strfmt("%s [%lld,%lld]%s n=%lld (%s)", ggml_type_name(c.t), (long long)c.rows, (long long)c.cols,
                 c.groups > 1 ? strfmt(" G=%d", c.groups).c_str() : "", (long long)n, c.what);
      h.report.nmse("matmul", s, b.diff(out), k_thr_f32);
      if (c.rows * c.cols <= (int64_t{1} << 24)) {
        // accumulate: out += W x, vs the CPU and bitwise vs matmul then add on the GPU.
        const std::vector<float> base = random_normal(r, static_cast<size_t>(n * c.rows));
        Pair acc = b.f32(base, Shape(c.rows, n));
        Pair sum = b.f32(base, Shape(c.rows, n));
        h.cpu.matmul({.out = acc.c, .w = w.c, .x = x.c, .groups = c.groups, .accumulate = true, .x_quant = c.xq});
        h.gpu.matmul({.out = acc.g, .w = w.g, .x = x.g, .groups = c.groups, .accumulate = true, .x_quant = c.xq});
        h.report.nmse("matmul", s + " accumulate", b.diff(acc), k_thr_f32);
        h.gpu.add({sum.g, out.g});
        h.report.exact("matmul", s + " accumulate vs matmul, add",
                       diff_f32(b.get_f32(acc.g, h.gpu), b.get_f32(sum.g, h.gpu)));
      }
      if (n > 1) {
        // Batch invariance: each token alone (the decode kernel) vs the batched kernel; bitwise on the
        // token matvec whatever the tensor-core switch says.
        Pair one = b.out(GgmlType::F32, Shape(c.rows, n));
        for (int64_t t = 0; t < n; ++t)
          h.gpu.matmul({.out = one.g.rows(t, 1), .w = w.g, .x = x.g.rows(t, 1), .groups = c.groups, .x_quant = c.xq});
        const Diff d = diff_f32(b.get_f32(one.g, h.gpu), b.get_f32(out.g, h.gpu));
        const bool token_matvec =
            n <= 4 && c.xq == ActQuant::NONE &&
            ((c.t == G::Q8_0 && c.cols % 256 == 0) || c.t == G::F32 || c.t == G::F16 || c.t == G::BF16) &&
            token_copies_fit(c.t, c.cols, n);
        if (token_matvec)
          h.report.exact("matmul n vs 1", s + " token matvec", d);
        else
          report_batch_invariance(h, "matmul n vs 1", s, d);
      }
    }
  }

  // MatmulOp::x_quantise (wo_b's input in fast numerics): W act_quant(x), x quantised by the int8 matvec while
  // staged (one token, Q8_0, >= 4,096 rows) or in place by an act_quant launch first (every other path).
  // Against the CPU (which quantises in place) at k_thr_f32, and bitwise against the GPU matmul of the
  // host-quantised x under the x_quant promise (the int8 kernel's codes and scales are then the same).
  {
    struct Q {
      int64_t rows, cols;
      int groups;
      int64_t n;
      bool flash;
      const char* what;
      float xscale;
    };
    for (const Q& c : {Q{4096, 256, 1, 1, false, "int8 matvec, quantised while staged", 1.0f},
                       Q{4096, 256, 1, 1, false, "int8 matvec, |x| ~ 1e-6 (the 1e-4 floor)", 1e-6f},
                       Q{4096, 256, 1, 1, false, "int8 matvec, |x| ~ 1e30", 1e30f},
                       Q{8192, 512, 2, 1, false, "int8 matvec grouped x2", 1.0f},
                       Q{64, 256, 1, 1, false, "float matvec: quantised in place first", 1.0f},
                       Q{4096, 256, 1, 3, false, "token matvec: quantised in place first", 1.0f},
                       Q{64, 256, 1, 130, false, "GEMM path: quantised in place first", 1.0f},
                       Q{4096, 8192, 1, 1, true, "flash attn_output_b", 1.0f},
                       Q{4096, 8192, 1, 2, true, "flash attn_output_b", 1.0f}}) {
      if (c.flash && !h.flash) continue;
      Bufs b(h);
      Pair w = b.random_weight(G::Q8_0, Shape(c.cols, c.rows));
      const int64_t xw = c.cols * c.groups;
      std::vector<float> xv = random_normal(r, static_cast<size_t>(c.n * xw));
      for (float& v : xv) v *= c.xscale;
      Pair x = b.f32(xv, Shape(xw, c.n));
      Pair xq = b.f32(host_act_quant(xv, xw, ActQuant::INT8_32), Shape(xw, c.n));
      Pair out = b.out(GgmlType::F32, Shape(c.rows, c.n)), want = b.out(GgmlType::F32, Shape(c.rows, c.n));
      h.cpu.matmul({.out = out.c, .w = w.c, .x = x.c, .groups = c.groups, .x_quantise = ActQuant::INT8_32});
      h.gpu.matmul({.out = out.g, .w = w.g, .x = x.g, .groups = c.groups, .x_quantise = ActQuant::INT8_32});
      h.gpu.matmul({.out = want.g, .w = w.g, .x = xq.g, .groups = c.groups, .x_quant = ActQuant::INT8_32});
      const std::string s =
          strfmt("Q8_0 [%lld,%lld]%s n=%lld x_quantise int8-32 (%s)", (long long)c.rows, (long long)c.cols,
                 c.groups > 1 ? strfmt(" G=%d", c.groups).c_str() : "", (long long)c.n, c.what);
      h.report.nmse("matmul", s, b.diff(out), k_thr_f32);
      h.report.exact("matmul", s + " vs x quantised first",
                     diff_f32(b.get_f32(out.g, h.gpu), b.get_f32(want.g, h.gpu)));
    }
  }

  // x with units of very different ranges in a batch of 130 tokens (the GEMM path scales per token, not
  // per unit: one 1e4 among values ~1e-3, and zero units).
  {
    Bufs b(h);
    const int64_t rows = 64, cols = 2048, n = 130;
    Pair w = b.random_weight(G::Q8_0, Shape(cols, rows));
    const float unit_scales[] = {1.0f, 0.0f, 1e-3f, 1.0f, 30.0f, 1.0f, 1.0f, 0.25f};
    std::vector<float> xv = random_normal(r, static_cast<size_t>(cols * n));
    for (size_t i = 0; i < xv.size(); ++i) {
      const size_t unit = (i % cols) / 32;
      if (unit % 8 == 6 && i % 32 == 5)
        xv[i] = 1e4f;
      else
        xv[i] *= unit_scales[unit % 8];
    }
    Pair x = b.f32(xv, Shape(cols, n));
    Pair out = b.out(GgmlType::F32, Shape(rows, n));
    h.cpu.matmul({out.c, w.c, x.c});
    h.gpu.matmul({out.g, w.g, x.g});
    h.report.nmse("matmul", "Q8_0 [64,2048] n=130 (x mixed unit ranges)", b.diff(out), k_thr_f32);
  }

  // MatmulsOp: several matrices of one x (one kernel for a token when they share type and width):
  // vs the CPU, and bitwise vs one MatmulOp each on the GPU.
  struct M {
    std::vector<std::pair<G, int64_t>> mats;  // (type, rows)
    int64_t cols;
    std::vector<int64_t> ns;
    bool flash;
    const char* what;
    ActQuant xq = ActQuant::NONE;
  };
  const std::vector<M> sets = {
      // (n >= 128: the cuBLAS path with x split once for all matrices, cuda_gemm.cu)
      {{{G::F16, 64}, {G::F16, 8}, {G::F16, 24}}, 256, {1, 3, 129}, false, "tiny f16 x3"},
      {{{G::Q8_0, 64}, {G::Q8_0, 32}}, 256, {1, 2, 3, 4, 130}, false, "tiny q8_0 x2"},
      {{{G::Q8_0, 64}, {G::Q8_0, 32}}, 256, {1, 130}, false, "tiny q8_0 x2, x int8-32", ActQuant::INT8_32},
      {{{G::Q8_0, 4096}, {G::Q8_0, 512}}, 256, {1}, false, "q8_0 x2, x int8-32 (int8 matvec)", ActQuant::INT8_32},
      {{{G::Q8_0, 64}, {G::F16, 32}, {G::Q8_0, 16}}, 256, {1, 140}, false, "mixed types (separate launches)"},
      {{{G::Q8_0, 1024}, {G::Q8_0, 512}}, 4096, {1, 2, 256}, true, "flash wq_a + wkv"},
      {{{G::Q8_0, 1024}, {G::Q8_0, 512}}, 4096, {1}, true, "flash wq_a + wkv, x int8-32", ActQuant::INT8_32},
      {{{G::F16, 1024}, {G::F16, 1024}, {G::F16, 64}, {G::F16, 256}, {G::F16, 256}},
       4096,
       {1, 3, 4},
       true,
       "flash compressors + indexer"},
      {{{G::Q8_0, 2048}, {G::Q8_0, 2048}}, 4096, {1, 3, 4}, true, "flash shared expert gate + up"},
  };
  for (const M& m : sets) {
    if (m.flash && !h.flash) continue;
    Bufs b(h);
    std::vector<Pair> ws;
    for (const auto& [t, rows] : m.mats) ws.push_back(b.random_weight(t, Shape(m.cols, rows)));
    for (int64_t n : m.ns) {
      std::vector<float> xv = random_normal(r, static_cast<size_t>(n * m.cols));
      for (int64_t t = 0; t < n; ++t) act_quant_row(xv.data() + t * m.cols, m.cols, m.xq);
      Pair x = b.f32(xv, Shape(m.cols, n));
      MatmulsOp oc, og;
      oc.x = x.c;
      og.x = x.g;
      oc.x_quant = og.x_quant = m.xq;
      std::vector<Pair> outs, sep;
      for (size_t i = 0; i < ws.size(); ++i) {
        outs.push_back(b.out(GgmlType::F32, Shape(m.mats[i].second, n)));
        sep.push_back(b.out(GgmlType::F32, Shape(m.mats[i].second, n)));
        oc.w[i] = ws[i].c;
        og.w[i] = ws[i].g;
        oc.out[i] = outs[i].c;
        og.out[i] = outs[i].g;
      }
      oc.count = og.count = static_cast<int>(ws.size());
      h.cpu.matmuls(oc);
      h.gpu.matmuls(og);
      for (size_t i = 0; i < ws.size(); ++i) {
        const std::string s = strfmt("%s [%lld,%lld] of %zu n=%lld (%s)", ggml_type_name(m.mats[i].first),
                                     (long long)m.mats[i].second, (long long)m.cols, ws.size(), (long long)n, m.what);
        h.report.nmse("matmuls", s, b.diff(outs[i]), k_thr_f32);
        h.gpu.matmul({.out = sep[i].g, .w = ws[i].g, .x = x.g, .x_quant = m.xq});
        const Diff d = diff_f32(b.get_f32(outs[i].g, h.gpu), b.get_f32(sep[i].g, h.gpu));
        // (With int8 x a set of >= 4,096 rows in all runs on the int8 matvec, a smaller matrix alone on the
        // float one: f32 agreement, not bitwise.)
        if (m.xq == ActQuant::NONE)
          h.report.exact("matmuls", s + " vs one matmul", d);
        else
          h.report.nmse("matmuls", s + " vs one matmul", d, k_thr_f32);
      }
    }
  }
}

}  // namespace dsv4::cudatest
