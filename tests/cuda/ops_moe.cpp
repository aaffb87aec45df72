// Cases: MoE router (hash and biased top-k, ties) and routed experts (every
// expert weight type, accumulate, batch invariance — n >= 16 takes the
// expert-grouped path: tiles of 16 (32 from 32 assignments per expert on
// average) on tensor cores when gate, up and down are all block-quantised,
// else 8 — vs n = 1), tiny and Flash shapes; the same experts placed partly
// (every third) or wholly in host memory (MoeExpertsOp::slots), bitwise the
// all-resident results on the CPU and on every decode path.
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>

#include <unistd.h>

#include "ops_harness.h"

namespace dsv4::cudatest {

namespace {
// Host bytes that the backends read in place (Backend::map_host_weight), in pages of their own (the CUDA
// backend registers whole pages, read-only: no other buffer may share them) that live as long as the
// process (registered until the backend ends).
const uint8_t* keep_host(const std::vector<uint8_t>& bytes) {
  static std::deque<std::unique_ptr<uint8_t, decltype(&std::free)>> kept;
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = (bytes.size() + page - 1) / page * page;
  kept.emplace_back(static_cast<uint8_t*>(std::aligned_alloc(page, size)), &std::free);
  std::memcpy(kept.back().get(), bytes.data(), bytes.size());
  return kept.back().get();
}
}  // namespace

void cases_moe(Harness& h) {
  Rng& r = h.rng;
  if (h.want("moe_route")) {
    struct C {
      int64_t E, k, n, V;
      bool hash, ties, normalize;
      float alpha;
      bool flash;
    };
    const std::vector<C> cases = {
        {8, 2, 7, 512, false, false, true, 1.5f, false},     {8, 2, 9, 512, true, false, true, 1.5f, false},
        {8, 2, 12, 512, false, true, true, 1.5f, false},     {16, 4, 5, 512, false, false, false, 2.5f, false},
        {256, 6, 5, 129280, false, false, true, 1.5f, true}, {256, 6, 64, 129280, false, true, true, 1.5f, true},
        {256, 6, 5, 129280, true, false, true, 1.5f, true},  {300, 8, 3, 512, false, false, true, 1.0f, false},
        {300, 8, 4, 512, false, true, true, 1.0f, false},
    };
    for (const C& c : cases) {
      if (c.flash && !h.flash) continue;
      Bufs b(h);
      std::vector<float> z = random_normal(r, static_cast<size_t>(c.n * c.E), 2.0f);
      if (c.ties)
        for (auto& v : z) v = static_cast<float>(r.below(4)) - 1.5f;  // few distinct scores: ties everywhere
      Pair logits = b.f32(z, Shape(c.E, c.n));
      Pair bias = c.hash ? Pair{}
                         : b.weight_f32(c.ties ? std::vector<float>(static_cast<size_t>(c.E), 0.0f)
                                               : random_normal(r, static_cast<size_t>(c.E), 0.1f),
                                        Shape(c.E));
      Pair table{}, ids{};
      if (c.hash) {
        std::vector<int32_t> t(static_cast<size_t>(c.V * c.k));
        for (auto& v : t) v = static_cast<int32_t>(r.below(c.E));
        std::vector<uint8_t> bytes(t.size() * 4);
        std::memcpy(bytes.data(), t.data(), bytes.size());
        table = b.weight(GgmlType::I32, std::move(bytes), Shape(c.k, c.V));
        std::vector<int32_t> id(static_cast<size_t>(c.n));
        for (auto& v : id) v = static_cast<int32_t>(r.below(c.V));
        id[0] = static_cast<int32_t>(c.V - 1);
        ids = b.i32(id, Shape(c.n));
      }
      Pair ex = b.out(GgmlType::I32, Shape(c.k, c.n));
      Pair wt = b.out(GgmlType::F32, Shape(c.k, c.n));
      h.cpu.moe_route({.experts = ex.c,
                       .weights = wt.c,
                       .logits = logits.c,
                       .bias = bias.c,
                       .hash = table.c,
                       .ids = ids.c,
                       .alpha = c.alpha,
                       .normalize = c.normalize});
      h.gpu.moe_route({.experts = ex.g,
                       .weights = wt.g,
                       .logits = logits.g,
                       .bias = bias.g,
                       .hash = table.g,
                       .ids = ids.g,
                       .alpha = c.alpha,
                       .normalize = c.normalize});
      const std::string s =
          strfmt("E=%lld k=%lld n=%lld %s%s%s", (long long)c.E, (long long)c.k, (long long)c.n,
                 c.hash ? "hash" : "biased top-k", c.ties ? " ties" : "", c.normalize ? "" : " unnormalised");
      h.report.exact("moe_route ids", s, b.diff_ids(ex));
      h.report.nmse("moe_route w", s, b.diff(wt), k_thr_elem);
    }
  }
  if (h.want("moe_experts")) {
    using G = GgmlType;
    struct C {
      G gate_up, down;
      int64_t E, F, D, k;
      std::vector<int64_t> ns;
      bool flash;
      int64_t hot = 0;  // tokens 1..hot route their first slot to expert 1 (a skewed batch)
    };
    const std::vector<C> cases = {
        {G::IQ2_XXS, G::Q2_K, 8, 256, 256, 2, {1, 5, 40, 160}, false},  // 160: 40 per expert, tensor-core tiles of 32
        {G::Q4_K, G::Q4_K, 8, 256, 256, 2, {1, 3, 24}, false},
        // MXFP4 (17-byte blocks): rows of 256 (unstaged decode, tiles of 16 and 32) and 1,024 / 512 (staged).
        {G::MXFP4, G::MXFP4, 8, 256, 256, 2, {1, 3, 24, 160}, false},
        {G::MXFP4, G::MXFP4, 8, 512, 1024, 2, {1, 2, 300}, false},
        {G::Q8_0, G::F16, 8, 256, 256, 2, {20}, false},  // mixed: tensor-core gate/up in tiles of 8, FFMA down
        {G::Q8_0, G::Q8_0, 8, 256, 256, 2, {4, 33}, false},
        {G::F16, G::F16, 4, 64, 128, 3, {1, 2, 17}, false},
        {G::F32, G::BF16, 4, 64, 128, 2, {3}, false},
        // Mid-size rows (1,024 and 4,096 elements) at decode batch sizes.
        {G::IQ2_XXS, G::Q2_K, 8, 1024, 4096, 2, {1, 3}, false},
        {G::Q8_0, G::Q4_K, 8, 1024, 1024, 2, {1, 2}, false},
        // Gate/up rows of 12 chunks of 1,024 columns (the decode kernel's K split: 8 warps, some with two chunks).
        {G::IQ2_XXS, G::Q2_K, 2, 1024, 12288, 1, {1, 2}, false},
        // More than 64 assignments per expert (the grouped GEMM also under --expert-gemm auto): ~150 per expert
        // (a tile of 128; the tail of ~22 on the tile, or with --expert-gemm on a wgmma of width 32) and ~75
        // (one tile of width 96).
        {G::IQ2_XXS, G::Q2_K, 8, 256, 256, 2, {600}, false},
        {G::Q8_0, G::Q4_K, 8, 256, 256, 2, {300}, false},
        // One hot expert (~240 assignments: a full tile of 128 and a partial one of >= 64 on the grouped GEMM under
        // --expert-gemm auto, the other experts' ~50 on the tile in the same batch).
        {G::IQ2_XXS, G::Q2_K, 8, 256, 256, 2, {300}, false, 230},
        // Row counts that are not whole 128-row blocks of the grouped GEMM (192 gate/up rows, 320 down rows).
        {G::Q8_0, G::Q8_0, 8, 192, 320, 2, {300}, false},
        {G::IQ2_XXS, G::Q2_K, 4, 2048, 4096, 6, {100}, true},
        {G::IQ2_XXS, G::Q2_K, 256, 2048, 4096, 6, {1, 3, 64}, true},
        {G::Q4_K, G::Q4_K, 256, 2048, 4096, 6, {1}, true},
        {G::MXFP4, G::MXFP4, 256, 2048, 4096, 6, {1, 3, 64}, true},
    };
    for (const C& c : cases) {
      if (c.flash && !h.flash) continue;
      Bufs b(h);
      Pair gate = b.random_weight(c.gate_up, Shape(c.D, c.F, c.E));
      Pair up = b.random_weight(c.gate_up, Shape(c.D, c.F, c.E));
      Pair down = b.random_weight(c.down, Shape(c.F, c.D, c.E));
      for (int64_t n : c.ns) {
        for (bool accumulate : {false, true}) {
          Pair x = b.f32(random_normal(r, static_cast<size_t>(n * c.D)), Shape(c.D, n));
          std::vector<int32_t> e(static_cast<size_t>(n * c.k));
          for (auto& v : e) v = static_cast<int32_t>(r.below(c.E));
          e[0] = static_cast<int32_t>(c.E - 1);
          if (e.size() > 1) e[1] = 0;
          for (int64_t t = 1; t <= c.hot && t < n; ++t) {
            e[static_cast<size_t>(t * c.k)] = 1;
            for (int64_t j = 1; j < c.k; ++j)  // no token lists an expert twice
              if (e[static_cast<size_t>(t * c.k + j)] == 1) e[static_cast<size_t>(t * c.k + j)] = 2;
          }
          Pair ex = b.i32(e, Shape(c.k, n));
          Pair wt = b.f32(random_uniform(r, static_cast<size_t>(n * c.k), 0.1f, 1.0f), Shape(c.k, n));
          Pair out = accumulate ? b.f32(random_normal(r, static_cast<size_t>(n * c.D)), Shape(c.D, n))
                                : b.out(GgmlType::F32, Shape(c.D, n));
          h.cpu.moe_experts({.out = out.c,
                             .x = x.c,
                             .gate = gate.c,
                             .up = up.c,
                             .down = down.c,
                             .experts = ex.c,
                             .weights = wt.c,
                             .clamp = 10.0f,
                             .accumulate = accumulate});
          h.gpu.moe_experts({.out = out.g,
                             .x = x.g,
                             .gate = gate.g,
                             .up = up.g,
                             .down = down.g,
                             .experts = ex.g,
                             .weights = wt.g,
                             .clamp = 10.0f,
                             .accumulate = accumulate});
          const std::string s =
              strfmt("%s/%s E=%lld F=%lld D=%lld k=%lld n=%lld%s%s", ggml_type_name(c.gate_up), ggml_type_name(c.down),
                     (long long)c.E, (long long)c.F, (long long)c.D, (long long)c.k, (long long)n,
                     c.hot > 0 ? " skewed" : "", accumulate ? " accumulate" : "");
          h.report.nmse("moe_experts", s, b.diff(out), k_thr_f32);
          if (!accumulate && (!c.flash || c.E <= 4)) {
            // The same experts placed partly in host memory (MoeExpertsOp::slots): every third expert
            // resident, the others in registered host memory (gathered into GPU memory by the op, or read in
            // place with --no-expert-gather); or none resident.
            for (int every : {3, 0}) {
              std::vector<int32_t> slot(static_cast<size_t>(c.E), -1);
              int32_t n_dev = 0;
              for (int64_t ex_i = 0; ex_i < c.E; ++ex_i)
                if (every > 0 && ex_i % every == 0) slot[static_cast<size_t>(ex_i)] = n_dev++;
              auto place = [&](const Pair& w, GgmlType type, int64_t rows, int64_t cols, Pair& dev) {
                const uint8_t* bytes = keep_host(b.get_bytes(w.c, h.cpu));
                const int64_t ne_host[4] = {cols, rows, c.E, 1};
                Pair host{*h.cpu.map_host_weight(bytes, type, ne_host), *h.gpu.map_host_weight(bytes, type, ne_host)};
                dev = n_dev > 0 ? b.alloc(type, Shape(cols, rows, n_dev)) : Pair{};
                if (n_dev == 0) dev.c.type = dev.g.type = type;
                const size_t eb = static_cast<size_t>(rows) * ggml_row_bytes(type, static_cast<uint64_t>(cols));
                for (int64_t ex_i = 0; ex_i < c.E; ++ex_i)
                  if (slot[static_cast<size_t>(ex_i)] >= 0) {
                    const size_t at = static_cast<size_t>(slot[static_cast<size_t>(ex_i)]) * eb;
                    h.cpu.write(dev.c, bytes + ex_i * eb, eb, at);
                    h.gpu.write(dev.g, bytes + ex_i * eb, eb, at);
                  }
                return host;
              };
              Pair gd, ud, dd;
              const Pair gh = place(gate, c.gate_up, c.F, c.D, gd), uh = place(up, c.gate_up, c.F, c.D, ud),
                         dh = place(down, c.down, c.D, c.F, dd);
              Pair sl = b.i32(slot, Shape(c.E));
              Pair placed = b.out(GgmlType::F32, Shape(c.D, n)), placed_cpu = b.out(GgmlType::F32, Shape(c.D, n));
              MoeExpertsOp o{.x = x.g, .experts = ex.g, .weights = wt.g, .clamp = 10.0f};
              o.out = placed.g, o.gate = gd.g, o.up = ud.g, o.down = dd.g;
              o.slots = sl.g, o.gate_host = gh.g, o.up_host = uh.g, o.down_host = dh.g;
              h.gpu.moe_experts(o);
              o.out = placed_cpu.c, o.x = x.c, o.experts = ex.c, o.weights = wt.c, o.gate = gd.c, o.up = ud.c;
              o.down = dd.c, o.slots = sl.c, o.gate_host = gh.c, o.up_host = uh.c, o.down_host = dh.c;
              h.cpu.moe_experts(o);
              const std::string sp = s + strfmt(" placed: %d of %lld resident", n_dev, (long long)c.E);
              h.report.exact("moe_experts placed (cpu) == all resident (cpu)", sp,
                             diff_f32(b.get_f32(placed_cpu.c, h.cpu), b.get_f32(out.c, h.cpu)));
              // Bitwise the all-resident run: gathered experts run the same kernels on the same bytes. Read in
              // place, the grouped GEMM (>= 64 assignments of an expert) gives way to the tiles: then the CPU's
              // tolerance.
              // With a CPU share (decode batches of <= 16 tokens, gathered), the host's rows come from 8-bit
              // activations: the host tolerance against the CPU reference.
              if (h.expert_gather && h.cpu_experts != 0.0f && n <= 16)
                h.report.nmse("moe_experts placed, host share", sp,
                              diff_f32(b.get_f32(placed.g, h.gpu), b.get_f32(out.c, h.cpu)), k_thr_host_experts);
              else if (h.expert_gather || n * c.k < 64)
                h.report.exact("moe_experts placed == all resident", sp,
                               diff_f32(b.get_f32(placed.g, h.gpu), b.get_f32(out.g, h.gpu)));
              else
                h.report.nmse("moe_experts placed", sp, diff_f32(b.get_f32(placed.g, h.gpu), b.get_f32(out.c, h.cpu)),
                              k_thr_f32);
            }
          }
          if (n > 1 && !accumulate) {
            Pair one = b.out(GgmlType::F32, Shape(c.D, n));
            for (int64_t t = 0; t < n; ++t)
              h.gpu.moe_experts({.out = one.g.rows(t, 1),
                                 .x = x.g.rows(t, 1),
                                 .gate = gate.g,
                                 .up = up.g,
                                 .down = down.g,
                                 .experts = ex.g.rows(t, 1),
                                 .weights = wt.g.rows(t, 1),
                                 .clamp = 10.0f,
                                 .accumulate = false});
            report_batch_invariance(h, "moe_experts n vs 1", s,
                                    diff_f32(b.get_f32(one.g, h.gpu), b.get_f32(out.g, h.gpu)));
          }
        }
      }
    }
    // x over a wide range of magnitudes (the decode path splits x with one
    // scale per 256 values and must keep the precision the output needs): whole vectors
    // scaled by 1e-15 .. 1e15 (at 1e15 with the SwiGLU limit lifted, see below;
    // the mid vector is the down input), and one (scale 0) mixing zero units, small and
    // large units and a unit with one large value among small ones.
    {
      Bufs b(h);
      const int64_t E = 8, F = 1024, D = 1024, k = 2;
      Pair gate = b.random_weight(G::IQ2_XXS, Shape(D, F, E));
      Pair up = b.random_weight(G::IQ2_XXS, Shape(D, F, E));
      Pair down = b.random_weight(G::Q2_K, Shape(F, D, E));
      const float unit_scales[] = {1.0f, 0.0f, 1e-3f, 1.0f, 30.0f, 1.0f, 1.0f, 0.25f};
      // n = 1 / 3: the decode path; n = 40: the expert-grouped path (per-token scales in the grouped GEMM).
      for (const auto& [scale, n] :
           {std::pair{0.0f, int64_t{3}}, std::pair{1e-15f, int64_t{1}}, std::pair{1e-6f, int64_t{1}},
            std::pair{1e15f, int64_t{1}}, std::pair{0.0f, int64_t{40}}, std::pair{1e-15f, int64_t{40}},
            std::pair{1e15f, int64_t{40}}}) {
        std::vector<float> xv = random_normal(r, static_cast<size_t>(n * D));
        for (size_t i = 0; i < xv.size(); ++i) {
          const size_t unit = i / 32;
          if (scale != 0.0f)
            xv[i] *= scale;
          else if (unit % 8 == 6 && i % 32 == 5)
            xv[i] = 1e4f;  // one large value, 31 small ones
          else
            xv[i] *= unit_scales[unit % 8];
        }
        Pair x = b.f32(xv, Shape(D, n));
        std::vector<int32_t> e(static_cast<size_t>(n * k));
        for (auto& v : e) v = static_cast<int32_t>(r.below(E));
        Pair ex = b.i32(e, Shape(k, n));
        Pair wt = b.f32(random_uniform(r, static_cast<size_t>(n * k), 0.1f, 1.0f), Shape(k, n));
        Pair out = b.out(GgmlType::F32, Shape(D, n));
        // At 1e15 the SwiGLU limit is lifted (1e30): saturated, silu(min(g, 10)) * clamp(u, +-10)
        // depends on the signs of g and u only, and a gate or up whose true value cancels to below
        // the f32 rounding of its 1,024 products (CPU and GPU sum in different orders) comes out
        // with either sign, moving one mid value between ~0 and ~100: NMSE ~3e-6 for one such
        // flip, found on about one seed in a hundred (device check on an H200). Unsaturated, the
        // output is continuous in g and u and the case tests what it is for: x splits at 1e15.
        const float limit = scale >= 1e15f ? 1e30f : 10.0f;
        h.cpu.moe_experts({.out = out.c,
                           .x = x.c,
                           .gate = gate.c,
                           .up = up.c,
                           .down = down.c,
                           .experts = ex.c,
                           .weights = wt.c,
                           .clamp = limit,
                           .accumulate = false});
        h.gpu.moe_experts({.out = out.g,
                           .x = x.g,
                           .gate = gate.g,
                           .up = up.g,
                           .down = down.g,
                           .experts = ex.g,
                           .weights = wt.g,
                           .clamp = limit,
                           .accumulate = false});
        h.report.nmse("moe_experts",
                      scale == 0.0f ? strfmt("IQ2_XXS/Q2_K x mixed unit ranges n=%lld", (long long)n)
                                    : strfmt("IQ2_XXS/Q2_K x scaled %g n=%lld", scale, (long long)n),
                      b.diff(out), k_thr_f32);
      }
    }
    // fast numerics: x and the mid vector quantised (MoeExpertsOp::x_quant, mid_quant) on every path: decode,
    // the tiles, the grouped GEMM (which then drops the x_lo products: n = 600 gives ~150 per expert). The
    // GPU's mid agrees with the CPU's to f32 rounding, and a value that lands within that of an int8 rounding
    // boundary moves by one step (about once per 250,000 values; NMSE ~2e-7 per step at F = 256): k_thr_sim,
    // times 16 / n below 16 tokens, where one step is a larger share of the few tokens' outputs (n = 5, seed
    // 14137725081619323530 with --cpu-experts 0.5: 1.9e-6, one step).
    // And the rounding happened: the result is off the CPU without mid_quant by far more.
    // "degenerate": the Q2_K down blocks' d is 0, 1e-7 (dmin / d beyond the grouped GEMM's codes range:
    // EgChunk<Q2_K>::put_codes rescales by a power of two) or as random_weight makes it, in turn; with
    // reference numerics too ("fast" false: nothing quantised, the f32 bound).
    {
      struct M {
        G gate_up, down;
        int64_t n;
        bool degenerate = false, fast = true;
      };
      for (const M& m :
           {M{G::IQ2_XXS, G::Q2_K, 1}, M{G::IQ2_XXS, G::Q2_K, 5}, M{G::IQ2_XXS, G::Q2_K, 160},
            M{G::IQ2_XXS, G::Q2_K, 600}, M{G::IQ2_XXS, G::Q2_K, 600, true}, M{G::IQ2_XXS, G::Q2_K, 600, true, false},
            M{G::Q4_K, G::Q4_K, 1}, M{G::Q4_K, G::Q4_K, 24}, M{G::MXFP4, G::MXFP4, 3}, M{G::Q8_0, G::F16, 20}}) {
        Bufs b(h);
        const int64_t E = 8, F = 256, D = 256, k = 2;
        Pair gate = b.random_weight(m.gate_up, Shape(D, F, E)), up = b.random_weight(m.gate_up, Shape(D, F, E));
        std::vector<uint8_t> down_bytes = random_weight(r, m.down, F, D * E);
        if (m.degenerate) {
          auto* blk = reinterpret_cast<quant::BlockQ2_K*>(down_bytes.data());
          for (size_t i = 0; i < down_bytes.size() / sizeof(quant::BlockQ2_K); ++i)
            if (i % 3 != 2) blk[i].d = i % 3 == 0 ? 0 : f32_to_f16(1e-7f);
        }
        Pair down = b.weight(m.down, std::move(down_bytes), Shape(F, D, E));
        std::vector<float> xv = random_normal(r, static_cast<size_t>(m.n * D));
        if (m.fast)
          for (int64_t t = 0; t < m.n; ++t) act_quant_row(xv.data() + t * D, D, ActQuant::INT8_32);
        Pair x = b.f32(xv, Shape(D, m.n));
        std::vector<int32_t> e(static_cast<size_t>(m.n * k));
        for (size_t i = 0; i < e.size(); ++i) e[i] = static_cast<int32_t>((i % 2 ? 1 : 0) + 2 * r.below(E / 2));
        Pair ex = b.i32(e, Shape(k, m.n));
        Pair wt = b.f32(random_uniform(r, static_cast<size_t>(m.n * k), 0.1f, 1.0f), Shape(k, m.n));
        Pair out = b.out(GgmlType::F32, Shape(D, m.n)), plain = b.out(GgmlType::F32, Shape(D, m.n));
        // The op on one side's tensors (side: &Pair::c, the CPU's, or &Pair::g).
        auto op = [&](Tensor Pair::*side) {
          return MoeExpertsOp{.out = out.*side,
                              .x = x.*side,
                              .gate = gate.*side,
                              .up = up.*side,
                              .down = down.*side,
                              .experts = ex.*side,
                              .weights = wt.*side,
                              .clamp = 10.0f,
                              .mid_quant = m.fast ? ActQuant::INT8_32 : ActQuant::NONE,
                              .x_quant = m.fast ? ActQuant::INT8_32 : ActQuant::NONE};
        };
        MoeExpertsOp c = op(&Pair::c), g = op(&Pair::g);
        h.cpu.moe_experts(c);
        h.gpu.moe_experts(g);
        if (!m.fast) {
          h.report.nmse("moe_experts", strfmt("IQ2_XXS/Q2_K n=%lld degenerate", (long long)m.n), b.diff(out),
                        k_thr_f32);
          continue;
        }
        c.out = plain.c;
        c.mid_quant = ActQuant::NONE;
        h.cpu.moe_experts(c);
        const std::string sp = strfmt("%s/%s n=%lld mid int8-32%s", ggml_type_name(m.gate_up), ggml_type_name(m.down),
                                      (long long)m.n, m.degenerate ? " degenerate" : "");
        h.report.nmse("moe_experts", sp, b.diff(out), k_thr_sim * std::max(1.0, 16.0 / static_cast<double>(m.n)));
        const double moved = diff_f32(b.get_f32(out.g, h.gpu), b.get_f32(plain.c, h.cpu)).nmse;
        h.report.check("moe_experts", sp + " vs unquantised", moved > 1e-7, strfmt("nmse %9.2e (> 1e-7)", moved));
      }
    }
  }
}

}  // namespace dsv4::cudatest
