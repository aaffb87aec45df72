// ModelSpec (metadata round trip, validation), what `reference` numerics and the
// CUDA kernels need beyond a valid shape, the tensor table (published layouts),
// weight binding (every kind of mismatch reported), and the synthetic model
// generator (determinism, vocabulary, scale).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "core/hash.h"
#include "model/model_file.h"
#include "model/shape_fit.h"
#include "quant/quant.h"
#include "synth/synth.h"
#include "synth/synth_vocab.h"
#include "../common/odd_spec.h"

using namespace dsv4;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("dsv4_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

// Writes a GGUF with the spec's metadata and the given tensors (zero-filled,
// except tid2eid tables which get valid ids).
std::string write_variant(const std::string& name, const ModelSpec& spec, const std::vector<SynthTensor>& tensors) {
  GgufWriter w;
  spec.write_gguf(w);
  for (const auto& t : tensors) {
    bool table = t.spec.cls == TypeClass::I32_TABLE;
    w.add_tensor(t.spec.name, t.type, t.spec.ne, [table](uint64_t, uint64_t nr, uint8_t* dst) -> Status {
      (void)table;
      (void)nr;
      (void)dst;  // zero bytes are valid for every type (tid2eid 0 is expert 0)
      return {};
    });
  }
  std::string path = temp_path(name);
  auto st = w.write(path);
  EXPECT_TRUE(st.has_value()) << (st ? "" : st.error().message);
  return path;
}

std::string bind_error(const std::string& path) {
  auto m = open_model(path);
  std::filesystem::remove(path);
  return m ? "" : m.error().message;
}

}  // namespace

TEST(ModelSpec, PresetsValidateAndRoundTrip) {
  for (const ModelSpec& s : {ModelSpec::flash(), ModelSpec::pro(), tiny_spec()}) {
    ASSERT_TRUE(s.validate().has_value()) << s.name << ": " << s.validate().error().message;
    GgufWriter w;
    s.write_gguf(w);
    std::string path = temp_path("spec.gguf");
    ASSERT_TRUE(w.write(path).has_value());
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value());
    auto r = ModelSpec::from_gguf(**f);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_TRUE(r->same_hyperparameters(s)) << s.name;
    std::filesystem::remove(path);
  }
  EXPECT_EQ(ModelSpec::flash().recognise(), "DeepSeek V4 Flash");
  EXPECT_EQ(ModelSpec::pro().recognise(), "DeepSeek V4 Pro");
  EXPECT_NE(tiny_spec().recognise().find("custom"), std::string::npos);
}

TEST(ModelSpec, FlashLayerSchedule) {
  ModelSpec s = ModelSpec::flash();
  EXPECT_EQ(s.layer_kind(0), LayerKind::WINDOW);
  EXPECT_EQ(s.layer_kind(1), LayerKind::WINDOW);
  int sparse = 0, comp = 0;
  for (uint32_t il = 2; il < s.n_layer; ++il) {
    EXPECT_EQ(s.layer_kind(il), il % 2 == 0 ? LayerKind::SPARSE : LayerKind::COMPRESSED) << il;
    (il % 2 == 0 ? sparse : comp)++;
  }
  EXPECT_EQ(sparse, 21);
  EXPECT_EQ(comp, 20);
  EXPECT_EQ(s.hc_mix_width(), 24u);
  EXPECT_EQ(s.compress_width(2), 1024u);
  EXPECT_EQ(s.compress_width(3), 512u);
  ModelSpec p = ModelSpec::pro();
  EXPECT_EQ(p.layer_kind(0), LayerKind::COMPRESSED);
  EXPECT_EQ(p.ratio(1), 128u);
}

TEST(ModelSpec, BadMetadataIsRejectedWithTheKey) {
  struct Case {
    const char* what;
    std::function<void(GgufWriter&)> edit;
    const char* expect;
  };
  std::vector<Case> cases = {
      {"wrong architecture", [](GgufWriter& w) { w.set_string("general.architecture", "llama"); }, "\"llama\" model"},
      {"kv heads", [](GgufWriter& w) { w.set_u32("deepseek4.attention.head_count_kv", 8); }, "one shared KV head"},
      {"string instead of int", [](GgufWriter& w) { w.set_string("deepseek4.expert_count", "256"); },
       "deepseek4.expert_count"},
      {"negative ratio",
       [](GgufWriter& w) { w.set_array_i32("deepseek4.attention.compress_ratios", std::vector<int32_t>(44, -4)); },
       "compress_ratios"},
      {"short ratios",
       [](GgufWriter& w) {
         w.set_array_u32("deepseek4.attention.compress_ratios", {0, 0, 4});
       },
       "need at least"},
      {"bad ratio",
       [](GgufWriter& w) {
         auto r = ModelSpec::flash().compress_ratios;
         r[5] = 1;
         w.set_array_u32("deepseek4.attention.compress_ratios", r);
       },
       "compress_ratios[5] = 1"},
      {"groups", [](GgufWriter& w) { w.set_u32("deepseek4.attention.output_group_count", 7); },
       "must divide head_count"},
      {"used > experts", [](GgufWriter& w) { w.set_u32("deepseek4.expert_used_count", 300); }, "expert_used_count"},
      {"value != key length", [](GgufWriter& w) { w.set_u32("deepseek4.attention.value_length", 256); },
       "shares K and V"},
      {"expert groups", [](GgufWriter& w) { w.set_u32("deepseek4.expert_group_count", 8); }, "group-limited"},
      {"clamp type",
       [](GgufWriter& w) { w.set_array_u32("deepseek4.swiglu_clamp_exp", std::vector<uint32_t>(44, 10)); },
       "must hold floats"},
      {"indexer dim", [](GgufWriter& w) { w.set_u32("deepseek4.attention.indexer.key_length", 32); },
       "indexer.key_length 32 must be in [rope.dimension_count 64"},
      {"rope dims", [](GgufWriter& w) { w.set_u32("deepseek4.rope.dimension_count", 63); }, "must be even"},
      {"bool type", [](GgufWriter& w) { w.set_u32("deepseek4.expert_weights_norm", 1); }, "must be a bool"},
  };
  for (const auto& c : cases) {
    GgufWriter w;
    ModelSpec::flash().write_gguf(w);
    c.edit(w);
    std::string path = temp_path("bad.gguf");
    ASSERT_TRUE(w.write(path).has_value());
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.has_value());
    auto r = ModelSpec::from_gguf(**f);
    ASSERT_FALSE(r.has_value()) << c.what;
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << c.what << ": " << r.error().message;
    std::filesystem::remove(path);
  }
  // A missing key is named.
  GgufWriter w;
  w.set_string("general.architecture", "deepseek4");
  w.set_u32("deepseek4.block_count", 43);
  std::string path = temp_path("missing.gguf");
  ASSERT_TRUE(w.write(path).has_value());
  auto f = GgufFile::open(path);
  auto r = ModelSpec::from_gguf(**f);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("missing metadata key \"deepseek4.embedding_length\""), std::string::npos)
      << r.error().message;
  std::filesystem::remove(path);
}

namespace {

using dsv4::test::odd_spec;

// check_cuda_fit on a synthetic model of `spec` stored with `recipe`.
Status cuda_fit(const ModelSpec& spec, QuantRecipe recipe, Numerics numerics) {
  const std::string path = temp_path("cuda-fit.gguf");
  const Preset p{"fit", "", spec, recipe};
  EXPECT_TRUE(synth_write(synth_plan(p, 3), path, 2).has_value());
  auto m = open_model(path);
  std::filesystem::remove(path);
  EXPECT_TRUE(m.has_value()) << m.error().message;
  if (!m) return m.error();
  return check_cuda_fit((*m)->weights, nullptr, numerics);
}

std::string fit_error(const Status& st) { return st ? "" : st.error().message; }

}  // namespace

TEST(ModelSpec, EveryTransformersShapeIsValid) {
  EXPECT_TRUE(odd_spec().validate().has_value()) << odd_spec().validate().error().message;
  ModelSpec s = odd_spec();
  s.o_groups = 5;  // 288 head outputs do not split into 5 groups
  ASSERT_FALSE(s.validate().has_value());
  EXPECT_NE(s.validate().error().message.find("must divide head_count x key_length = 3 x 96"), std::string::npos);
  s = odd_spec();
  s.rope_dim = 96;  // every dim rotated: no non-RoPE dims at all
  s.indexer_head_dim = 96;
  EXPECT_TRUE(s.validate().has_value()) << s.validate().error().message;
  s.indexer_head_dim = 64;  // the indexer's RoPE tail no longer fits its heads
  EXPECT_FALSE(s.validate().has_value());
  s.compress_ratios = {0, 0, 128, 128, 0, 128, 0};  // ... which matters only with an indexer (ratio 4)
  EXPECT_TRUE(s.validate().has_value());
}

TEST(ShapeFit, ReferenceNumericsNeedFp8BlocksAndAHadamardWidth) {
  EXPECT_TRUE(check_numerics_fit(tiny_spec(), Numerics::REFERENCE).has_value());
  EXPECT_TRUE(check_numerics_fit(odd_spec(), Numerics::PLAIN).has_value());
  const std::string e = fit_error(check_numerics_fit(odd_spec(), Numerics::REFERENCE));
  const std::string want =
      "this model's attention has 32 non-RoPE dims per head (key_length 96 - 64 RoPE dims), not a multiple of 64, so "
      "`--numerics reference` (FP8 KV rows in 64-value blocks) cannot run it; use --numerics plain";
  EXPECT_NE(e.find(want), std::string::npos) << e;
  const std::string ef = fit_error(check_numerics_fit(odd_spec(), Numerics::FAST));  // fast has the same roundings
  EXPECT_NE(ef.find("so `--numerics fast` (FP8 KV rows"), std::string::npos) << ef;
  ModelSpec s = odd_spec();
  s.head_dim = 192;  // 128 non-RoPE dims: two FP8 blocks
  const std::string e2 = fit_error(check_numerics_fit(s, Numerics::REFERENCE));
  EXPECT_NE(e2.find("indexer heads have 80 dims, not a power of two >= 32"), std::string::npos) << e2;
  s.head_dim = 144;  // 128 non-RoPE dims with 16 RoPE dims
  s.rope_dim = 16;
  s.indexer_head_dim = 16;  // a power of two, but below one FP4 block
  const std::string e3 = fit_error(check_numerics_fit(s, Numerics::REFERENCE));
  EXPECT_NE(e3.find("indexer heads have 16 dims"), std::string::npos) << e3;
  s.indexer_head_dim = 80;
  s.compress_ratios = {0, 0, 128, 128, 0, 128, 0};  // no indexer
  EXPECT_TRUE(check_numerics_fit(s, Numerics::REFERENCE).has_value());
}

TEST(ShapeFit, CudaRefusesWidthsItsKernelsCannotLaunch) {
  EXPECT_TRUE(cuda_fit(tiny_spec(), QuantRecipe::Q2, Numerics::REFERENCE).has_value());
  EXPECT_TRUE(cuda_fit(tiny_spec(), QuantRecipe::F32, Numerics::PLAIN).has_value());
  std::string e = fit_error(cuda_fit(odd_spec(), QuantRecipe::F32, Numerics::PLAIN));
  const std::string want =
      "the CUDA backend cannot run this model: its attention heads have 96 dims and 3 heads; the "
      "attention kernel takes a multiple of 256 up to 8192 for this head count; use --backend cpu";
  EXPECT_NE(e.find(want), std::string::npos) << e;
  // 3 heads of 128: the split kernel needs 256-multiples then; the tensor-core kernel (reference) takes 128.
  ModelSpec s = tiny_spec();
  s.n_head = 3;
  s.o_groups = 3;
  EXPECT_NE(fit_error(cuda_fit(s, QuantRecipe::F32, Numerics::PLAIN)).find("a multiple of 256"), std::string::npos);
  EXPECT_TRUE(cuda_fit(s, QuantRecipe::F32, Numerics::REFERENCE).has_value());
  s = tiny_spec();
  s.indexer_head_dim = 90;
  e = fit_error(cuda_fit(s, QuantRecipe::F32, Numerics::PLAIN));
  EXPECT_NE(e.find("its indexer heads have 90 dims; the indexer kernel takes multiples of 4"), std::string::npos) << e;
  s = tiny_spec();
  s.n_embd = 100;  // F32 rows of 100 are 25 units of 4; F16 rows are not whole units of 8
  EXPECT_TRUE(cuda_fit(s, QuantRecipe::F32, Numerics::PLAIN).has_value());
  e = fit_error(cuda_fit(s, QuantRecipe::F16, Numerics::PLAIN));
  const std::string want_f16 =
      "token_embd.weight: F16 rows of 100 values, and the CUDA kernels read F16 rows in units of 8 values";
  EXPECT_NE(e.find(want_f16), std::string::npos) << e;
  s.n_embd = 98;  // 4 streams x 98 = 392 = 49 x 8, but not F32 units of 4
  e = fit_error(cuda_fit(s, QuantRecipe::F32, Numerics::PLAIN));
  EXPECT_NE(e.find("F32 rows of 98 values"), std::string::npos) << e;
  s.n_embd = 97;
  e = fit_error(cuda_fit(s, QuantRecipe::F32, Numerics::PLAIN));
  EXPECT_NE(e.find("its mHC state is 4 streams of 97 values"), std::string::npos) << e;
}

TEST(TensorTable, PublishedQ2AndQ4Layouts) {
  // formats.md §1.9: 1328 tensors; by type F32 492, F16 359, Q8_0 345, IQ2_XXS 86, Q2_K 43, I32 3.
  SynthPlan q2 = synth_plan(*find_preset("flash-q2"), 1);
  std::map<GgmlType, int> counts;
  for (const auto& t : q2.tensors) counts[t.type]++;
  EXPECT_EQ(q2.tensors.size(), 1328u);
  EXPECT_EQ(counts[GgmlType::F32], 492);
  EXPECT_EQ(counts[GgmlType::F16], 359);
  EXPECT_EQ(counts[GgmlType::Q8_0], 345);
  EXPECT_EQ(counts[GgmlType::IQ2_XXS], 86);
  EXPECT_EQ(counts[GgmlType::Q2_K], 43);
  EXPECT_EQ(counts[GgmlType::I32], 3);
  EXPECT_EQ(q2.tensor_bytes, 86714775900ull);
  SynthPlan q4 = synth_plan(*find_preset("flash-q4"), 1);
  EXPECT_EQ(q4.tensors.size(), 1328u);
  EXPECT_EQ(q4.tensor_bytes, 164628167004ull);
  // q2-q4: q2 with layers 37-42's routed experts (18 tensors) in Q4_K: 97.59e9 tensor bytes.
  SynthPlan q24 = synth_plan(*find_preset("flash-q2-q4"), 1);
  std::map<GgmlType, int> c24;
  for (const auto& t : q24.tensors) c24[t.type]++;
  EXPECT_EQ(q24.tensors.size(), 1328u);
  EXPECT_EQ(c24[GgmlType::IQ2_XXS], 74);
  EXPECT_EQ(c24[GgmlType::Q2_K], 37);
  EXPECT_EQ(c24[GgmlType::Q4_K], 18);
  EXPECT_EQ(q24.tensor_bytes, 97586411868ull);
  std::map<std::string, GgmlType> t24;
  for (const auto& t : q24.tensors) t24[t.spec.name] = t.type;
  EXPECT_EQ(t24["blk.36.ffn_up_exps.weight"], GgmlType::IQ2_XXS);
  EXPECT_EQ(t24["blk.37.ffn_up_exps.weight"], GgmlType::Q4_K);
  EXPECT_EQ(t24["blk.42.ffn_down_exps.weight"], GgmlType::Q4_K);
  // Per-expert geometry (formats.md §1.7).
  for (const auto& t : q2.tensors) {
    if (t.spec.name == "blk.5.ffn_gate_exps.weight") {
      EXPECT_EQ(t.n_bytes, 553648128ull);
    }
    if (t.spec.name == "blk.5.ffn_down_exps.weight") {
      EXPECT_EQ(t.n_bytes, 704643072ull);
    }
    if (t.spec.name == "token_embd.weight") {
      EXPECT_EQ(t.n_bytes, 1059061760ull);
    }
    if (t.spec.name == "output.weight") {
      EXPECT_EQ(t.n_bytes, 562626560ull);
    }
  }
  std::set<std::string> names;
  for (const auto& t : q2.tensors) EXPECT_TRUE(names.insert(t.spec.name).second) << t.spec.name;
  EXPECT_TRUE(names.count("blk.2.indexer.attn_q_b.weight"));
  EXPECT_TRUE(names.count("blk.2.indexer_compressor_ape.weight"));
  EXPECT_FALSE(names.count("blk.3.indexer.proj.weight"));
  EXPECT_TRUE(names.count("blk.3.attn_compressor_kv.weight"));
  EXPECT_FALSE(names.count("blk.1.attn_compressor_kv.weight"));
  EXPECT_TRUE(names.count("blk.2.ffn_gate_tid2eid.weight"));
  EXPECT_FALSE(names.count("blk.3.ffn_gate_tid2eid.weight"));
  EXPECT_TRUE(names.count("blk.3.exp_probs_b.bias"));
  EXPECT_FALSE(names.count("blk.2.exp_probs_b.bias"));
  // The MTP block: formats.md §1.8.
  auto mtp = mtp_tensor_table(ModelSpec::flash());
  std::set<std::string> mnames;
  for (const auto& t : mtp) mnames.insert(t.name);
  EXPECT_TRUE(mnames.count("mtp.0.e_proj.weight"));
  EXPECT_TRUE(mnames.count("mtp.0.exp_probs_b.bias"));
  EXPECT_FALSE(mnames.count("mtp.0.ffn_gate_tid2eid.weight"));
  EXPECT_FALSE(mnames.count("mtp.0.attn_compressor_kv.weight"));
  EXPECT_EQ(mtp.size(), 8u + 24u);
}

// synth_write generates into a mapping of the file: the bytes are those of the
// streaming writer.
TEST(Weights, SynthWriteEqualsTheStreamingWriter) {
  const SynthPlan plan = synth_plan(*find_preset("tiny"), 5);
  const std::string p1 = temp_path("tiny-mapped.gguf"), p2 = temp_path("tiny-streamed.gguf");
  ASSERT_TRUE(synth_write(plan, p1, 2).has_value());
  ThreadPool pool(2);
  ASSERT_TRUE(synth_writer(plan, pool).write(p2, {}, 1u << 20).has_value());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string a = slurp(p1), b = slurp(p2);
  EXPECT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == b);
  std::filesystem::remove(p1);
  std::filesystem::remove(p2);
}

TEST(Weights, SynthTinyLoads) {
  std::string path = temp_path("tiny.gguf");
  SynthPlan plan = synth_plan(*find_preset("tiny"), 7);
  ASSERT_TRUE(synth_write(plan, path, 2).has_value());
  auto m = open_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const ModelWeights& w = (*m)->weights;
  EXPECT_EQ(w.layers.size(), 6u);
  EXPECT_TRUE(w.mix.published_layout);
  EXPECT_EQ(w.mix.expert_gate_up, GgmlType::IQ2_XXS);
  EXPECT_EQ(w.mix.expert_down, GgmlType::Q2_K);
  EXPECT_EQ(w.mix.routed_bits(), 2);
  EXPECT_TRUE(w.layers[2][LayerTensor::INDEXER_PROJ]);
  EXPECT_FALSE(w.layers[3][LayerTensor::INDEXER_PROJ]);
  EXPECT_TRUE(w.layers[0][LayerTensor::FFN_GATE_TID2EID]);
  EXPECT_TRUE(w.layers[3][LayerTensor::EXP_PROBS_B]);
  EXPECT_EQ(w.n_bytes, plan.tensor_bytes);
  std::filesystem::remove(path);
}

TEST(Weights, AQ2Q4MixLoadsAndIsNamed) {
  // The tiny shape with 8 layers and the q2-q4 recipe: layers 2-7's routed experts Q4_K, 0-1 q2.
  Preset p = *find_preset("tiny");
  p.spec.n_layer = 8;
  p.spec.compress_ratios = {0, 0, 4, 128, 4, 128, 4, 128, 0};
  p.spec.swiglu_clamp.assign(9, 10.0f);
  p.recipe = QuantRecipe::Q2_Q4;
  const std::string path = temp_path("tiny-q2-q4.gguf");
  ASSERT_TRUE(synth_write(synth_plan(p, 3), path, 2).has_value());
  auto m = open_model(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const QuantMix& mix = (*m)->weights.mix;
  EXPECT_EQ(mix.expert_gate_up, GgmlType::IQ2_XXS);
  EXPECT_EQ(mix.tail_layers, 6u);
  EXPECT_EQ(mix.tail_gate_up, GgmlType::Q4_K);
  EXPECT_TRUE(mix.published_layout);
  EXPECT_EQ(
      mix.describe(),
      "q2-q4 (experts IQ2_XXS gate/up, Q2_K down; the last 6 layers' experts Q4_K; dense Q8_0), published layout");
  std::filesystem::remove(path);
}

TEST(Weights, MismatchesNameTensorExpectedAndActual) {
  const Preset preset = *find_preset("tiny");
  const SynthPlan plan = synth_plan(preset, 1);
  auto mutate = [&](const std::function<void(std::vector<SynthTensor>&)>& f) {
    std::vector<SynthTensor> t = plan.tensors;
    f(t);
    return write_variant("variant.gguf", preset.spec, t);
  };
  auto find = [](std::vector<SynthTensor>& v, const std::string& name) -> SynthTensor& {
    for (auto& t : v)
      if (t.spec.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  };
  // Valid as written.
  EXPECT_EQ(bind_error(mutate([](auto&) {})), "");
  // Wrong shape.
  std::string e = bind_error(mutate([&](auto& v) { find(v, "blk.2.attn_q_a.weight").spec.ne = {256, 32}; }));
  EXPECT_NE(e.find("tensor blk.2.attn_q_a.weight: expected shape [256, 64], found [256, 32]"), std::string::npos) << e;
  // Wrong type.
  e = bind_error(mutate([&](auto& v) { find(v, "blk.1.attn_norm.weight").type = GgmlType::F16; }));
  EXPECT_NE(e.find("tensor blk.1.attn_norm.weight: type F16 is not allowed (allowed: F32)"), std::string::npos) << e;
  // MXFP4 binds in routed experts (the published MXFP4 file; the CPU runs it) and nowhere else.
  EXPECT_EQ(bind_error(mutate([&](auto& v) {
              for (const char* n : {"blk.3.ffn_gate_exps.weight", "blk.3.ffn_up_exps.weight"})
                find(v, n).type = GgmlType::MXFP4;
            })),
            "");
  e = bind_error(mutate([&](auto& v) { find(v, "blk.2.attn_q_a.weight").type = GgmlType::MXFP4; }));
  EXPECT_NE(e.find("tensor blk.2.attn_q_a.weight: type MXFP4 is not allowed"), std::string::npos) << e;
  // Missing.
  e = bind_error(mutate([&](auto& v) {
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](const SynthTensor& t) { return t.spec.name == "blk.4.indexer.proj.weight"; }),
            v.end());
  }));
  EXPECT_NE(e.find("missing tensor blk.4.indexer.proj.weight"), std::string::npos) << e;
  // Gate/up types differ.
  e = bind_error(mutate([&](auto& v) { find(v, "blk.0.ffn_up_exps.weight").type = GgmlType::Q4_K; }));
  EXPECT_NE(e.find("gate and up must have the same type"), std::string::npos) << e;
  // Optional bias may be absent; unknown extra tensors are ignored.
  e = bind_error(mutate([&](auto& v) {
    v.erase(std::remove_if(v.begin(), v.end(),
                           [](const SynthTensor& t) { return t.spec.name == "blk.5.exp_probs_b.bias"; }),
            v.end());
    SynthTensor extra = v[1];
    extra.spec.name = "something.else";
    v.push_back(extra);
  }));
  EXPECT_EQ(e, "");
  // Several problems are listed together.
  e = bind_error(mutate([&](auto& v) {
    find(v, "blk.2.attn_q_a.weight").spec.ne = {256, 32};
    find(v, "blk.3.attn_q_a.weight").spec.ne = {256, 32};
  }));
  EXPECT_NE(e.find("2 problems"), std::string::npos) << e;
}

TEST(Weights, HashTableEntriesMustBeExperts) {
  const Preset preset = *find_preset("tiny");
  GgufWriter w;
  preset.spec.write_gguf(w);
  for (const auto& t : synth_plan(preset, 1).tensors) {
    bool table = t.spec.cls == TypeClass::I32_TABLE;
    w.add_tensor(t.spec.name, t.type, t.spec.ne, [table](uint64_t, uint64_t nr, uint8_t* dst) -> Status {
      if (table) {
        int32_t bad = 99;
        std::memcpy(dst + 4, &bad, 4);
      }
      (void)nr;
      return {};
    });
  }
  std::string path = temp_path("badhash.gguf");
  ASSERT_TRUE(w.write(path).has_value());
  std::string e = bind_error(path);
  EXPECT_NE(e.find("is not an expert id"), std::string::npos) << e;
}

TEST(Synth, DeterministicAndChunkIndependent) {
  const SynthPlan a = synth_plan(*find_preset("tiny"), 3);
  std::string p1 = temp_path("s1.gguf"), p2 = temp_path("s2.gguf"), p3 = temp_path("s3.gguf");
  ASSERT_TRUE(synth_write(a, p1, 1).has_value());
  ASSERT_TRUE(synth_write(a, p2, 3).has_value());
  ASSERT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 4), p3, 2).has_value());
  auto hash = [](const std::string& p) {
    auto f = MappedFile::open(p);
    return sha256_hex((*f)->data(), (*f)->size());
  };
  EXPECT_EQ(hash(p1), hash(p2));
  EXPECT_NE(hash(p1), hash(p3));
  // Filling rows one at a time gives the same bytes as one call.
  for (const auto& t : a.tensors) {
    uint64_t rows = t.n_bytes / ggml_row_bytes(t.type, t.spec.ne[0]);
    uint64_t rb = ggml_row_bytes(t.type, t.spec.ne[0]);
    if (rows > 64) rows = 64;
    std::vector<uint8_t> whole(rows * rb), parts(rows * rb);
    synth_fill_rows(a, t, 0, rows, whole.data());
    for (uint64_t r = 0; r < rows; ++r) synth_fill_rows(a, t, r, 1, parts.data() + r * rb);
    ASSERT_EQ(whole, parts) << t.spec.name;
  }
  for (const auto& p : {p1, p2, p3}) std::filesystem::remove(p);
}

TEST(Synth, WeightsAreWellScaled) {
  // Dequantised matrices have element RMS close to 1/sqrt(input width).
  const SynthPlan plan = synth_plan(*find_preset("tiny"), 5);
  for (const auto& t : plan.tensors) {
    bool matrix = t.spec.cls == TypeClass::DENSE_MAT || t.spec.cls == TypeClass::EXPERT_GATE_UP ||
                  t.spec.cls == TypeClass::EXPERT_DOWN;
    if (!matrix) continue;
    uint64_t rb = ggml_row_bytes(t.type, t.spec.ne[0]);
    uint64_t rows = std::min<uint64_t>(32, t.n_bytes / rb);
    std::vector<uint8_t> bytes(rows * rb);
    synth_fill_rows(plan, t, 0, rows, bytes.data());
    std::vector<float> x(t.spec.ne[0]);
    double sq = 0;
    for (uint64_t r = 0; r < rows; ++r) {
      quant::dequantize_row(t.type, bytes.data() + r * rb, x.data(), static_cast<int64_t>(x.size()));
      for (float v : x) {
        ASSERT_TRUE(std::isfinite(v));
        sq += double(v) * v;
      }
    }
    double rms = std::sqrt(sq / double(rows * x.size()));
    double want = 1.0 / std::sqrt(double(t.spec.ne[0]));
    EXPECT_NEAR(rms / want, 1.0, 0.25) << t.spec.name << " " << ggml_type_name(t.type);
  }
}

TEST(SynthVocab, FullSizeHasPublishedSpecialIds) {
  SynthVocab v = make_synth_vocab(129280);
  ASSERT_EQ(v.tokens.size(), 129280u);
  EXPECT_EQ(v.tokens[0], special::BOS);
  EXPECT_EQ(v.tokens[1], special::EOS);
  EXPECT_EQ(v.tokens[128803], special::USER);
  EXPECT_EQ(v.tokens[128804], special::ASSISTANT);
  EXPECT_EQ(v.tokens[128821], special::THINK);
  EXPECT_EQ(v.tokens[128822], special::THINK_END);
  EXPECT_EQ(v.tokens[128825], special::DSML);
  EXPECT_EQ(v.tokens[128828], special::LATEST_REMINDER);
  std::set<std::string> uniq(v.tokens.begin(), v.tokens.end());
  EXPECT_EQ(uniq.size(), v.tokens.size());
  // Every merge joins two known tokens into a known token.
  for (const auto& m : v.merges) {
    auto sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos);
    std::string l = m.substr(0, sp), r = m.substr(sp + 1);
    ASSERT_TRUE(uniq.count(l) && uniq.count(r) && uniq.count(l + r)) << m;
  }
  EXPECT_GT(v.merges.size(), 100000u);
  SynthVocab t = make_synth_vocab(512);
  EXPECT_EQ(t.tokens.size(), 512u);
  EXPECT_EQ(std::set<std::string>(t.tokens.begin(), t.tokens.end()).size(), 512u);
}
