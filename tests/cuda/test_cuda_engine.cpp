// test_cuda_engine: the Engine/Session API on the CUDA backend (tiny synthetic
// model): backend selection (--backend cuda and auto), and the session
// invariants the CPU tests assert, now on CUDA and bitwise — decode == prefill,
// save -> load -> continue == continue, rewind — on an engine whose batched
// matmuls run on the FFMA tiles (CudaOptions::tensor_cores = false: every
// kernel sums in one order for any batch size); on the default engine (tensor
// cores), decode vs prefill in plain numerics (NMSE <= 1e-7 per position);
// plus agreement with the CPU engine at the end of a prompt in plain numerics
// (NMSE <= 1e-7 and the same top-1 unless the CPU's top-2 margin is within 4x
// the largest logit difference; test_cuda_model compares every position in
// both numerics); speculative verify passes keeping any prefix == prefill (bitwise on the FFMA tiles,
// NMSE <= 1e-7 on the tensor cores); the CUDA switches (all fall-backs; cuBLAS from 2 tokens)
// against the CPU the same way, and bad switch values as clear load errors; and
// with the GPU's memory taken, new_session as a clear error.
//
//   test_cuda_engine [--seed N]
//
// Exit code non-zero on any failure (77 without a CUDA device).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include <cuda_runtime.h>
#include <unistd.h>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "dsv4/engine.h"
#include "synth/synth.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {

int g_ok = 0, g_fail = 0;

void check(bool good, const std::string& what) {
  std::printf("%-72s %s\n", what.c_str(), good ? "ok" : "FAIL");
  std::fflush(stdout);
  (good ? g_ok : g_fail)++;
}

std::unique_ptr<Engine> load(const std::string& path, const std::string& backend, int batch,
                             const std::string& numerics = "reference", bool tensor_cores = true,
                             CudaOptions switches = {}) {
  EngineOptions o;
  switches.tensor_cores = tensor_cores;
  o.cuda = std::make_shared<const CudaOptions>(switches);
  o.model_path = path;
  o.backend = *backend_choice_from_name(backend);
  o.ctx = 2048;
  o.prefill_batch = batch;
  o.numerics = *numerics_from_name(numerics);
  o.show_progress = false;
  auto e = Engine::load(o);
  if (!e) {
    std::printf("Engine::load(%s): %s\n", backend.c_str(), e.error().message.c_str());
    return nullptr;
  }
  return std::move(*e);
}

bool bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = seed_arg("test_cuda_engine", argc, argv);
  if (!cuda_device_present()) {
    std::fprintf(stderr, "test_cuda_engine: no CUDA device: nothing to test\n");
    return 77;
  }
  const auto dir = std::filesystem::temp_directory_path() / ("dsv4_cuda_engine_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tiny.gguf").string();
  DSV4_ASSERT(synth_write(synth_plan(*find_preset("tiny"), seed), path, 0).has_value(), "synth_write failed");
  Rng rng(seed ^ 0xe17);
  std::vector<int32_t> t(400);
  for (auto& v : t) v = static_cast<int32_t>(3 + rng.below(509));
  const size_t V = 512;

  // Backend selection.
  auto cuda = load(path, "cuda", 64);
  check(cuda && cuda->info().backend.rfind("cuda", 0) == 0,
        "--backend cuda: " + (cuda ? cuda->info().backend : "load failed"));
  auto autob = load(path, "auto", 64);
  check(autob && autob->info().backend.rfind("cuda", 0) == 0,
        "--backend auto picks CUDA with a GPU: " + (autob ? autob->info().backend : "load failed"));
  auto cpu = load(path, "cpu", 64);
  // The bitwise session invariants below run on FFMA tiles.
  auto cuda_tc = std::move(cuda);
  cuda = load(path, "cuda", 64, "reference", false);
  if (!cuda || !cuda_tc || !cpu) {
    std::printf("SUMMARY test_cuda_engine: %d passed, %d failed (seed %llu)\n", g_ok, g_fail + 1,
                static_cast<unsigned long long>(seed));
    return 1;
  }

  // CUDA vs CPU after a 300-token prompt, in plain numerics: there the two
  // differ only by f32 summation order, so one position is a tight check. (In
  // reference numerics a 1-ulp difference can flip an FP8/bf16 rounding and
  // move single positions to NMSE ~1e-3..1e-2 — seed 1424451196615418536 gave
  // 1.2e-3 at position 300 — which test_cuda_model judges statistically over
  // all positions instead.)
  auto cuda_plain = load(path, "cuda", 64, "plain");
  auto cpu_plain = load(path, "cpu", 64, "plain");
  if (cuda_plain && cpu_plain) {
    auto sc = *cpu_plain->new_session();
    auto sg = *cuda_plain->new_session();
    const std::span<const int32_t> p(t.data(), 300);
    check(sc->prefill(p).has_value() && sg->prefill(p).has_value(), "prefill 300 tokens on cpu and cuda");
    const Diff d = diff_f32(sg->logits(), sc->logits());
    const auto& lc = sc->logits();
    const auto& lg = sg->logits();
    const size_t ac = static_cast<size_t>(std::max_element(lc.begin(), lc.end()) - lc.begin());
    const size_t ag = static_cast<size_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    std::vector<float> s = lc;
    std::sort(s.begin(), s.end(), std::greater<float>());
    const bool top_ok = ac == ag || s[0] - s[1] <= 4.0 * d.max_abs;
    check(d.bad_nonfinite == 0 && d.nmse <= 1e-7 && top_ok,
          strfmt("plain: cuda vs cpu logits after 300 tokens: NMSE %.2e <= 1e-7, top-1 %zu vs %zu", d.nmse, ag, ac));
    // The CUDA switches (dsv4 --no-int-dot, --cublas, ...): every fall-back on, and cuBLAS for batches of
    // >= 2 tokens, agree with the CPU like the default engine; bad values are clear errors.
    CudaOptions fallbacks;
    fallbacks.int_dot = false;
    fallbacks.cublas = CublasMode::OFF;
    fallbacks.branches = false;
    fallbacks.pdl = false;
    CudaOptions blas_everywhere;
    blas_everywhere.gemm_min_tokens = 2;
    for (const auto& [name, sw] : {std::pair{"fall-backs (no int dot, cuBLAS, branches, PDL)", fallbacks},
                                   std::pair{"cuBLAS from 2 tokens", blas_everywhere}}) {
      auto e = load(path, "cuda", 64, "plain", true, sw);
      bool good = e != nullptr;
      Diff ds{};
      if (good) {
        auto ss = *e->new_session();
        good = ss->prefill(p).has_value();
        for (int i = 0; good && i < 4; ++i) good = ss->decode(t[300 + static_cast<size_t>(i)]).has_value();
        auto sr = *cpu_plain->new_session();
        good = good && sr->prefill(std::span<const int32_t>(t.data(), 304)).has_value();
        if (good) ds = diff_f32(ss->logits(), sr->logits());
      }
      check(good && ds.bad_nonfinite == 0 && ds.nmse <= 1e-7,
            strfmt("plain, %s: cuda vs cpu after 300 + 4 tokens: NMSE %.2e <= 1e-7", name, ds.nmse));
    }
    {
      CudaOptions bad_lib;
      bad_lib.cublas = CublasMode::LIBRARY;
      bad_lib.cublas_library = (dir / "no-such-libcublas.so").string();
      EngineOptions o;
      o.model_path = path;
      o.backend = BackendChoice::CUDA;
      o.show_progress = false;
      o.cuda = std::make_shared<const CudaOptions>(bad_lib);
      auto e = Engine::load(o);
      check(!e && e.error().message.find("cuBLAS") != std::string::npos &&
                e.error().message.find("no-such-libcublas.so") != std::string::npos,
            "--cublas PATH that does not load is an error: " + (e ? std::string("loaded") : e.error().message));
      CudaOptions bad_threshold;
      bad_threshold.gemm_min_tokens = 1;
      o.cuda = std::make_shared<const CudaOptions>(bad_threshold);
      auto e1 = Engine::load(o);
      check(!e1 && e1.error().message.find("at least 2 tokens") != std::string::npos,
            "--gemm-min-tokens 1 is an error: " + (e1 ? std::string("loaded") : e1.error().message));
    }
    // Tensor cores: decode (the one-token kernels) vs prefill (batched tensor-core matmuls).
    auto s1 = *cuda_plain->new_session();
    auto all = s1->prefill_all_logits(std::span<const int32_t>(t.data(), 200));
    auto s2 = *cuda_plain->new_session();
    bool ok = all.has_value();
    double worst = 0;
    for (size_t i = 0; ok && i < 200; ++i) {
      ok = s2->decode(t[i]).has_value();
      const Diff dd = diff_f32(s2->logits().data(), all->data() + i * V, V);
      worst = std::max(worst, dd.nmse);
      ok = ok && dd.bad_nonfinite == 0 && dd.nmse <= 1e-7;
      if (!ok) std::printf("  position %zu: NMSE %.2e\n", i, dd.nmse);
    }
    check(
        ok,
        strfmt("plain, tensor cores: decode token by token vs prefill_all_logits: worst NMSE %.2e <= 1e-7 (200 tokens)",
               worst));
  } else {
    check(false, "loading the plain-numerics engines");
  }

  // --dup-ops (profiling): every op it allows launched twice gives the same
  // logits, bit for bit (they do not read what they write); a name it does not
  // allow is an error.
  {
    CudaOptions dup_all;
    dup_all.dup_ops = (1u << static_cast<unsigned>(CudaDupOp::COUNT)) - 1;
    auto e = load(path, "cuda", 64, "reference", false, dup_all);
    bool same = e != nullptr;
    if (same) {
      auto sd = *e->new_session();
      auto sr = *cuda->new_session();
      const std::span<const int32_t> p(t.data(), 300);
      same = sd->prefill(p).has_value() && sr->prefill(p).has_value() && bitwise(sd->logits(), sr->logits());
      for (int i = 0; same && i < 4; ++i)
        same = sd->decode(t[300 + static_cast<size_t>(i)]).has_value() &&
               sr->decode(t[300 + static_cast<size_t>(i)]).has_value() && bitwise(sd->logits(), sr->logits());
    }
    check(same,
          "cuda: --dup-ops " + std::string(cuda_dup_op_names()) + ": the same logits after 300 + 4 tokens (bitwise)");
    auto bad = parse_dup_ops("matmul,hc_post");
    check(!bad && bad.error().message.find("\"hc_post\"") != std::string::npos,
          "--dup-ops with an op that cannot run twice is an error: " +
              (bad ? std::string("parsed") : bad.error().message));
  }

  // Decode == prefill, bitwise, on CUDA.
  {
    auto s1 = *cuda->new_session();
    auto all = s1->prefill_all_logits(std::span<const int32_t>(t.data(), 200));
    auto s2 = *cuda->new_session();
    bool same = all.has_value();
    for (size_t i = 0; same && i < 200; ++i) {
      same = s2->decode(t[i]).has_value();
      std::vector<float> want(all->begin() + static_cast<long>(i * V), all->begin() + static_cast<long>((i + 1) * V));
      same = same && bitwise(s2->logits(), want);
      if (!same) std::printf("  first difference at position %zu\n", i);
    }
    check(same, "cuda: decode token by token == prefill_all_logits (bitwise, 200 tokens)");
  }

  // Speculative verify passes keeping any prefix (Session::verify; model/speculate.cpp) == prefill: bitwise on
  // the FFMA tiles, NMSE <= 1e-7 per row on the tensor cores (plain numerics), across the compression windows,
  // with other tokens in the dropped rows; then plain decode steps after the last commit.
  // On the tensor cores a pass and the prefill sum in different orders, so a router near-tie can pick another
  // expert for one row (seed 6257920992588319769: NMSE 3.3e-2 at position 150, a pass of 14 rows) and that row's
  // KV then moves every later row. The walk allows one pass (or decode step) with rows past the bound: it
  // reports them and goes on from a new session prefilled up to there; a second such pass fails (a wrong kernel
  // misses on many passes, a near-tie on one row in hundreds of walks).
  auto verify_walk = [&](Engine& eng, bool exact, const char* name) {
    auto ref = *eng.new_session();
    auto want = ref->prefill_all_logits(std::span<const int32_t>(t.data(), 360));
    auto s = *eng.new_session();
    bool good = want.has_value() && s->prefill(std::span<const int32_t>(t.data(), 5)).has_value();
    double worst = 0;
    size_t reanchored = 0;  // passes (or decode steps) with rows past the bound, gone on from a prefill
    auto close = [&](const float* got, size_t pos) {
      std::vector<float> g(got, got + V),
          w(want->begin() + static_cast<long>(pos * V), want->begin() + static_cast<long>((pos + 1) * V));
      if (exact) return bitwise(g, w);
      const double e = diff_f32(g, w).nmse;
      if (e > 1e-7)
        std::printf("  %s: position %zu: NMSE %.2e\n", name, pos, e);
      else
        worst = std::max(worst, e);
      return e <= 1e-7;
    };
    // After a row past the bound: the first time (not on the FFMA tiles), a new session prefilled to `at`.
    auto reanchor = [&](size_t at) {
      if (exact || reanchored++ > 0) return false;
      s = *eng.new_session();
      return s->prefill(std::span<const int32_t>(t.data(), at)).has_value();
    };
    std::mt19937 r(static_cast<uint32_t>(seed));
    size_t at = 5, passes = 0;
    while (good && at < 300) {
      const size_t n = std::min<size_t>(1 + r() % Session::max_verify(), 300 - at), keep = r() % (n + 1);
      std::vector<int32_t> rows(t.begin() + static_cast<long>(at), t.begin() + static_cast<long>(at + keep));
      for (size_t j = keep; j < n; ++j) rows.push_back(static_cast<int32_t>(3 + r() % 509));
      size_t off = 0;  // this pass's rows past the bound
      auto kept = s->verify(rows, [&](std::span<const float> all) {
        for (size_t j = 0; j < keep; ++j) off += close(all.data() + j * V, at + j) ? 0 : 1;
        return keep;
      });
      good = kept.has_value() && *kept == keep;
      at += keep;
      off += close(s->logits().data(), at - 1) ? 0 : 1;
      if (good && off > 0) {
        std::printf("  %s: %zu row(s) past the bound up to position %zu (pass %zu: %zu rows, %zu kept)\n", name, off,
                    at, passes, n, keep);
        good = reanchor(at);
      }
      ++passes;
    }
    for (; good && at < 360; ++at) {
      good = s->decode(t[at]).has_value();
      if (good && !close(s->logits().data(), at)) good = reanchor(at + 1);
    }
    check(good,
          exact ? strfmt("cuda, %s: verify passes keeping any prefix == prefill (bitwise, %zu passes)", name, passes)
                : strfmt("cuda, %s: verify passes keeping any prefix == prefill (NMSE %.1e <= 1e-7; %zu "
                         "pass re-anchored, of %zu)",
                         name, worst, reanchored, passes));
  };
  verify_walk(*cuda, true, "FFMA tiles");
  if (cuda_plain) verify_walk(*cuda_plain, false, "plain, tensor cores");
  // The same walk with every op launched as issued (the decode steps after it too), and with the passes'
  // matmuls on the tiles instead of the token matvec.
  CudaOptions eager;
  eager.graphs = false;
  if (auto e = load(path, "cuda", 64, "plain", true, eager)) verify_walk(*e, false, "plain, tensor cores, no graphs");
  CudaOptions tiles;
  tiles.token_matvec = false;
  if (auto e = load(path, "cuda", 64, "plain", true, tiles))
    verify_walk(*e, false, "plain, tensor cores, no token matvec");

  // The recorded decode step (a CUDA graph) across session switches and frees:
  // two sessions decode in turns of 5 tokens (each switch re-records), and a
  // third session is made and freed mid-way (every recording goes stale).
  {
    const size_t N = 60, off = 100;
    auto ra = *cuda->new_session();
    auto rb = *cuda->new_session();
    auto wa = ra->prefill_all_logits(std::span<const int32_t>(t.data(), N));
    auto wb = rb->prefill_all_logits(std::span<const int32_t>(t.data() + off, N));
    auto sa = *cuda->new_session();
    auto sb = *cuda->new_session();
    bool same = wa.has_value() && wb.has_value();
    size_t ia = 0, ib = 0;
    for (size_t step = 0; same && step < 2 * N; ++step) {
      if (step == 47) {
        auto tmp = *cuda->new_session();
        same = tmp->decode(t[0]).has_value();
      }
      const bool on_a = (step / 5) % 2 == 0;
      auto& sess = on_a ? sa : sb;
      size_t& i = on_a ? ia : ib;
      const std::vector<float>& all = on_a ? *wa : *wb;
      same = same && sess->decode(t[(on_a ? 0 : off) + i]).has_value();
      std::vector<float> want(all.begin() + static_cast<long>(i * V), all.begin() + static_cast<long>((i + 1) * V));
      same = same && bitwise(sess->logits(), want);
      if (!same) std::printf("  first difference at step %zu (session %c, position %zu)\n", step, on_a ? 'a' : 'b', i);
      ++i;
    }
    check(same, "cuda: decode in turns of two sessions (+ a freed third) == their prefills (bitwise)");
  }

  // Save -> load -> continue == continue, bitwise, on CUDA.
  {
    auto live = *cuda->new_session();
    check(live->prefill(std::span<const int32_t>(t.data(), 257)).has_value(), "cuda: prefill 257 tokens");
    const std::vector<uint8_t> snap = live->save();
    auto restored = *cuda->new_session();
    check(restored->load(snap).has_value() && restored->tokens() == live->tokens() &&
              bitwise(restored->logits(), live->logits()),
          "cuda: snapshot load restores tokens and logits");
    const auto rest = std::span<const int32_t>(t.data() + 257, t.size() - 257);
    auto a = live->prefill_all_logits(rest);
    auto b = restored->prefill_all_logits(rest);
    check(a.has_value() && b.has_value() && bitwise(*a, *b), "cuda: save -> load -> continue == continue (bitwise)");
  }

  // Rewind on CUDA.
  {
    auto ref = *cuda->new_session();
    auto all = ref->prefill_all_logits(std::span<const int32_t>(t.data(), 360));
    auto s = *cuda->new_session();
    bool ok = all.has_value() && s->prefill(std::span<const int32_t>(t.data(), 300)).has_value();
    for (size_t i = 300; ok && i < 360; ++i) ok = s->decode(t[i]).has_value();
    for (size_t target : {350u, 301u, 300u, 299u, 130u, 1u}) {
      ok = ok && s->rewind(target).has_value();
      std::vector<float> want(all->begin() + static_cast<long>((target - 1) * V),
                              all->begin() + static_cast<long>(target * V));
      ok = ok && bitwise(s->logits(), want);
    }
    check(ok, "cuda: rewind to 350, 301, 300, 299, 130, 1 restores the exact logits");
  }

  // Engine::step (continuous batching): 8 sessions at different positions
  // decode 64 greedy tokens together, a 25-token prefill chunk riding along
  // in the first step. On the FFMA tiles (reference numerics) every row is
  // bitwise what its session alone gives (prefill/decode); on tensor cores
  // (plain numerics) the batched matmuls round differently from the one-token
  // kernels: the greedy continuations must still agree token for token, and
  // the final logits to NMSE <= 1e-7.
  auto batched_vs_alone = [&](Engine& eng, bool exact, const char* name) {
    const size_t starts[8] = {10, 50, 130, 200, 260, 300, 17, 90};
    std::vector<std::unique_ptr<Session>> batched, alone;
    bool good = true;
    for (size_t k = 0; k < 8 && good; ++k) {
      batched.push_back(*eng.new_session());
      alone.push_back(*eng.new_session());
      const std::span<const int32_t> p(t.data() + k, starts[k]);
      good = batched[k]->prefill(p).has_value() && alone[k]->prefill(p).has_value();
    }
    auto argmax = [](const std::vector<float>& l) {
      return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    };
    // The tokens each sequence is fed, step by step (the same for both runs when greedy agrees).
    std::vector<std::vector<int32_t>> fed_b(8), fed_a(8);
    for (int step = 0; step < 64 && good; ++step) {
      std::vector<std::vector<int32_t>> next(8);
      for (size_t k = 0; k < 8; ++k) {
        if (k == 7 && step == 0)
          next[k].assign(t.begin() + static_cast<long>(k + starts[k]),
                         t.begin() + static_cast<long>(k + starts[k] + 25));
        else
          next[k] = {argmax(batched[k]->logits())};
      }
      std::vector<SessionStep> items;
      for (size_t k = 0; k < 8; ++k) items.push_back(SessionStep{batched[k].get(), next[k]});
      good = eng.step(items).has_value();
      for (size_t k = 0; k < 8 && good; ++k) {
        fed_b[k].insert(fed_b[k].end(), next[k].begin(), next[k].end());
        std::vector<int32_t> mine = next[k];
        if (!(k == 7 && step == 0)) mine = {argmax(alone[k]->logits())};
        good = (mine.size() == 1 ? alone[k]->decode(mine[0]) : alone[k]->prefill(mine)).has_value();
        fed_a[k].insert(fed_a[k].end(), mine.begin(), mine.end());
      }
    }
    size_t same_tokens = 0;
    double worst = 0;
    bool bits = true;
    for (size_t k = 0; k < 8 && good; ++k) {
      same_tokens += fed_a[k] == fed_b[k];
      worst = std::max(worst, diff_f32(batched[k]->logits(), alone[k]->logits()).nmse);
      bits = bits && bitwise(batched[k]->logits(), alone[k]->logits());
    }
    if (exact)
      check(good && same_tokens == 8 && bits,
            strfmt("%s: Engine::step of 8 sessions x 64 greedy steps == each alone, bitwise (%zu/8 same)", name,
                   same_tokens));
    else
      check(good && same_tokens == 8 && worst <= 1e-7,
            strfmt("%s: Engine::step of 8 sessions x 64 greedy steps: %zu/8 continuations equal, NMSE %.2e <= 1e-7",
                   name, same_tokens, worst));
  };
  batched_vs_alone(*cuda, true, "reference, FFMA tiles");
  if (cuda_plain) batched_vs_alone(*cuda_plain, false, "plain, tensor cores");

  // A full GPU: new_session is a clear error, not a failed allocation halfway; room again, a session again.
  {
    const std::optional<uint64_t> before = cuda->free_memory();
    check(before.has_value() && *before > cuda->session_bytes(0),
          "cuda: free_memory() known and larger than a session");
    std::vector<void*> blocks;
    for (void* p = nullptr; blocks.size() < (size_t{1} << 16) && cudaMalloc(&p, size_t{16} << 20) == cudaSuccess;)
      blocks.push_back(p);
    (void)cudaGetLastError();
    auto full = cuda->new_session();
    check(!full.has_value() && full.error().message.find("not enough GPU memory") != std::string::npos,
          "cuda: a full GPU makes new_session an error (" +
              (full ? std::string("it succeeded") : full.error().message) + ")");
    for (void* p : blocks) (void)cudaFree(p);
    check(cuda->new_session().has_value(), "cuda: with the memory back, new_session succeeds");
  }

  cuda.reset();
  cuda_tc.reset();
  autob.reset();
  cpu.reset();
  std::filesystem::remove_all(dir);
  std::printf("SUMMARY test_cuda_engine: %d passed, %d failed (seed %llu)\n", g_ok, g_fail,
              static_cast<unsigned long long>(seed));
  return g_fail == 0 ? 0 : 1;
}
