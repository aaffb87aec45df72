// test_cuda_model: the whole forward pass of the synthetic tiny model (every
// layer kind: window-only, ratio 4 with the indexer, ratio 128; hash and
// top-k MoE; 4 mHC streams) on CUDA against the CPU backend, for both
// numerics, with a fresh model and prompt each run (seed printed; --seed
// repeats a run).
//
//   test_cuda_model [--seed N] [--tokens N] [--preset NAME]
//
// --preset: the synthetic model (default tiny; tiny-mxfp4 runs the same checks with MXFP4 routed experts).
//
// Checks (per numerics), logits at every position of an N-token prompt
// (default 700: past the 128-token window, several ratio-128 rows, and more
// indexer rows than the top-16):
//   CUDA vs CPU (whole prefill). The forward pass is chaotic in one way: a
//   near-tie in a discrete choice (indexer top-k, MoE top-k, an FP8/FP4/bf16
//   rounding boundary) can go either way under f32 reordering, and then
//   perturbs that position strongly (a swapped expert) and later ones weakly.
//   Such positions are "outliers" (NMSE > T_pos); the checks:
//    * every logit finite where the CPU's is (strict);
//    * median position NMSE <= T_med (plain 1e-10, reference 1e-3): the bulk
//      agrees to f32 rounding in plain numerics. Reference numerics round the
//      mHC state to bf16 after every sub-layer (and KV rows to FP8/bf16), so an
//      f32-order difference that crosses one rounding boundary grows to the
//      bf16 quantum (2^-8 relative) within a few layers: CUDA-vs-CPU NMSE then
//      saturates around 1e-5..1e-4 everywhere (measured on an H200:
//      median 7.4e-5, top-1 same at 97% of positions). A kernel bug moves
//      logits by O(1) (NMSE ~1), far above both thresholds;
//    * outliers <= 5% of positions (T_pos: plain 1e-7, reference 1e-2);
//    fast numerics (reference's roundings plus int8 activations): a value
//    within f32 rounding of an int8 rounding boundary crosses it now and then
//    (a step of 1/127 of its block's largest), which moves the logits ~10x
//    further than reference's bf16 steps (measured on an H200: median 7e-4
//    to 1.1e-3, 6-9% of positions over 1e-2): T_med 3e-3, outliers <= 20%;
//    * top-1 identical at every non-outlier position, except where the CPU's
//      top-2 margin is within 4x the largest logit difference (a near-tie).
//   A systematic kernel bug fails the median; one confined to a few positions
//   is the op tests' job (they cover windows, boundaries and edge positions).
//   The checks run on both CUDA matmul paths: tensor cores (the default) and
//   the FFMA tiles (CudaOptions::tensor_cores = false).
//   CUDA chunked == CUDA whole: batches of 1 (decode), 7, 64, 300, and ragged
//   prefill calls (3, 1, 126, 2, 129, 255, 184 tokens). FFMA tiles: bitwise
//   (one summation order for any batch size). Tensor cores: the batched
//   matmuls and grouped experts sum in another order than the one-token
//   kernels, so the rules of the CUDA-vs-CPU comparison apply. In plain
//   numerics that leaves no room for a near-tie that flips early in the
//   prompt: every later position attends to the changed KV row and moves by
//   more than T_pos. Such a failure agrees within T_pos up to the flipped
//   position p and differs from p on; the CPU's scores show the tie at p (seed
//   3496471952779336429, tiny-mxfp4: the indexer's 16th and 17th scores 1.1e-5
//   apart (relative) at position 146, a routing tie 2.2e-5 at 191, exactly
//   where the ragged run left the whole one). A kernel bug typically moves
//   positions before any tie too, or starts exactly at a call boundary.
//   Reference numerics: f32 KV rows == compact KV_FP8/KV_FP4 rows, bitwise.
//   MTP draft logits (window-only block): CUDA vs CPU, NMSE <= T_pos and the
//   same near-tie rule for top-1 — under fast NMSE <= 1e-1: the draft is one
//   more position, an outlier as often as the others (3-8% of them between
//   1e-2 and 5e-2 on an H100; one draft in 2 runs measured 2.9e-2), and a
//   kernel bug still moves it by O(1).
// Exit code non-zero on any failure (77 without a CUDA device).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "synth/synth.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {

struct Run {
  std::vector<float> logits;  // [n][V]
  std::vector<float> mtp;     // [V] MTP draft logits after the prompt (when requested)
};

// Prefill `toks` through `pieces` calls (sizes summing to toks.size()) on a
// fresh model with this max_batch; all logits.
Run run_model(Backend& be, const ModelFile& mf, const MtpWeights* mtp, Numerics num, int max_batch,
              const std::vector<int64_t>& pieces, const std::vector<int32_t>& toks, bool compact_kv = true) {
  ModelOptions mo;
  mo.numerics = num;
  mo.max_batch = max_batch;
  mo.compact_kv = compact_kv;
  auto model = Model::create(be, mf.weights, mtp, mo);
  DSV4_ASSERT(model.has_value(), "Model::create: %s", model ? "" : model.error().message.c_str());
  const int64_t n = static_cast<int64_t>(toks.size());
  const int64_t V = mf.spec().n_vocab;
  KvState st = (*model)->new_state(static_cast<uint32_t>(n + 8));
  Run r;
  r.logits.assign(static_cast<size_t>(n * V), 0.0f);
  int64_t at = 0;
  for (int64_t len : pieces) {
    const Status s = (*model)->forward(st, toks.data() + at, len, at, r.logits.data() + at * V, true);
    DSV4_ASSERT(s.has_value(), "forward: %s", s ? "" : s.error().message.c_str());
    at += len;
  }
  DSV4_ASSERT(at == n, "pieces cover %lld of %lld tokens", static_cast<long long>(at), static_cast<long long>(n));
  if (mtp) {
    r.mtp.assign(static_cast<size_t>(V), 0.0f);
    const Status s = (*model)->mtp_forward(st, toks[0], n - 1, r.mtp.data());
    DSV4_ASSERT(s.has_value(), "mtp_forward: %s", s ? "" : s.error().message.c_str());
  }
  (*model)->free_state(st);
  return r;
}

int argmax(const float* v, int64_t n) { return static_cast<int>(std::max_element(v, v + n) - v); }

struct Verdict {
  int ok = 0, fail = 0;
  std::vector<std::string> failures;
  void add(bool good, const std::string& line) {
    std::printf("%-64s %s\n", line.c_str(), good ? "ok" : "FAIL");
    std::fflush(stdout);
    if (good)
      ++ok;
    else {
      ++fail;
      failures.push_back(line);
    }
  }
};

// Compares CUDA and CPU logits [n][V] position by position with the rules of the header.
void compare_positions(Verdict& v, const char* what, const std::vector<float>& got, const std::vector<float>& want,
                       int64_t V, double t_med, double t_pos, double max_outlier_share) {
  const int64_t n = static_cast<int64_t>(want.size()) / V;
  std::vector<double> nmse(static_cast<size_t>(n));
  int64_t bad_nonfinite = 0, top1_fail = 0, top1_near_tie = 0, top1_outlier = 0;
  std::vector<int64_t> outliers;
  for (int64_t p = 0; p < n; ++p) {
    const Diff d = diff_f32(got.data() + p * V, want.data() + p * V, static_cast<size_t>(V));
    nmse[static_cast<size_t>(p)] = d.nmse;
    bad_nonfinite += d.bad_nonfinite;
    const bool outlier = !(d.nmse <= t_pos);
    if (outlier) outliers.push_back(p);
    if (argmax(got.data() + p * V, V) != argmax(want.data() + p * V, V)) {
      if (outlier)
        ++top1_outlier;
      else if (margin(want.data() + p * V, V) <= 4.0 * d.max_abs)
        ++top1_near_tie;
      else
        ++top1_fail;
    }
  }
  std::vector<double> sorted = nmse;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[sorted.size() / 2], p95 = sorted[std::min(sorted.size() - 1, sorted.size() * 95 / 100)];
  std::printf(
      "  %s: %lld positions, NMSE median %.2e, p95 %.2e, max %.2e; top-1 flips: %lld at near-ties, %lld at outliers, "
      "%lld otherwise\n",
      what, static_cast<long long>(n), med, p95, sorted.back(), static_cast<long long>(top1_near_tie),
      static_cast<long long>(top1_outlier), static_cast<long long>(top1_fail));
  if (!outliers.empty()) {
    std::printf("  outliers (NMSE > %.0e):", t_pos);
    for (size_t i = 0; i < outliers.size() && i < 12; ++i)
      std::printf(" %lld (%.1e)", static_cast<long long>(outliers[i]), nmse[static_cast<size_t>(outliers[i])]);
    std::printf("%s\n", outliers.size() > 12 ? " ..." : "");
  }
  v.add(bad_nonfinite == 0,
        strfmt("%s: logits finite where the CPU's are (%lld bad)", what, static_cast<long long>(bad_nonfinite)));
  v.add(med <= t_med, strfmt("%s: median NMSE %.2e <= %.0e", what, med, t_med));
  v.add(static_cast<double>(outliers.size()) <= max_outlier_share * static_cast<double>(n),
        strfmt("%s: %zu of %lld positions over %.0e (<= %.0f%%)", what, outliers.size(), static_cast<long long>(n),
               t_pos, 100.0 * max_outlier_share));
  v.add(top1_fail == 0,
        strfmt("%s: top-1 identical (except near-ties/outliers; %lld flips)", what, static_cast<long long>(top1_fail)));
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                  static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  int64_t n_tokens = 700;
  std::string preset_name = "tiny";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--preset" && i + 1 < argc)
      preset_name = argv[++i];
    else if (a == "--tokens" && i + 1 < argc)
      n_tokens = std::max<int64_t>(2, std::strtoll(argv[++i], nullptr, 10));
    else if (a == "--help") {
      std::printf("usage: %s [--seed N] [--tokens N] [--preset NAME]\n", argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "usage: %s [--seed N] [--tokens N] [--preset NAME]\n", argv[0]);
      return 2;
    }
  }
  const auto found = find_preset(preset_name);
  if (!found) {
    std::fprintf(stderr, "test_cuda_model: %s\n", found.error().message.c_str());
    return 2;
  }
  std::printf("test_cuda_model: preset %s, seed %llu (repeat with --seed %llu), %lld tokens\n", preset_name.c_str(),
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed),
              static_cast<long long>(n_tokens));
  if (!cuda_device_present()) {
    std::fprintf(stderr, "test_cuda_model: no CUDA device: nothing to test\n");
    return 77;
  }
  auto gpu = make_cuda_backend(0);
  CudaBackendOptions ffma_opt;
  ffma_opt.tensor_cores = false;
  ffma_opt.print_properties = false;
  auto gpu_ffma = make_cuda_backend(0, ffma_opt);
  if (!gpu || !gpu_ffma) {
    std::fprintf(stderr, "test_cuda_model: %s\n", (!gpu ? gpu : gpu_ffma).error().message.c_str());
    return 1;
  }
  auto cpu = make_cpu_backend(0);

  const auto dir = std::filesystem::temp_directory_path() / ("dsv4_cuda_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tiny.gguf").string(), mtp_path = (dir / "tiny-mtp.gguf").string();
  const Preset preset = *found;
  DSV4_ASSERT(synth_write(synth_plan(preset, seed), path, 0).has_value(), "synth_write failed");
  DSV4_ASSERT(synth_write(synth_mtp_plan(preset, seed + 1), mtp_path, 0).has_value(), "synth_write (MTP) failed");
  auto mf = open_model(path);
  DSV4_ASSERT(mf.has_value(), "open_model: %s", mf ? "" : mf.error().message.c_str());
  auto mtp_file = GgufFile::open(mtp_path);
  DSV4_ASSERT(mtp_file.has_value(), "open MTP: %s", mtp_file ? "" : mtp_file.error().message.c_str());
  auto mtp = bind_mtp_weights(**mtp_file, (*mf)->spec());
  DSV4_ASSERT(mtp.has_value(), "bind MTP: %s", mtp ? "" : mtp.error().message.c_str());
  const int64_t V = (*mf)->spec().n_vocab;

  Rng rng(seed ^ 0x5eed);
  std::vector<int32_t> toks(static_cast<size_t>(n_tokens));
  for (auto& t : toks) t = static_cast<int32_t>(3 + rng.below(V - 3));

  Verdict v;
  const std::vector<int64_t> whole = {n_tokens};
  std::vector<int64_t> ragged;
  {
    int64_t left = n_tokens;
    for (int64_t len : {3, 1, 126, 2, 129, 255, 184}) {
      const int64_t l = std::min(len, left);
      if (l > 0) ragged.push_back(l);
      left -= l;
    }
    if (left > 0) ragged.push_back(left);
  }
  // The bounds per numerics: see the file comment.
  for (Numerics num : {Numerics::REFERENCE, Numerics::PLAIN, Numerics::FAST}) {
    const bool ref = simulates_storage(num);
    const bool fast = num == Numerics::FAST;
    const double t_med = fast ? 3e-3 : ref ? 1e-3 : 1e-10, t_pos = ref ? 1e-2 : 1e-7, share = fast ? 0.2 : 0.05;
    const char* nn = numerics_name(num);
    std::printf("== numerics %s\n", nn);
    const auto t0 = std::chrono::steady_clock::now();
    const Run c = run_model(*cpu, **mf, &*mtp, num, 1024, whole, toks);
    const auto t1 = std::chrono::steady_clock::now();
    const Run g = run_model(**gpu, **mf, &*mtp, num, 1024, whole, toks);
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("  prefill of %lld tokens: cpu %.2f s, cuda %.3f s (incl. weight upload)\n",
                static_cast<long long>(n_tokens), std::chrono::duration<double>(t1 - t0).count(),
                std::chrono::duration<double>(t2 - t1).count());
    compare_positions(v, strfmt("%s cuda vs cpu", nn).c_str(), g.logits, c.logits, V, t_med, t_pos, share);
    const Run gf = run_model(**gpu_ffma, **mf, nullptr, num, 1024, whole, toks);
    compare_positions(v, strfmt("%s cuda (FFMA tiles) vs cpu", nn).c_str(), gf.logits, c.logits, V, t_med, t_pos,
                      share);
    {
      // The draft reads the last position's final state: only comparable when that position is not an outlier.
      const int64_t last = n_tokens - 1;
      const Diff dl = diff_f32(g.logits.data() + last * V, c.logits.data() + last * V, static_cast<size_t>(V));
      const Diff d = diff_f32(g.mtp, c.mtp);
      const bool top_ok =
          argmax(g.mtp.data(), V) == argmax(c.mtp.data(), V) || margin(c.mtp.data(), V) <= 4.0 * d.max_abs;
      const double t_draft = fast ? 1e-1 : t_pos;
      if (dl.nmse <= t_pos)
        v.add(d.bad_nonfinite == 0 && d.nmse <= t_draft && top_ok,
              strfmt("%s mtp draft cuda vs cpu: NMSE %.2e <= %.0e, top-1 %s", nn, d.nmse, t_draft,
                     top_ok ? "same" : "differs"));
      else
        std::printf("  mtp draft not compared: the last position is an outlier (NMSE %.1e); draft NMSE %.1e\n", dl.nmse,
                    d.nmse);
    }
    for (int batch : {1, 7, 64, 300}) {
      const Run b = run_model(**gpu_ffma, **mf, nullptr, num, batch, whole, toks);
      const Diff d = diff_f32(b.logits, gf.logits);
      v.add(d.n_diff == 0, strfmt("%s cuda FFMA batch %d == cuda FFMA whole (bitwise; %lld differ)", nn, batch,
                                  static_cast<long long>(d.n_diff)));
      const Run bt = run_model(**gpu, **mf, nullptr, num, batch, whole, toks);
      compare_positions(v, strfmt("%s cuda batch %d vs cuda whole", nn, batch).c_str(), bt.logits, g.logits, V, t_med,
                        t_pos, share);
    }
    const Run rf = run_model(**gpu_ffma, **mf, nullptr, num, 512, ragged, toks);
    const Diff d = diff_f32(rf.logits, gf.logits);
    v.add(d.n_diff == 0, strfmt("%s cuda FFMA ragged prefill calls == cuda FFMA whole (bitwise; %lld differ)", nn,
                                static_cast<long long>(d.n_diff)));
    const Run rg = run_model(**gpu, **mf, nullptr, num, 512, ragged, toks);
    compare_positions(v, strfmt("%s cuda ragged prefill calls vs cuda whole", nn).c_str(), rg.logits, g.logits, V,
                      t_med, t_pos, share);
    if (ref) {
      // Compact KV rows (KV_FP8/KV_FP4) hold the simulated values exactly: f32 rows give the same logits.
      const Run rf32 = run_model(**gpu, **mf, nullptr, num, 512, ragged, toks, false);
      const Diff df = diff_f32(rf32.logits, rg.logits);
      v.add(df.n_diff == 0, strfmt("%s cuda f32 KV rows == compact KV rows (bitwise; %lld differ)", nn,
                                   static_cast<long long>(df.n_diff)));
    }
  }
  std::filesystem::remove_all(dir);
  for (const auto& f : v.failures) std::printf("FAILED: %s\n", f.c_str());
  std::printf("SUMMARY test_cuda_model: %d passed, %d failed (seed %llu)\n", v.ok, v.fail,
              static_cast<unsigned long long>(seed));
  return v.fail == 0 ? 0 : 1;
}
