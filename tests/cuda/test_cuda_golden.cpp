// test_cuda_golden: the Hugging Face golden fixture (tests/fixtures/golden/
// flash_tiny: a tiny random DeepseekV4ForCausalLM and transformers' logits at
// every position of 3 sequences of 700-771 tokens) on the CUDA backend, in
// plain numerics (transformers has no FP8/FP4/bf16 simulation). The fixture is
// converted here to GGUF as f32, q8 (Q8_0 dense and experts: tensor-core
// prefill) and q2 (IQ2_XXS/Q2_K experts, Q8_0 dense); for each:
//   * CUDA (tensor cores, the default) vs the CPU backend at every position:
//     median position NMSE <= 1e-10, at most 5% of positions over 1e-7, top-1
//     identical except where the CPU's top-2 margin is within 4x the largest
//     logit difference — test_cuda_model's plain-numerics rule;
//   * the same for CUDA with FFMA tiles (--no-tensor-cores);
//   * CUDA vs transformers with the CPU golden test's bounds (test_golden.cpp):
//     f32 — top-1 identical everywhere, max |d| / spread <= 2e-4, mean KL <=
//     1e-4; q8 — top-1 agreement >= 0.93, KL <= 0.01; q2 — >= 0.2, KL <= 1.0
//     (quantisation noise on random weights; the bounds catch breakage).
//
//   test_cuda_golden [--data DIR] [--backend B]
//     --data: default the source tree's fixture; on the GPU machine
//     scripts/gpu.sh check passes tests/fixtures/golden/flash_tiny.
//     --backend: the backend under test (default cuda); `cpu` checks this
//     program's plumbing on a machine without a GPU (then both sides agree exactly).
// Exit code non-zero on any failure (77 without a CUDA device).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include <unistd.h>

#include "../common/golden_fixture.h"
#include "backend/cuda/cuda_backend.h"
#include "convert/convert.h"
#include "cuda_test_util.h"
#include "dsv4/engine.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {

int g_ok = 0, g_fail = 0;

void check(bool good, const std::string& what) {
  std::printf("%-96s %s\n", what.c_str(), good ? "ok" : "FAIL");
  std::fflush(stdout);
  (good ? g_ok : g_fail)++;
}

std::unique_ptr<Engine> load(const std::string& path, const std::string& backend, bool tensor_cores) {
  EngineOptions o;
  o.model_path = path;
  o.backend = *backend_choice_from_name(backend);
  o.numerics = Numerics::PLAIN;
  o.ctx = 1024;
  o.prefill_batch = 512;
  CudaOptions cuda;
  cuda.tensor_cores = tensor_cores;
  o.cuda = std::make_shared<const CudaOptions>(cuda);
  o.show_progress = false;
  auto e = Engine::load(o);
  if (!e) {
    std::printf("Engine::load(%s, %s): %s\n", path.c_str(), backend.c_str(), e.error().message.c_str());
    return nullptr;
  }
  return std::move(*e);
}

// Logits at every position of every sequence, concatenated ([pos][V] per sequence).
std::vector<float> all_logits(Engine& e, const golden::Golden& g) {
  std::vector<float> out;
  for (const auto& seq : g.sequences) {
    auto s = e.new_session();
    if (!s) return {};
    auto lg = (*s)->prefill_all_logits(seq);
    if (!lg) return {};
    out.insert(out.end(), lg->begin(), lg->end());
  }
  return out;
}

// CUDA vs CPU at every position, test_cuda_model's plain-numerics rule.
void compare_backends(const char* what, const std::vector<float>& got, const std::vector<float>& want, uint32_t V) {
  if (got.size() != want.size() || want.empty()) {
    check(false, strfmt("%s: logits missing (%zu vs %zu values)", what, got.size(), want.size()));
    return;
  }
  const size_t n = want.size() / V;
  std::vector<double> nmse(n);
  int64_t nonfinite = 0, outliers = 0, flips = 0;
  for (size_t p = 0; p < n; ++p) {
    const Diff d = diff_f32(got.data() + p * V, want.data() + p * V, V);
    nmse[p] = d.nmse;
    nonfinite += d.bad_nonfinite;
    const bool outlier = !(d.nmse <= 1e-7);
    outliers += outlier;
    const float* gv = got.data() + p * V;
    const float* wv = want.data() + p * V;
    const bool same = std::max_element(gv, gv + V) - gv == std::max_element(wv, wv + V) - wv;
    if (!same && !outlier && margin(wv, V) > 4.0 * d.max_abs) ++flips;
  }
  std::vector<double> sorted = nmse;
  std::sort(sorted.begin(), sorted.end());
  const double med = sorted[n / 2];
  check(nonfinite == 0 && med <= 1e-10 && outliers * 20 <= static_cast<int64_t>(n) && flips == 0,
        strfmt("%s: %zu positions, NMSE median %.2e max %.2e, %lld over 1e-7, %lld top-1 flips", what, n, med,
               sorted.back(), static_cast<long long>(outliers), static_cast<long long>(flips)));
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::string(DSV4_TEST_DATA_DIR) + "/golden/flash_tiny";
  std::string backend = "cuda";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--data" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--backend" && i + 1 < argc)
      backend = argv[++i];
    else if (a == "--help") {
      std::printf("usage: %s [--data DIR] [--backend cuda|cpu]\n", argv[0]);
      return 0;
    } else {
      std::fprintf(stderr, "usage: %s [--data DIR] [--backend cuda|cpu]\n", argv[0]);
      return 2;
    }
  }
  std::printf("test_cuda_golden: fixture %s, backend under test %s\n", dir.c_str(), backend.c_str());
  if (backend == "cuda" && !cuda_device_present()) {
    std::fprintf(stderr, "test_cuda_golden: no CUDA device: nothing to test\n");
    return 77;
  }
  const golden::Golden g = golden::load_golden(dir);
  if (!g.error.empty() || g.sequences.empty()) {
    std::printf("test_cuda_golden: %s\nSUMMARY test_cuda_golden: 0 passed, 1 failed\n", g.error.c_str());
    return 1;
  }
  const auto tmp = std::filesystem::temp_directory_path() / ("dsv4_cuda_golden_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  struct Case {
    const char* type;
    bool exact;  // f32: the tight bounds against transformers
    double min_agree, max_kl;
  };
  for (const Case& c : {Case{"f32", true, 1.0, 1e-4}, Case{"q8", false, 0.93, 0.01}, Case{"q2", false, 0.2, 1.0}}) {
    const std::string path = (tmp / (std::string(c.type) + ".gguf")).string();
    ConvertOptions co;
    co.hf_dir = dir;
    co.output = path;
    co.recipe = *quant_recipe_from_name(c.type);
    auto conv = convert_hf(co);
    if (!conv) {
      check(false, strfmt("convert %s: %s", c.type, conv.error().message.c_str()));
      continue;
    }
    auto cpu = load(path, "cpu", true);
    auto tc = load(path, backend, true);
    auto ffma = load(path, backend, false);
    if (!cpu || !tc || !ffma) {
      check(false, strfmt("%s: loading the engines", c.type));
      continue;
    }
    const std::vector<float> lc = all_logits(*cpu, g), lt = all_logits(*tc, g), lf = all_logits(*ffma, g);
    compare_backends(strfmt("%s: cuda (tensor cores) vs cpu", c.type).c_str(), lt, lc, g.vocab);
    compare_backends(strfmt("%s: cuda (FFMA tiles) vs cpu", c.type).c_str(), lf, lc, g.vocab);
    if (lt.empty()) continue;
    golden::Compare hf;
    size_t at = 0;
    for (size_t i = 0; i < g.sequences.size(); ++i)
      for (size_t p = 0; p < g.sequences[i].size(); ++p, ++at)
        golden::compare(&g.logits[i][p * g.vocab], &lt[at * g.vocab], g.vocab, hf);
    const double agree = static_cast<double>(hf.top1_same) / static_cast<double>(hf.positions);
    const double kl = hf.kl_sum / static_cast<double>(hf.positions);
    if (c.exact)
      check(hf.top1_same == hf.positions && hf.max_rel <= 2e-4 && kl <= c.max_kl,
            strfmt("%s: cuda vs transformers: top-1 same %zu/%zu, max |d|/spread %.3g <= 2e-4, mean KL %.3g <= %.0e",
                   c.type, hf.top1_same, hf.positions, hf.max_rel, kl, c.max_kl));
    else
      check(agree >= c.min_agree && kl <= c.max_kl,
            strfmt("%s: cuda vs transformers: top-1 agreement %.4f >= %.2f, mean KL %.4g <= %.2g", c.type, agree,
                   c.min_agree, kl, c.max_kl));
  }
  std::filesystem::remove_all(tmp);
  std::printf("SUMMARY test_cuda_golden: %d passed, %d failed\n", g_ok, g_fail);
  return g_fail == 0 ? 0 : 1;
}
