// The CPU reference against Hugging Face transformers (tests/fixtures/golden):
// tiny random DeepseekV4ForCausalLM models made by tools/golden/make_golden.py,
// converted here to GGUF, run with `plain` numerics (transformers has no
// FP8/FP4/bf16 simulation) and compared at every position of every sequence.
// flash_tiny has the Flash layout at test size; odd_tiny is a shape transformers
// accepts that `reference` numerics cannot run (32 non-RoPE dims per head, no
// FP8 64-block; indexer heads of 96 dims, no Hadamard width): it converts, runs
// in `plain` under the same bounds, and `reference` is refused by name.
//
// Thresholds, and why:
//  * top-1 identical everywhere: the fixture's weight seed was searched so that
//    no routing/indexer selection is within 6e-6 of a tie, and our fp32 path
//    agrees with transformers' to ~1e-5, so any top-1 change is a real bug.
//  * max |Δlogit| <= 2e-4 x (logit spread of that position): fp32 differences
//    of summation order through 4 layers measure ~1e-6 of the spread; 2e-4
//    leaves margin while still catching any wrong term (those move logits by
//    O(spread)).
//  * KL(ref || ours) averaged over positions <= 1e-4 (the bound).
//  * f16 conversion: every fixture weight is exactly representable in f16, so
//    the f16 file must meet the f32 bounds (this exercises the F16 kernels).
//  * quantised conversions (measured: q8 agreement 0.952 / KL 0.0034, q4
//    0.766 / 0.050, q2 0.30 / 0.63): random Gaussian weights have no redundancy,
//    so quantisation noise perturbs far more than it would a trained model.
//    The bounds sit below the measurements and catch breakage: a transposed or
//    mis-scaled quantised tensor sends KL to > 2 and agreement to chance (1/300).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "../common/golden_fixture.h"
#include "convert/convert.h"
#include "gguf/gguf.h"
#include "hf/safetensors.h"
#include "hf_test_util.h"
#include "quant/quant.h"
#include "hf/hf_config.h"
#include "backend/cpu/cpu_backend.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "dsv4/engine.h"

using namespace dsv4;

namespace {

const std::string k_dir = std::string(DSV4_TEST_DATA_DIR) + "/golden/flash_tiny";
const std::string k_odd_dir = std::string(DSV4_TEST_DATA_DIR) + "/golden/odd_tiny";

using golden::Compare;
using golden::Golden;

Golden load_golden(const std::string& dir = k_dir) {
  Golden g = golden::load_golden(dir);
  EXPECT_TRUE(g.error.empty()) << g.error;
  return g;
}

std::string convert(const std::string& type, const std::string& dir = k_dir) {
  std::string out =
      (std::filesystem::temp_directory_path() / ("dsv4_golden_" + std::to_string(::getpid()) + "_" + type + ".gguf"))
          .string();
  ConvertOptions o;
  o.hf_dir = dir;
  o.output = out;
  o.recipe = *quant_recipe_from_name(type);
  auto r = convert_hf(o);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return out;
}

expected<std::unique_ptr<Engine>> load_engine(const std::string& gguf, const std::string& numerics) {
  EngineOptions o;
  o.model_path = gguf;
  o.backend = BackendChoice::CPU;
  o.numerics = *numerics_from_name(numerics);
  o.ctx = 1024;
  o.show_progress = false;
  return Engine::load(o);
}

// Every position's logits of every sequence in `numerics`.
std::vector<std::vector<float>> all_logits(const std::string& gguf, const Golden& g, const std::string& numerics) {
  std::vector<std::vector<float>> out;
  auto e = load_engine(gguf, numerics);
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
  if (!e) return out;
  for (const auto& seq : g.sequences) {
    auto s = (*e)->new_session();
    auto lg = (*s)->prefill_all_logits(seq);
    EXPECT_TRUE(lg.has_value());
    out.push_back(lg ? *lg : std::vector<float>(seq.size() * g.vocab, 0.0f));
  }
  return out;
}

Compare compare_all(const std::vector<std::vector<float>>& ref, const std::vector<std::vector<float>>& ours,
                    uint32_t V) {
  Compare c;
  for (size_t i = 0; i < ref.size() && i < ours.size(); ++i)
    for (size_t p = 0; p < ref[i].size() / V; ++p) golden::compare(&ref[i][p * V], &ours[i][p * V], V, c);
  return c;
}

// `numerics` on the engine against transformers' logits, every position of every sequence.
Compare run(const std::string& gguf, const Golden& g, const std::string& numerics) {
  return compare_all(g.logits, all_logits(gguf, g, numerics), g.vocab);
}

}  // namespace

TEST(Golden, FixtureIsPresent) {
  Golden g = load_golden();
  ASSERT_EQ(g.sequences.size(), 3u);
  for (const auto& s : g.sequences) EXPECT_GE(s.size(), 700u);
}

TEST(Golden, PlainF32MatchesTransformers) {
  Golden g = load_golden();
  ASSERT_FALSE(g.sequences.empty());
  std::string path = convert("f32");
  Compare c = run(path, g, "plain");
  std::filesystem::remove(path);
  ASSERT_GT(c.positions, 2000u);
  std::printf("f32/plain vs transformers: %zu positions, top-1 same %zu, max |d|/spread %.3g, mean KL %.3g\n",
              c.positions, c.top1_same, c.max_rel, c.kl_sum / c.positions);
  EXPECT_EQ(c.top1_same, c.positions);
  EXPECT_LE(c.max_rel, 2e-4);
  EXPECT_LE(c.kl_sum / c.positions, 1e-4);
}

TEST(Golden, ReferenceNumericsStayClose) {
  // DeepSeek's simulated FP8/FP4/bf16 rounding perturbs the transformers logits
  // slightly; this guards that the reference mode is a perturbation, not a different model.
  Golden g = load_golden();
  ASSERT_FALSE(g.sequences.empty());
  std::string path = convert("f32");
  Compare c = run(path, g, "reference");
  std::filesystem::remove(path);
  std::printf("f32/reference vs transformers: top-1 same %zu/%zu, max |d|/spread %.3g, mean KL %.3g\n", c.top1_same,
              c.positions, c.max_rel, c.kl_sum / c.positions);
  EXPECT_GE(double(c.top1_same) / c.positions, 0.9);
  EXPECT_LE(c.kl_sum / c.positions, 0.02);
}

// Every position's logits of every sequence from the Model itself in fast numerics with activation format
// `act` (the engine always uses ModelOptions' default).
std::vector<std::vector<float>> fast_model_logits(const std::string& gguf, const Golden& g, ActQuant act,
                                                  unsigned sites = FAST_ALL_SITES) {
  std::vector<std::vector<float>> out;
  auto mf = open_model(gguf);
  EXPECT_TRUE(mf.has_value()) << (mf ? "" : mf.error().message);
  if (!mf) return out;
  auto be = make_cpu_backend(0);
  ModelOptions o;
  o.numerics = Numerics::FAST;
  o.fast_act = act;
  o.fast_sites = sites;
  auto m = Model::create(*be, (*mf)->weights, nullptr, o);
  EXPECT_TRUE(m.has_value()) << (m ? "" : m.error().message);
  if (!m) return out;
  for (const auto& seq : g.sequences) {
    KvState st = (*m)->new_state(1024);
    std::vector<float> lg(seq.size() * g.vocab);
    EXPECT_TRUE((*m)->forward(st, seq.data(), static_cast<int64_t>(seq.size()), 0, lg.data(), true).has_value());
    (*m)->free_state(st);
    out.push_back(std::move(lg));
  }
  return out;
}

TEST(Golden, FastNumericsStayCloseToReference) {
  // `fast` is `reference` with the linear layers' inputs quantised (core/act_quant.h): int8 blocks of 32
  // with a scale of three mantissa bits, chosen over DeepSeek's own FP8 blocks of 128 because it perturbs
  // less. Against `reference` (the graph it approximates) and against transformers, beside reference's own
  // distance and the FP8 format's. This random-weight fixture amplifies any rounding (reference's storage
  // roundings alone move top-1 on 8% of positions; Q8_0 weights on 5%), so the bounds sit below the
  // measurements (int8: top-1 0.919, KL 0.0063 against reference; with a power-of-two scale it was 0.906 and
  // 0.0089) and catch breakage. The decisions rest on int8 perturbing less than FP8 and on `fast` moving
  // reference less than reference's storage roundings move transformers' logits (KL 0.0077): issue #37's bar
  // (fast against reference no larger than reference against plain) on this fixture.
  Golden g = load_golden();
  ASSERT_FALSE(g.sequences.empty());
  std::string path = convert("f32");
  const auto ref = all_logits(path, g, "reference"), fast = all_logits(path, g, "fast");
  const auto fp8 = fast_model_logits(path, g, ActQuant::FP8_128);
  std::filesystem::remove(path);
  Compare fr = compare_all(ref, fast, g.vocab), ft = compare_all(g.logits, fast, g.vocab),
          rt = compare_all(g.logits, ref, g.vocab), pr = compare_all(ref, fp8, g.vocab);
  auto line = [](const char* what, const Compare& c) {
    std::printf("%-40s top-1 same %.4f, max |d|/spread %.3g, mean KL %.3g\n", what, double(c.top1_same) / c.positions,
                c.max_rel, c.kl_sum / c.positions);
  };
  line("f32/fast vs f32/reference:", fr);
  line("f32/fast vs transformers:", ft);
  line("f32/reference vs transformers:", rt);
  line("f32/fast with fp8-128 vs f32/reference:", pr);
  ASSERT_GT(fr.positions, 2000u);
  EXPECT_EQ(ModelOptions{}.fast_act, ActQuant::INT8_32);  // the engine's fast is the int8 format
  EXPECT_GE(double(fr.top1_same) / fr.positions, 0.85);
  EXPECT_LE(fr.kl_sum / fr.positions, 0.015);
  EXPECT_LT(fr.kl_sum, 0.5 * pr.kl_sum);  // int8-32 perturbs less than fp8-128 (measured: 5x lower KL)
  EXPECT_LT(fr.kl_sum, rt.kl_sum);        // and less than reference's own roundings (0.0063 vs 0.0077)
  EXPECT_GT(fr.kl_sum, 0.0);              // and it does quantise
}

// --fast-skip: fast with no site quantised is reference, bitwise (every input of the list is one of the sites
// and nothing else changes); with one site skipped it differs from both.
TEST(Golden, FastSitesSkipped) {
  Golden g = load_golden();
  ASSERT_FALSE(g.sequences.empty());
  std::string path = convert("f32");
  const auto ref = all_logits(path, g, "reference");
  const auto none = fast_model_logits(path, g, ActQuant::INT8_32, 0);
  const auto all = fast_model_logits(path, g, ActQuant::INT8_32);
  const auto some = fast_model_logits(path, g, ActQuant::INT8_32, FAST_ALL_SITES & ~FAST_ATTN_IN);
  std::filesystem::remove(path);
  ASSERT_EQ(none.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(none[i], ref[i]) << "sequence " << i;
  EXPECT_GT(compare_all(ref, some, g.vocab).kl_sum, 0.0);
  EXPECT_GT(compare_all(all, some, g.vocab).kl_sum, 0.0);
}

// q8, q4 and q2 conversions of the fixture in `dir`, each against the bounds above.
void quantised_conversions_stay_close(const std::string& dir) {
  Golden g = load_golden(dir);
  ASSERT_FALSE(g.sequences.empty());
  struct Bound {
    const char* type;
    double min_agree, max_kl;
  };
  for (const Bound& b : {Bound{"q8", 0.93, 0.01}, Bound{"q4", 0.55, 0.25}, Bound{"q2", 0.2, 1.0}}) {
    std::string path = convert(b.type, dir);
    Compare c = run(path, g, "plain");
    std::filesystem::remove(path);
    double agree = double(c.top1_same) / c.positions, kl = c.kl_sum / c.positions;
    std::printf("%s: %s/plain vs transformers: top-1 agreement %.4f, mean KL %.4g\n",
                std::filesystem::path(dir).filename().c_str(), b.type, agree, kl);
    EXPECT_GE(agree, b.min_agree) << b.type;
    EXPECT_LE(kl, b.max_kl) << b.type;
  }
}

TEST(Golden, QuantisedConversionsStayClose) { quantised_conversions_stay_close(k_dir); }

TEST(Golden, F16ConversionIsExact) {
  Golden g = load_golden();
  ASSERT_FALSE(g.sequences.empty());
  std::string path = convert("f16");
  Compare c = run(path, g, "plain");
  std::filesystem::remove(path);
  std::printf("f16/plain vs transformers: top-1 same %zu/%zu, max |d|/spread %.3g, mean KL %.3g\n", c.top1_same,
              c.positions, c.max_rel, c.kl_sum / c.positions);
  EXPECT_EQ(c.top1_same, c.positions);
  EXPECT_LE(c.max_rel, 2e-4);
  EXPECT_LE(c.kl_sum / c.positions, 1e-4);
}

// ---- odd_tiny: a shape only `plain` numerics run -------------------------------------------------

TEST(GoldenOddShape, FixtureIsPresent) {
  Golden g = load_golden(k_odd_dir);
  ASSERT_EQ(g.sequences.size(), 3u);
  for (const auto& s : g.sequences) EXPECT_GE(s.size(), 700u);
  auto cfg = hf_config_load(k_odd_dir);
  ASSERT_TRUE(cfg.has_value()) << cfg.error().message;
  EXPECT_EQ(cfg->head_dim - cfg->qk_rope_head_dim, 32u);
  EXPECT_EQ(cfg->index_head_dim, 96u);
}

TEST(GoldenOddShape, PlainF32MatchesTransformers) {
  Golden g = load_golden(k_odd_dir);
  ASSERT_FALSE(g.sequences.empty());
  std::string path = convert("f32", k_odd_dir);
  Compare c = run(path, g, "plain");
  std::filesystem::remove(path);
  ASSERT_GT(c.positions, 2000u);
  std::printf("odd_tiny f32/plain vs transformers: %zu positions, top-1 same %zu, max |d|/spread %.3g, mean KL %.3g\n",
              c.positions, c.top1_same, c.max_rel, c.kl_sum / c.positions);
  EXPECT_EQ(c.top1_same, c.positions);
  EXPECT_LE(c.max_rel, 2e-4);
  EXPECT_LE(c.kl_sum / c.positions, 1e-4);
}

TEST(GoldenOddShape, F16ConversionIsExact) {
  Golden g = load_golden(k_odd_dir);
  ASSERT_FALSE(g.sequences.empty());
  std::string path = convert("f16", k_odd_dir);
  Compare c = run(path, g, "plain");
  std::filesystem::remove(path);
  std::printf("odd_tiny f16/plain vs transformers: top-1 same %zu/%zu, max |d|/spread %.3g, mean KL %.3g\n",
              c.top1_same, c.positions, c.max_rel, c.kl_sum / c.positions);
  EXPECT_EQ(c.top1_same, c.positions);
  EXPECT_LE(c.max_rel, 2e-4);
  EXPECT_LE(c.kl_sum / c.positions, 1e-4);
}

// Every matrix input width of odd_tiny is a multiple of 32 and the experts' of 256, so the
// quantised recipes fit it.
TEST(GoldenOddShape, QuantisedConversionsStayClose) { quantised_conversions_stay_close(k_odd_dir); }

TEST(GoldenOddShape, ReferenceNumericsAreRefused) {
  std::string path = convert("f32", k_odd_dir);
  auto e = load_engine(path, "reference");
  std::filesystem::remove(path);
  ASSERT_FALSE(e.has_value());
  const std::string want =
      "this model's attention has 32 non-RoPE dims per head (key_length 96 - 64 RoPE dims), not a multiple of 64, so "
      "`--numerics reference` (FP8 KV rows in 64-value blocks) cannot run it; use --numerics plain";
  EXPECT_NE(e.error().message.find(want), std::string::npos) << e.error().message;
}

// A recipe whose blocks do not divide a tensor's rows is refused before any tensor is read
// (odd_tiny's config with an embedding width of 200 and experts 160 wide); f16 and f32 take it.
TEST(GoldenOddShape, RecipesNeedWholeBlocks) {
  auto cfg = hf_config_load(k_odd_dir);
  ASSERT_TRUE(cfg.has_value()) << cfg.error().message;
  HfConfig c = *cfg;
  c.hidden_size = 200;
  c.moe_intermediate_size = 160;
  auto spec = spec_from_hf(c);
  ASSERT_TRUE(spec.has_value()) << spec.error().message;
  EXPECT_TRUE(check_recipe_fits(*spec, QuantRecipe::F16).has_value());
  EXPECT_TRUE(check_recipe_fits(*spec, QuantRecipe::F32).has_value());
  auto q8 = check_recipe_fits(*spec, QuantRecipe::Q8);
  ASSERT_FALSE(q8.has_value());
  const std::string want_q8 =
      "output.weight has rows of 200 values: the q8 recipe stores it as Q8_0, whose blocks hold "
      "32 values; convert with --type f16 or f32";
  EXPECT_NE(q8.error().message.find(want_q8), std::string::npos) << q8.error().message;
  c.hidden_size = 256;
  spec = spec_from_hf(c);
  ASSERT_TRUE(spec.has_value());
  EXPECT_TRUE(check_recipe_fits(*spec, QuantRecipe::Q8).has_value());
  auto q2 = check_recipe_fits(*spec, QuantRecipe::Q2);
  ASSERT_FALSE(q2.has_value());
  const std::string want_q2 =
      "blk.0.ffn_down_exps.weight has rows of 160 values: the q2 recipe stores it as Q2_K, whose blocks hold 256 "
      "values";
  EXPECT_NE(q2.error().message.find(want_q2), std::string::npos) << q2.error().message;

  // Through convert_hf: a folder with only the config fails on the recipe, not on the missing tensors.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dsv4_golden_cfg_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ifstream in(k_odd_dir + "/config.json");
  auto j = nlohmann::json::parse(in);
  j["moe_intermediate_size"] = 160;
  std::ofstream(dir / "config.json") << j.dump();
  ConvertOptions o;
  o.hf_dir = dir.string();
  o.output = (dir / "out.gguf").string();
  o.recipe = QuantRecipe::Q4;
  auto r = convert_hf(o);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(r.has_value());
  const std::string want_q4 = "blk.0.ffn_down_exps.weight has rows of 160 values: the q4 recipe stores it as Q4_K";
  EXPECT_NE(r.error().message.find(want_q4), std::string::npos) << r.error().message;
}

// --type mxfp4 from a checkpoint whose routed experts are DeepSeek's packed FP4 (I8 codes, element 2k in
// the low nibble of byte k, and an F8_E8M0 scale per 32 values): the GGUF's MXFP4 blocks are those bytes
// rearranged, with nothing recomputed. The fixture's experts are first made FP4 by the MXFP4 quantiser;
// the converted file must hold exactly those blocks. From the bf16 fixture itself the experts are
// quantised instead; both files load and run on the CPU.
TEST(Convert, Mxfp4RepacksPackedFp4ExpertsLosslessly) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dsv4_fp4_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : fs::directory_iterator(k_dir))
    if (f.path().filename() != "model.safetensors") fs::copy(f.path(), dir / f.path().filename());
  auto src = SafetensorsFile::open(k_dir + "/model.safetensors");
  ASSERT_TRUE(src.has_value()) << src.error().message;
  std::vector<hftest::Entry> entries;
  std::map<std::string, std::vector<uint8_t>> blocks;  // expert tensor -> its MXFP4 blocks, rows in order
  for (const StTensor& t : (*src)->tensors()) {
    const bool expert = t.name.find(".ffn.experts.") != std::string::npos && t.name.ends_with(".weight");
    if (!expert) {
      entries.push_back({t.name, st_dtype_name(t.dtype), t.shape, std::vector<uint8_t>(t.data, t.data + t.n_bytes)});
      continue;
    }
    const uint64_t rows = t.shape[0], cols = t.shape[1], nb = cols / 32;
    std::vector<float> v(rows * cols);
    ASSERT_TRUE(st_read_f32(t, v.data()).has_value());
    std::vector<uint8_t> mx(rows * nb * sizeof(quant::BlockMXFP4)), codes(rows * cols / 2), scales(rows * nb);
    for (uint64_t r = 0; r < rows; ++r) {
      quant::quantize_row(GgmlType::MXFP4, v.data() + r * cols, mx.data() + r * nb * 17, static_cast<int64_t>(cols));
      for (uint64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = mx.data() + (r * nb + b) * 17;
        scales[r * nb + b] = blk[0];
        for (uint64_t i = 0; i < 32; ++i) {  // block element i -> source element 32b + i
          const uint8_t c = i < 16 ? blk[1 + i] & 0xF : blk[1 + i - 16] >> 4;
          const uint64_t k = r * cols + 32 * b + i;
          codes[k / 2] = static_cast<uint8_t>(codes[k / 2] | c << (4 * (k & 1)));
        }
      }
    }
    const std::string base = t.name.substr(0, t.name.size() - std::string(".weight").size());
    entries.push_back({t.name, "I8", {rows, cols / 2}, codes});
    entries.push_back({base + ".scale", "F8_E8M0", {rows, nb}, scales});
    blocks[t.name] = std::move(mx);
  }
  ASSERT_FALSE(blocks.empty());
  {
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    const std::vector<uint8_t> bytes = hftest::build(entries);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  ConvertOptions o;
  o.hf_dir = dir.string();
  o.output = (dir / "mxfp4.gguf").string();
  o.recipe = QuantRecipe::MXFP4;
  auto r = convert_hf(o);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_GT(r->mxfp4_repacked, 0u);
  EXPECT_EQ(r->mxfp4_quantised, 0u);
  // Each GGUF expert tensor [in, out, E] holds expert e's rows at e * out: compare with the blocks made above.
  auto g = GgufFile::open(o.output);
  ASSERT_TRUE(g.has_value()) << g.error().message;
  size_t compared = 0;
  for (const GgufTensorInfo& t : (*g)->tensors()) {
    if (t.type != GgmlType::MXFP4) continue;
    const std::string name(t.name);  // blk.L.ffn_{gate,up,down}_exps.weight
    const size_t l0 = name.find('.') + 1, l1 = name.find('.', l0);
    const std::string layer = name.substr(l0, l1 - l0);
    const std::string w = name.find("gate") != std::string::npos   ? "w1"
                          : name.find("down") != std::string::npos ? "w2"
                                                                   : "w3";
    const uint64_t expert_bytes = t.ne[1] * ggml_row_bytes(GgmlType::MXFP4, t.ne[0]);
    for (uint64_t e = 0; e < t.ne[2]; ++e) {
      const auto it = blocks.find("model.layers." + layer + ".ffn.experts." + std::to_string(e) + "." + w + ".weight");
      ASSERT_NE(it, blocks.end()) << name << " expert " << e;
      ASSERT_EQ(it->second.size(), expert_bytes);
      EXPECT_EQ(0, std::memcmp((*g)->tensor_data(t) + e * expert_bytes, it->second.data(), expert_bytes)) << name;
      ++compared;
    }
  }
  EXPECT_EQ(compared, blocks.size());
  // From the bf16 fixture: quantised, not copied. Both run.
  const std::string quantised = convert("mxfp4");
  for (const std::string& path : {o.output, quantised}) {
    auto e = load_engine(path, "reference");
    ASSERT_TRUE(e.has_value()) << e.error().message;
    auto s = (*e)->new_session();
    ASSERT_TRUE(s.has_value());
    ASSERT_TRUE((*s)->prefill(std::vector<int32_t>{5, 6, 7, 8}).has_value());
    for (float x : (*s)->logits()) ASSERT_TRUE(std::isfinite(x));
  }
  fs::remove(quantised);
  fs::remove_all(dir);
}
