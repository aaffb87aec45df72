// Tests of src/hf, model description: config.json parsing (release and transformers spellings),
// the checkpoint -> GGUF name map and conversion plan, and a converted checkpoint end to end.
// Safetensors files and readers: test_hf.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/float_conv.h"
#include "core/rng.h"
#include "hf/hf_config.h"
#include "hf/hf_names.h"
#include "hf/safetensors.h"
#include "hf_test_util.h"

using namespace dsv4;
using namespace dsv4::hftest;
namespace fs = std::filesystem;

namespace {

// DeepSeek V4 Flash's release config (model-spec.md §1.1 values, release field names).
nlohmann::ordered_json flash_release_config() {
  nlohmann::ordered_json j;
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["model_type"] = "deepseek_v4";
  j["vocab_size"] = 129280;
  j["hidden_size"] = 4096;
  j["num_hidden_layers"] = 43;
  j["num_attention_heads"] = 64;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = 512;
  j["qk_rope_head_dim"] = 64;
  j["q_lora_rank"] = 1024;
  j["o_groups"] = 8;
  j["o_lora_rank"] = 1024;
  j["sliding_window"] = 128;
  std::vector<int> ratios = {0, 0};
  for (int l = 2; l < 43; ++l) ratios.push_back(l % 2 == 0 ? 4 : 128);
  ratios.push_back(0);  // MTP block
  j["compress_ratios"] = ratios;
  j["rope_theta"] = 10000;
  j["compress_rope_theta"] = 160000;
  j["rope_scaling"] = {{"type", "yarn"},
                       {"factor", 16},
                       {"original_max_position_embeddings", 65536},
                       {"beta_fast", 32},
                       {"beta_slow", 1}};
  j["max_position_embeddings"] = 1048576;
  j["index_n_heads"] = 64;
  j["index_head_dim"] = 128;
  j["index_topk"] = 512;
  j["hc_mult"] = 4;
  j["hc_sinkhorn_iters"] = 20;
  j["hc_eps"] = 1e-6;
  j["rms_norm_eps"] = 1e-6;
  j["n_routed_experts"] = 256;
  j["num_experts_per_tok"] = 6;
  j["n_shared_experts"] = 1;
  j["moe_intermediate_size"] = 2048;
  j["scoring_func"] = "sqrtsoftplus";
  j["norm_topk_prob"] = true;
  j["topk_method"] = "noaux_tc";
  j["routed_scaling_factor"] = 1.5;
  j["num_hash_layers"] = 3;
  j["swiglu_limit"] = 10.0;
  j["num_nextn_predict_layers"] = 1;
  j["tie_word_embeddings"] = false;
  j["bos_token_id"] = 0;
  j["eos_token_id"] = 1;
  j["expert_dtype"] = "fp4";
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}};
  j["torch_dtype"] = "bfloat16";
  return j;
}

// config.json exactly as transformers 5.17 save_pretrained wrote it for the golden tiny model
// (tools/golden/make_golden.py, flash_tiny).
const char* k_transformers_tiny_config = R"({
  "architectures": ["DeepseekV4ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 0,
  "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
  "compress_rope_theta": 160000.0, "dtype": "bfloat16", "eos_token_id": 1, "hc_eps": 1e-06, "hc_mult": 4,
  "hc_sinkhorn_iters": 20, "head_dim": 128, "hidden_act": "silu", "hidden_size": 256, "index_head_dim": 128,
  "index_n_heads": 16, "index_topk": 32, "initializer_range": 0.02,
  "layer_types": ["sliding_attention", "sliding_attention", "compressed_sparse_attention",
                  "heavily_compressed_attention"],
  "max_position_embeddings": 1048576, "mlp_bias": false,
  "mlp_layer_types": ["hash_moe", "hash_moe", "hash_moe", "moe"],
  "model_type": "deepseek_v4", "moe_intermediate_size": 256, "n_routed_experts": 4, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 4, "num_experts_per_tok": 2, "num_hidden_layers": 4,
  "num_key_value_heads": 1, "num_nextn_predict_layers": 0, "o_groups": 2, "o_lora_rank": 64,
  "output_router_logits": false, "pad_token_id": null, "partial_rotary_factor": 0.5, "q_lora_rank": 64,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "compress": {"attention_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0,
                 "original_max_position_embeddings": 65536, "partial_rotary_factor": 0.5,
                 "rope_theta": 160000.0, "rope_type": "yarn"},
    "main": {"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "rope_type": "default"}},
  "rope_theta": 10000.0, "routed_scaling_factor": 1.5, "router_aux_loss_coef": 0.001,
  "router_jitter_noise": 0.0, "scoring_func": "sqrtsoftplus", "sliding_window": 128, "swiglu_limit": 10.0,
  "tie_word_embeddings": false, "transformers_version": "5.17.0", "use_cache": false, "vocab_size": 300
})";

HfConfig parse_ok(const std::string& text) {
  auto c = hf_config_parse(text);
  EXPECT_TRUE(c.has_value()) << c.error().message;
  return c.has_value() ? *c : HfConfig{};
}

void expect_config_error(const std::string& text, const std::string& needle) {
  auto c = hf_config_parse(text);
  ASSERT_FALSE(c.has_value()) << "accepted; expected: " << needle;
  EXPECT_NE(c.error().message.find(needle), std::string::npos) << c.error().message;
}

// Flash release config with one field replaced (null deletes it).
std::string flash_with(const std::string& key, const nlohmann::ordered_json& value) {
  auto j = flash_release_config();
  if (value.is_null())
    j.erase(key);
  else
    j[key] = value;
  return j.dump();
}

}  // namespace

TEST(HfConfig, FlashReleaseConfig) {
  HfConfig c = parse_ok(flash_release_config().dump());
  EXPECT_EQ(c.model_type, "deepseek_v4");
  EXPECT_EQ(c.vocab_size, 129280u);
  EXPECT_EQ(c.hidden_size, 4096u);
  EXPECT_EQ(c.num_hidden_layers, 43u);
  EXPECT_EQ(c.num_attention_heads, 64u);
  EXPECT_EQ(c.head_dim, 512u);
  EXPECT_EQ(c.qk_rope_head_dim, 64u);
  EXPECT_EQ(c.q_lora_rank, 1024u);
  EXPECT_EQ(c.o_groups, 8u);
  EXPECT_EQ(c.o_lora_rank, 1024u);
  EXPECT_EQ(c.sliding_window, 128u);
  EXPECT_EQ(c.schedule_source, HfScheduleSource::COMPRESS_RATIOS);
  ASSERT_EQ(c.compress_ratios.size(), 43u);
  for (uint32_t l = 0; l < 43; ++l) EXPECT_EQ(c.ratio(l), l < 2 ? 0u : (l % 2 == 0 ? 4u : 128u)) << l;
  EXPECT_EQ(c.mtp_compress_ratio, 0u);
  EXPECT_EQ(c.index_n_heads, 64u);
  EXPECT_EQ(c.index_head_dim, 128u);
  EXPECT_EQ(c.index_topk, 512u);
  EXPECT_EQ(c.hc_mult, 4u);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20u);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.n_routed_experts, 256u);
  EXPECT_EQ(c.num_experts_per_tok, 6u);
  EXPECT_EQ(c.n_shared_experts, 1u);
  EXPECT_EQ(c.moe_intermediate_size, 2048u);
  EXPECT_EQ(c.num_hash_layers, 3u);
  EXPECT_TRUE(c.is_hash_layer(2));
  EXPECT_FALSE(c.is_hash_layer(3));
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_DOUBLE_EQ(c.yarn.factor, 16.0);
  EXPECT_EQ(c.yarn.original_max_position_embeddings, 65536u);
  EXPECT_DOUBLE_EQ(c.yarn.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.yarn.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c.yarn.attention_factor, 1.0);
  EXPECT_EQ(c.max_position_embeddings, 1048576u);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(c.num_nextn_predict_layers, 1u);
  EXPECT_EQ(c.expert_dtype, "fp4");
  EXPECT_TRUE(c.fp8_quantized);
  EXPECT_TRUE(c.defaulted.empty()) << c.defaulted.front();
}

TEST(HfConfig, TransformersSavedConfig) {
  HfConfig c = parse_ok(k_transformers_tiny_config);
  EXPECT_EQ(c.schedule_source, HfScheduleSource::LAYER_TYPES);
  EXPECT_EQ(c.compress_ratios, (std::vector<uint32_t>{0, 0, 4, 128}));
  EXPECT_EQ(c.num_hash_layers, 3u);
  EXPECT_EQ(c.qk_rope_head_dim, 64u);
  EXPECT_EQ(c.index_topk, 32u);
  EXPECT_EQ(c.index_n_heads, 16u);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.compress_rope_theta, 160000.0);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_DOUBLE_EQ(c.yarn.factor, 16.0);
  EXPECT_EQ(c.yarn.original_max_position_embeddings, 65536u);
  EXPECT_EQ(c.num_nextn_predict_layers, 0u);
  EXPECT_FALSE(c.fp8_quantized);
  // present fields only; "pad_token_id": null is ignored
  for (const auto& d : c.defaulted) EXPECT_TRUE(d == "expert_dtype" || d == "rope_scaling") << d;
}

TEST(HfConfig, TransformersDefaultsAndAlternativeSpellings) {
  // Only the required dimensions: everything else takes transformers' defaults.
  std::string minimal = R"({"vocab_size": 300, "hidden_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4,
    "head_dim": 512, "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 64, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 256})";
  HfConfig c = parse_ok(minimal);
  EXPECT_EQ(c.schedule_source, HfScheduleSource::DEFAULT);
  // transformers' DeepseekV4Config default schedule: 2x HCA, then alternating starting with HCA
  EXPECT_EQ(c.compress_ratios, (std::vector<uint32_t>{128, 128, 128, 4, 128, 4}));
  EXPECT_EQ(c.qk_rope_head_dim, 64u);  // 512 * 64/512
  EXPECT_EQ(c.num_hash_layers, 3u);
  EXPECT_FALSE(c.yarn.enabled);
  std::set<std::string> d(c.defaulted.begin(), c.defaulted.end());
  for (const char* k : {"sliding_window", "hc_mult", "index_topk", "num_hash_layers", "compress_ratios",
                        "qk_rope_head_dim", "rope_scaling", "eos_token_id"})
    EXPECT_TRUE(d.count(k)) << k;

  // flat rope_parameters (yarn) and integral floats, eos as a list
  std::string flat = R"({"vocab_size": 300.0, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
    "head_dim": 128, "q_lora_rank": 64, "o_groups": 2, "o_lora_rank": 64, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 256, "compress_ratios": [0, 0, 4, 128],
    "partial_rotary_factor": 0.5, "eos_token_id": [1, 2],
    "rope_parameters": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096}})";
  HfConfig f = parse_ok(flat);
  EXPECT_EQ(f.vocab_size, 300u);
  EXPECT_EQ(f.qk_rope_head_dim, 64u);
  EXPECT_TRUE(f.yarn.enabled);
  EXPECT_DOUBLE_EQ(f.yarn.factor, 4.0);
  EXPECT_EQ(f.eos_token_ids, (std::vector<int64_t>{1, 2}));
}

// Shapes transformers' DeepseekV4 builds although `reference` numerics cannot run them (those
// are refused when the converted model is loaded, not here).
TEST(HfConfig, AcceptsEveryTransformersShape) {
  HfConfig a = parse_ok(flash_with("head_dim", 96));  // 32 non-RoPE dims: no FP8 64-block
  EXPECT_EQ(a.head_dim - a.qk_rope_head_dim, 32u);
  EXPECT_EQ(parse_ok(flash_with("index_head_dim", 96)).index_head_dim, 96u);  // no power of two
  EXPECT_EQ(parse_ok(flash_with("hidden_size", 200)).hidden_size, 200u);      // no multiple of 32
  auto j = flash_release_config();
  j["num_attention_heads"] = 3;  // 3 x 512 head outputs in 8 groups of 192: a group cuts a head
  EXPECT_EQ(parse_ok(j.dump()).o_groups, 8u);
  j = flash_release_config();
  j["index_head_dim"] = 32;  // narrower than the RoPE tail, but no layer has an indexer
  j["compress_ratios"] = std::vector<int>(44, 128);
  j["compress_ratios"][43] = 0;
  EXPECT_EQ(parse_ok(j.dump()).index_head_dim, 32u);
}

TEST(HfConfig, LoadsFromFolderOrFile) {
  TempDir dir;
  dir.write_text("config.json", k_transformers_tiny_config);
  auto a = hf_config_load(dir.path.string());
  ASSERT_TRUE(a.has_value()) << a.error().message;
  EXPECT_EQ(a->hidden_size, 256u);
  auto b = hf_config_load((dir.path / "config.json").string());
  ASSERT_TRUE(b.has_value());
  auto missing = hf_config_load((dir.path / "nope").string());
  EXPECT_FALSE(missing.has_value());
}

TEST(HfConfig, RejectsInvalidConfigs) {
  expect_config_error("{not json", "JSON syntax error");
  expect_config_error("[1]", "not a JSON object");
  expect_config_error(flash_with("hidden_size", nullptr), "required field \"hidden_size\" is missing");
  expect_config_error(flash_with("head_dim", -512), "\"head_dim\" is not a non-negative 32-bit integer");
  expect_config_error(flash_with("head_dim", 512.5), "\"head_dim\" is not a non-negative 32-bit integer");
  expect_config_error(flash_with("num_hidden_layers", 0), "\"num_hidden_layers\" must be >= 1");
  expect_config_error(flash_with("hc_eps", "tiny"), "\"hc_eps\" is not a number");
  expect_config_error(flash_with("norm_topk_prob", 1), "\"norm_topk_prob\" is not a boolean");
  expect_config_error(flash_with("model_type", "llama"), "not a DeepSeek V4 model");
  expect_config_error(flash_with("compress_ratios", std::vector<int>{0, 0, 4}), "one entry per layer");
  auto r = flash_release_config();
  r["compress_ratios"][5] = 8;
  expect_config_error(r.dump(), "layer 5 has compress ratio 8");
  expect_config_error(flash_with("num_key_value_heads", 2), "one shared K=V head");
  expect_config_error(flash_with("qk_rope_head_dim", 63), "qk_rope_head_dim = 63 must be even");
  expect_config_error(flash_with("index_head_dim", 32), "qk_rope_head_dim = 64 exceeds index_head_dim = 32");
  expect_config_error(flash_with("o_groups", 7),
                      "num_attention_heads x head_dim = 64 x 512 is not a multiple of o_groups = 7");
  expect_config_error(flash_with("num_experts_per_tok", 300), "exceeds n_routed_experts");
  expect_config_error(flash_with("num_hash_layers", 44), "num_hash_layers = 44 exceeds");
  expect_config_error(flash_with("scoring_func", "softmax"), "scoring_func \"softmax\" is not supported");
  expect_config_error(flash_with("tie_word_embeddings", true), "untied head");
  expect_config_error(flash_with("eos_token_id", "x"), "eos_token_id");
  expect_config_error(flash_with("bos_token_id", 200000), "bos_token_id 200000 outside the vocabulary");
  expect_config_error(flash_with("rope_scaling", nlohmann::ordered_json{{"type", "linear"}, {"factor", 2}}),
                      "unsupported rope type \"linear\"");
  expect_config_error(flash_with("rope_scaling", nlohmann::ordered_json{{"type", "yarn"}, {"factor", 16}}),
                      "original_max_position_embeddings");
  {
    std::string t = k_transformers_tiny_config;
    auto j = nlohmann::json::parse(t);
    j["rope_parameters"]["compress"]["attention_factor"] = 1.2772588722239781;
    expect_config_error(j.dump(), "never scales cos/sin");
    j = nlohmann::json::parse(t);
    j["mlp_layer_types"] = {"hash_moe", "moe", "hash_moe", "moe"};
    expect_config_error(j.dump(), "mlp_layer_types[2] is hash_moe after a moe layer");
    j = nlohmann::json::parse(t);
    j["mlp_layer_types"] = {"hash_moe", "dense", "moe", "moe"};
    expect_config_error(j.dump(), "\"dense\"");
    j = nlohmann::json::parse(t);
    j["partial_rotary_factor"] = 0.25;  // 32 dims, but qk_rope_head_dim says 64
    expect_config_error(j.dump(), "disagrees with qk_rope_head_dim");
    j = nlohmann::json::parse(t);
    j["layer_types"][1] = "full_attention";
    expect_config_error(j.dump(), "unknown layer type \"full_attention\"");
    j = nlohmann::json::parse(t);
    j["num_hash_layers"] = 2;
    expect_config_error(j.dump(), "num_hash_layers = 2 disagrees with mlp_layer_types");
    j = nlohmann::json::parse(t);
    j["rope_parameters"]["main"]["rope_type"] = "yarn";
    expect_config_error(j.dump(), "ratio-0 layers use plain RoPE");
  }
  expect_config_error(R"({"hidden_size": 1, "hidden_size": 2})", "duplicate key \"hidden_size\"");
}

// =================================================================================================
// names and conversion plans
// =================================================================================================

namespace {

// Every tensor transformers 5.17 save_pretrained wrote for the golden tiny model (flash_tiny:
// 4 layers [0, 0, 4, 128], 3 hash layers, 4 experts, bf16), as "name shape dtype".
const char* k_transformers_saved_tiny =
    "head.weight 300x256 bfloat16\n"
    "model.embed_tokens.weight 300x256 bfloat16\n"
    "model.hc_head.hc_base 4 bfloat16\n"
    "model.hc_head.hc_fn 4x1024 bfloat16\n"
    "model.hc_head.hc_scale 1 bfloat16\n"
    "model.layers.0.attn.attn_sink 4 bfloat16\n"
    "model.layers.0.attn.norm.weight 128 bfloat16\n"
    "model.layers.0.attn.q_norm.weight 64 bfloat16\n"
    "model.layers.0.attn.wkv.weight 128x256 bfloat16\n"
    "model.layers.0.attn.wo_a.weight 128x256 bfloat16\n"
    "model.layers.0.attn.wo_b.weight 256x128 bfloat16\n"
    "model.layers.0.attn.wq_a.weight 64x256 bfloat16\n"
    "model.layers.0.attn.wq_b.weight 512x64 bfloat16\n"
    "model.layers.0.attn_norm.weight 256 bfloat16\n"
    "model.layers.0.ffn.experts.0.w1.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.0.w2.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.0.w3.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.1.w1.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.1.w2.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.1.w3.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.2.w1.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.2.w2.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.2.w3.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.3.w1.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.3.w2.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.experts.3.w3.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.gate.tid2eid 300x2 int64\n"
    "model.layers.0.ffn.gate.weight 4x256 bfloat16\n"
    "model.layers.0.ffn.shared_experts.w1.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.shared_experts.w2.weight 256x256 bfloat16\n"
    "model.layers.0.ffn.shared_experts.w3.weight 256x256 bfloat16\n"
    "model.layers.0.ffn_norm.weight 256 bfloat16\n"
    "model.layers.0.hc_attn_base 24 bfloat16\n"
    "model.layers.0.hc_attn_fn 24x1024 bfloat16\n"
    "model.layers.0.hc_attn_scale 3 bfloat16\n"
    "model.layers.0.hc_ffn_base 24 bfloat16\n"
    "model.layers.0.hc_ffn_fn 24x1024 bfloat16\n"
    "model.layers.0.hc_ffn_scale 3 bfloat16\n"
    "model.layers.1.attn.attn_sink 4 bfloat16\n"
    "model.layers.1.attn.norm.weight 128 bfloat16\n"
    "model.layers.1.attn.q_norm.weight 64 bfloat16\n"
    "model.layers.1.attn.wkv.weight 128x256 bfloat16\n"
    "model.layers.1.attn.wo_a.weight 128x256 bfloat16\n"
    "model.layers.1.attn.wo_b.weight 256x128 bfloat16\n"
    "model.layers.1.attn.wq_a.weight 64x256 bfloat16\n"
    "model.layers.1.attn.wq_b.weight 512x64 bfloat16\n"
    "model.layers.1.attn_norm.weight 256 bfloat16\n"
    "model.layers.1.ffn.experts.0.w1.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.0.w2.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.0.w3.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.1.w1.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.1.w2.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.1.w3.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.2.w1.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.2.w2.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.2.w3.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.3.w1.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.3.w2.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.experts.3.w3.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.gate.tid2eid 300x2 int64\n"
    "model.layers.1.ffn.gate.weight 4x256 bfloat16\n"
    "model.layers.1.ffn.shared_experts.w1.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.shared_experts.w2.weight 256x256 bfloat16\n"
    "model.layers.1.ffn.shared_experts.w3.weight 256x256 bfloat16\n"
    "model.layers.1.ffn_norm.weight 256 bfloat16\n"
    "model.layers.1.hc_attn_base 24 bfloat16\n"
    "model.layers.1.hc_attn_fn 24x1024 bfloat16\n"
    "model.layers.1.hc_attn_scale 3 bfloat16\n"
    "model.layers.1.hc_ffn_base 24 bfloat16\n"
    "model.layers.1.hc_ffn_fn 24x1024 bfloat16\n"
    "model.layers.1.hc_ffn_scale 3 bfloat16\n"
    "model.layers.2.attn.attn_sink 4 bfloat16\n"
    "model.layers.2.attn.compressor.ape 4x256 bfloat16\n"
    "model.layers.2.attn.compressor.norm.weight 128 bfloat16\n"
    "model.layers.2.attn.compressor.wgate.weight 256x256 bfloat16\n"
    "model.layers.2.attn.compressor.wkv.weight 256x256 bfloat16\n"
    "model.layers.2.attn.indexer.compressor.ape 4x256 bfloat16\n"
    "model.layers.2.attn.indexer.compressor.norm.weight 128 bfloat16\n"
    "model.layers.2.attn.indexer.compressor.wgate.weight 256x256 bfloat16\n"
    "model.layers.2.attn.indexer.compressor.wkv.weight 256x256 bfloat16\n"
    "model.layers.2.attn.indexer.weights_proj.weight 16x256 bfloat16\n"
    "model.layers.2.attn.indexer.wq_b.weight 2048x64 bfloat16\n"
    "model.layers.2.attn.norm.weight 128 bfloat16\n"
    "model.layers.2.attn.q_norm.weight 64 bfloat16\n"
    "model.layers.2.attn.wkv.weight 128x256 bfloat16\n"
    "model.layers.2.attn.wo_a.weight 128x256 bfloat16\n"
    "model.layers.2.attn.wo_b.weight 256x128 bfloat16\n"
    "model.layers.2.attn.wq_a.weight 64x256 bfloat16\n"
    "model.layers.2.attn.wq_b.weight 512x64 bfloat16\n"
    "model.layers.2.attn_norm.weight 256 bfloat16\n"
    "model.layers.2.ffn.experts.0.w1.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.0.w2.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.0.w3.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.1.w1.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.1.w2.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.1.w3.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.2.w1.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.2.w2.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.2.w3.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.3.w1.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.3.w2.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.experts.3.w3.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.gate.tid2eid 300x2 int64\n"
    "model.layers.2.ffn.gate.weight 4x256 bfloat16\n"
    "model.layers.2.ffn.shared_experts.w1.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.shared_experts.w2.weight 256x256 bfloat16\n"
    "model.layers.2.ffn.shared_experts.w3.weight 256x256 bfloat16\n"
    "model.layers.2.ffn_norm.weight 256 bfloat16\n"
    "model.layers.2.hc_attn_base 24 bfloat16\n"
    "model.layers.2.hc_attn_fn 24x1024 bfloat16\n"
    "model.layers.2.hc_attn_scale 3 bfloat16\n"
    "model.layers.2.hc_ffn_base 24 bfloat16\n"
    "model.layers.2.hc_ffn_fn 24x1024 bfloat16\n"
    "model.layers.2.hc_ffn_scale 3 bfloat16\n"
    "model.layers.3.attn.attn_sink 4 bfloat16\n"
    "model.layers.3.attn.compressor.ape 128x128 bfloat16\n"
    "model.layers.3.attn.compressor.norm.weight 128 bfloat16\n"
    "model.layers.3.attn.compressor.wgate.weight 128x256 bfloat16\n"
    "model.layers.3.attn.compressor.wkv.weight 128x256 bfloat16\n"
    "model.layers.3.attn.norm.weight 128 bfloat16\n"
    "model.layers.3.attn.q_norm.weight 64 bfloat16\n"
    "model.layers.3.attn.wkv.weight 128x256 bfloat16\n"
    "model.layers.3.attn.wo_a.weight 128x256 bfloat16\n"
    "model.layers.3.attn.wo_b.weight 256x128 bfloat16\n"
    "model.layers.3.attn.wq_a.weight 64x256 bfloat16\n"
    "model.layers.3.attn.wq_b.weight 512x64 bfloat16\n"
    "model.layers.3.attn_norm.weight 256 bfloat16\n"
    "model.layers.3.ffn.experts.0.w1.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.0.w2.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.0.w3.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.1.w1.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.1.w2.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.1.w3.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.2.w1.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.2.w2.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.2.w3.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.3.w1.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.3.w2.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.experts.3.w3.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.gate.bias 4 bfloat16\n"
    "model.layers.3.ffn.gate.weight 4x256 bfloat16\n"
    "model.layers.3.ffn.shared_experts.w1.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.shared_experts.w2.weight 256x256 bfloat16\n"
    "model.layers.3.ffn.shared_experts.w3.weight 256x256 bfloat16\n"
    "model.layers.3.ffn_norm.weight 256 bfloat16\n"
    "model.layers.3.hc_attn_base 24 bfloat16\n"
    "model.layers.3.hc_attn_fn 24x1024 bfloat16\n"
    "model.layers.3.hc_attn_scale 3 bfloat16\n"
    "model.layers.3.hc_ffn_base 24 bfloat16\n"
    "model.layers.3.hc_ffn_fn 24x1024 bfloat16\n"
    "model.layers.3.hc_ffn_scale 3 bfloat16\n"
    "model.norm.weight 256 bfloat16\n";

HfConfig tiny_config() { return parse_ok(k_transformers_tiny_config); }

// Descriptions in a given spelling for every tensor of `c` (bf16 weights, I64 hash tables).
std::vector<HfTensorDesc> descs_for(const HfConfig& c, HfSpelling sp, bool mtp = false) {
  std::vector<HfTensorDesc> out;
  for (const auto& id : hf_expected_tensors(c, sp, mtp)) {
    auto name = hf_tensor_name(id, sp);
    EXPECT_TRUE(name.has_value()) << hf_id_string(id);
    if (!name) continue;
    out.push_back({*name, id.role == HfRole::FFN_TID2EID ? StDtype::I64 : StDtype::BF16, hf_logical_shape(c, id)});
  }
  return out;
}

HfConversionPlan plan_ok(const HfConfig& c, const std::vector<HfTensorDesc>& d, HfPlanOptions o = {}) {
  auto p = hf_plan_conversion(c, d, o);
  EXPECT_TRUE(p.has_value()) << p.error().message;
  return p.has_value() ? *p : HfConversionPlan{};
}

void expect_plan_error(const HfConfig& c, const std::vector<HfTensorDesc>& d, const std::string& needle,
                       HfPlanOptions o = {}) {
  auto p = hf_plan_conversion(c, d, o);
  ASSERT_FALSE(p.has_value()) << "plan accepted; expected: " << needle;
  EXPECT_NE(p.error().message.find(needle), std::string::npos) << p.error().message;
}

}  // namespace

TEST(HfNames, KnownSpellings) {
  auto id = [](const char* n) { return hf_parse_tensor_name(n); };
  // the attention kv_norm under its three spellings
  for (const char* n : {"layers.3.attn.kv_norm.weight", "model.layers.3.attn.norm.weight",
                        "model.layers.3.self_attn.kv_norm.weight", "model.layers.3.attn.kv_norm.weight"}) {
    auto x = id(n);
    ASSERT_TRUE(x.has_value()) << n;
    EXPECT_EQ(*x, (HfTensorId{HfRole::ATTN_KV_NORM, 3, -1, false})) << n;
  }
  const HfTensorId kvn{HfRole::ATTN_KV_NORM, 3, -1, false};
  EXPECT_EQ(hf_tensor_name(kvn, HfSpelling::RELEASE), "layers.3.attn.kv_norm.weight");
  EXPECT_EQ(hf_tensor_name(kvn, HfSpelling::TRANSFORMERS_SAVED), "model.layers.3.attn.norm.weight");
  EXPECT_EQ(hf_tensor_name(kvn, HfSpelling::TRANSFORMERS_MODULE), "model.layers.3.self_attn.kv_norm.weight");
  EXPECT_EQ(hf_gguf_name(kvn), "blk.3.attn_kv_a_norm.weight");
  // the compressor's norm is a different tensor
  EXPECT_EQ(*id("layers.3.attn.compressor.norm.weight"), (HfTensorId{HfRole::CMP_NORM, 3, -1, false}));
  EXPECT_EQ(*id("model.layers.2.self_attn.compressor.indexer.kv_norm.weight"),
            (HfTensorId{HfRole::IDX_CMP_NORM, 2, -1, false}));
  // experts
  auto e = id("layers.2.ffn.experts.7.w3.weight");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(*e, (HfTensorId{HfRole::EXPERT_UP, 2, 7, false}));
  EXPECT_EQ(hf_gguf_name(*e), "blk.2.ffn_up_exps.weight");
  EXPECT_EQ(*id("model.layers.2.ffn.experts.0.w1.weight"), (HfTensorId{HfRole::EXPERT_GATE, 2, 0, false}));
  EXPECT_EQ(*id("model.layers.2.mlp.experts.3.down_proj.weight"), (HfTensorId{HfRole::EXPERT_DOWN, 2, 3, false}));
  EXPECT_EQ(*id("model.layers.5.mlp.experts.gate_up_proj"), (HfTensorId{HfRole::FUSED_GATE_UP, 5, -1, false}));
  // trunk, every spelling
  EXPECT_EQ(id("head.weight")->role, HfRole::OUTPUT);
  EXPECT_EQ(id("lm_head.weight")->role, HfRole::OUTPUT);
  EXPECT_EQ(id("embed.weight")->role, HfRole::TOKEN_EMBD);
  EXPECT_EQ(id("model.embed_tokens.weight")->role, HfRole::TOKEN_EMBD);
  EXPECT_EQ(id("norm.weight")->role, HfRole::OUTPUT_NORM);
  EXPECT_EQ(id("model.hc_head.hc_fn")->role, HfRole::OUTPUT_HC_FN);
  EXPECT_EQ(id("hc_head_scale")->role, HfRole::OUTPUT_HC_SCALE);
  EXPECT_EQ(hf_gguf_name(*id("hc_head_base")), "output_hc_base.weight");
  EXPECT_EQ(hf_gguf_name(*id("head.weight")), "output.weight");
  // routing tables
  EXPECT_EQ(hf_gguf_name(*id("layers.0.ffn.gate.tid2eid")), "blk.0.ffn_gate_tid2eid.weight");
  EXPECT_EQ(hf_gguf_name(*id("model.layers.4.mlp.gate.e_score_correction_bias")), "blk.4.exp_probs_b.bias");
  EXPECT_EQ(hf_gguf_name(*id("layers.4.attn.indexer.weights_proj.weight")), "blk.4.indexer.proj.weight");
  EXPECT_EQ(hf_gguf_name(*id("layers.4.attn.indexer.compressor.ape")), "blk.4.indexer_compressor_ape.weight");
  EXPECT_EQ(hf_gguf_name(*id("layers.4.hc_ffn_fn")), "blk.4.hc_ffn_fn.weight");
  // MTP
  EXPECT_EQ(*id("mtp.0.e_proj.weight"), (HfTensorId{HfRole::MTP_E_PROJ, 0, -1, true}));
  EXPECT_EQ(hf_gguf_name(*id("mtp.0.hc_head_fn")), "mtp.0.hc_head_fn.weight");
  EXPECT_EQ(hf_gguf_name(*id("mtp.0.attn.wq_a.weight")), "mtp.0.attn_q_a.weight");
  EXPECT_EQ(hf_gguf_name(*id("mtp.0.norm.weight")), "mtp.0.norm.weight");
  // not model tensors
  for (const char* n : {"layers.3.attn.wq_a.scale", "layers.01.attn.wq_a.weight", "layers.x.attn.wq_a.weight",
                        "layers.3.attn.wq_c.weight", "layers.3.ffn.experts.1.w4.weight", "layers.3", "", "model.",
                        "rotary_emb.inv_freq", "layers.3.ffn.experts.a.w1.weight", "mtp.x.e_proj.weight"})
    EXPECT_FALSE(id(n).has_value()) << n;
}

TEST(HfNames, RoundTripEveryTensorOfTinyAndFlashConfigs) {
  const HfConfig flash = parse_ok(flash_release_config().dump());
  const HfConfig tiny = tiny_config();
  for (const HfConfig* c : std::vector<const HfConfig*>{&flash, nullptr}) {
    const HfConfig& cfg = c ? *c : tiny;
    for (HfSpelling sp : {HfSpelling::RELEASE, HfSpelling::TRANSFORMERS_SAVED, HfSpelling::TRANSFORMERS_MODULE}) {
      std::set<std::string> names;
      const auto ids = hf_expected_tensors(cfg, sp, /*include_mtp=*/true);
      for (const auto& id : ids) {
        auto name = hf_tensor_name(id, sp);
        ASSERT_TRUE(name.has_value()) << hf_id_string(id);
        EXPECT_TRUE(names.insert(*name).second) << "duplicate name " << *name;
        auto back = hf_parse_tensor_name(*name);
        ASSERT_TRUE(back.has_value()) << *name;
        EXPECT_EQ(*back, id) << *name;
        auto prefixed = hf_parse_tensor_name(name->rfind("model.", 0) == 0 ? *name : "model." + *name);
        ASSERT_TRUE(prefixed.has_value()) << *name;
        EXPECT_EQ(*prefixed, id) << *name;
        if (id.role != HfRole::FUSED_GATE_UP && id.role != HfRole::FUSED_DOWN) {
          EXPECT_FALSE(hf_gguf_name(id).empty()) << *name;
        }
      }
      // counts: RELEASE with MTP for flash = trunk + layers + MTP
      if (c && sp == HfSpelling::RELEASE) {
        size_t per_layer_base = 25 - 3 + 3 * 256;  // 25 GGUF rows minus stacked experts plus per-expert tensors
        size_t n = 6;
        for (uint32_t l = 0; l < 43; ++l) {
          n += per_layer_base - 1;  // tid2eid or bias
          if (cfg.ratio(l) != 0) n += 4;
          if (cfg.ratio(l) == 4) n += 6;
        }
        n += 8 + per_layer_base - 1;  // MTP head + block (bias, no tid2eid, ratio 0)
        EXPECT_EQ(ids.size(), n);
      }
    }
  }
}

TEST(HfNames, MatchesWhatTransformersSaved) {
  // The list observed from transformers 5.17 equals what the map predicts for the tiny config,
  // and every observed shape equals the config-derived shape.
  HfConfig c = tiny_config();
  std::set<std::string> observed;
  std::istringstream in(k_transformers_saved_tiny);
  std::string name, dims, dtype;
  std::vector<HfTensorDesc> descs;
  while (in >> name >> dims >> dtype) {
    observed.insert(name);
    std::vector<uint64_t> shape;
    std::istringstream ds(dims);
    std::string d;
    while (std::getline(ds, d, 'x')) shape.push_back(std::stoull(d));
    auto id = hf_parse_tensor_name(name);
    ASSERT_TRUE(id.has_value()) << name;
    EXPECT_EQ(hf_logical_shape(c, *id), shape) << name;
    EXPECT_EQ(hf_tensor_name(*id, HfSpelling::TRANSFORMERS_SAVED), name);
    descs.push_back({name, dtype == "int64" ? StDtype::I64 : StDtype::BF16, shape});
  }
  EXPECT_EQ(observed.size(), 152u);
  std::set<std::string> predicted;
  for (const auto& id : hf_expected_tensors(c, HfSpelling::TRANSFORMERS_SAVED, false))
    predicted.insert(*hf_tensor_name(id, HfSpelling::TRANSFORMERS_SAVED));
  EXPECT_EQ(predicted, observed);
  HfConversionPlan p = plan_ok(c, descs);
  EXPECT_TRUE(p.ignored.empty());
  // 6 trunk + per layer: 23 common + (tid2eid | bias) + 4 compressor (ratio > 0) + 6 indexer (ratio 4)
  EXPECT_EQ(p.tensors.size(), 6u + 4 * 24 + 2 * 4 + 6);
}

TEST(HfNames, PlansAgreeAcrossSpellings) {
  HfConfig c = tiny_config();
  const uint64_t E = c.n_routed_experts, F = c.moe_intermediate_size, D = c.hidden_size;
  HfConversionPlan rel = plan_ok(c, descs_for(c, HfSpelling::RELEASE));
  HfConversionPlan sav = plan_ok(c, descs_for(c, HfSpelling::TRANSFORMERS_SAVED));
  HfConversionPlan mod = plan_ok(c, descs_for(c, HfSpelling::TRANSFORMERS_MODULE));
  ASSERT_EQ(rel.tensors.size(), sav.tensors.size());
  ASSERT_EQ(rel.tensors.size(), mod.tensors.size());
  std::set<std::string> names;
  for (size_t i = 0; i < rel.tensors.size(); ++i) {
    const auto& r = rel.tensors[i];
    EXPECT_TRUE(names.insert(r.name).second) << r.name;
    EXPECT_EQ(r.name, sav.tensors[i].name);
    EXPECT_EQ(r.name, mod.tensors[i].name);
    EXPECT_EQ(r.ne, sav.tensors[i].ne) << r.name;
    EXPECT_EQ(r.ne, mod.tensors[i].ne) << r.name;
    // pieces tile the tensor exactly
    for (const GgufTensorPlan* p : std::vector<const GgufTensorPlan*>{&r, &sav.tensors[i], &mod.tensors[i]}) {
      uint64_t n = 0;
      for (const auto& pc : p->pieces) {
        EXPECT_EQ(pc.row_length, p->ne[0]) << p->name;
        EXPECT_EQ(pc.storage, HfStorage::PLAIN);
        n += pc.n_rows * pc.row_length;
      }
      EXPECT_EQ(n, p->n_elements()) << p->name;
    }
  }
  // spot checks (formats.md §1.6 dims)
  auto find = [&](const HfConversionPlan& p, const std::string& n) -> const GgufTensorPlan* {
    for (const auto& t : p.tensors)
      if (t.name == n) return &t;
    return nullptr;
  };
  const GgufTensorPlan* q_a = find(rel, "blk.0.attn_q_a.weight");
  ASSERT_NE(q_a, nullptr);
  EXPECT_EQ(q_a->ne, (std::vector<uint64_t>{D, c.q_lora_rank}));
  EXPECT_EQ(q_a->pieces[0].source, "layers.0.attn.wq_a.weight");
  const GgufTensorPlan* tid = find(sav, "blk.1.ffn_gate_tid2eid.weight");
  ASSERT_NE(tid, nullptr);
  EXPECT_EQ(tid->element, GgufElement::INT32);
  EXPECT_EQ(tid->ne, (std::vector<uint64_t>{c.num_experts_per_tok, c.vocab_size}));
  EXPECT_EQ(find(sav, "blk.3.ffn_gate_tid2eid.weight"), nullptr);
  EXPECT_NE(find(sav, "blk.3.exp_probs_b.bias"), nullptr);
  EXPECT_EQ(find(sav, "blk.0.attn_compressor_kv.weight"), nullptr);
  EXPECT_NE(find(sav, "blk.3.attn_compressor_kv.weight"), nullptr);
  EXPECT_EQ(find(sav, "blk.3.indexer.proj.weight"), nullptr);
  const GgufTensorPlan* ape = find(sav, "blk.2.attn_compressor_ape.weight");
  ASSERT_NE(ape, nullptr);
  EXPECT_EQ(ape->ne, (std::vector<uint64_t>{2 * c.head_dim, 4}));
  const GgufTensorPlan* idx_ape = find(rel, "blk.2.indexer_compressor_ape.weight");
  ASSERT_NE(idx_ape, nullptr);
  EXPECT_EQ(idx_ape->ne, (std::vector<uint64_t>{2 * c.index_head_dim, 4}));
  const GgufTensorPlan* up_rel = find(rel, "blk.2.ffn_up_exps.weight");
  const GgufTensorPlan* up_mod = find(mod, "blk.2.ffn_up_exps.weight");
  ASSERT_TRUE(up_rel && up_mod);
  EXPECT_EQ(up_rel->ne, (std::vector<uint64_t>{D, F, E}));
  ASSERT_EQ(up_rel->pieces.size(), E);
  ASSERT_EQ(up_mod->pieces.size(), E);
  for (uint64_t e = 0; e < E; ++e) {
    EXPECT_EQ(up_rel->pieces[e].source, "layers.2.ffn.experts." + std::to_string(e) + ".w3.weight");
    EXPECT_EQ(up_rel->pieces[e].first_row, 0u);
    EXPECT_EQ(up_mod->pieces[e].source, "model.layers.2.mlp.experts.gate_up_proj");
    EXPECT_EQ(up_mod->pieces[e].first_row, e * 2 * F + F);  // up rows follow the gate rows
    EXPECT_EQ(up_mod->pieces[e].n_rows, F);
  }
  const GgufTensorPlan* down_mod = find(mod, "blk.3.ffn_down_exps.weight");
  ASSERT_NE(down_mod, nullptr);
  EXPECT_EQ(down_mod->ne, (std::vector<uint64_t>{F, D, E}));
  ASSERT_EQ(down_mod->pieces.size(), 1u);
  EXPECT_EQ(down_mod->pieces[0].n_rows, E * D);
}

TEST(HfNames, PlanErrors) {
  HfConfig c = tiny_config();
  auto base = descs_for(c, HfSpelling::RELEASE);
  auto without = [&](const std::string& n) {
    auto d = base;
    std::erase_if(d, [&](const HfTensorDesc& x) { return x.name == n; });
    EXPECT_EQ(d.size() + 1, base.size()) << n;
    return d;
  };
  auto with = [&](HfTensorDesc extra) {
    auto d = base;
    d.push_back(std::move(extra));
    return d;
  };
  expect_plan_error(c, without("layers.3.attn.wq_a.weight"),
                    "missing layer 3 ATTN_Q_A (e.g. 'layers.3.attn.wq_a.weight')");
  expect_plan_error(c, without("layers.2.ffn.experts.1.w2.weight"), "missing layer 2 expert 1 EXPERT_DOWN");
  expect_plan_error(c, with({"layers.3.ffn.gate.tid2eid", StDtype::I64, {c.vocab_size, 2}}), "not hash-routed");
  expect_plan_error(c, with({"layers.0.ffn.gate.bias", StDtype::F32, {4}}),
                    "hash-routed layers have no selection bias");
  expect_plan_error(c, with({"layers.0.attn.compressor.ape", StDtype::F32, {4, 256}}),
                    "layer schedule has no such tensor");
  expect_plan_error(c, with({"layers.9.attn_norm.weight", StDtype::F32, {256}}), "the config has fewer layers");
  expect_plan_error(c, with({"layers.2.ffn.experts.4.w1.weight", StDtype::BF16, {256, 256}}),
                    "beyond n_routed_experts");
  expect_plan_error(c, with({"model.layers.0.self_attn.q_a_proj.weight", StDtype::BF16, {64, 256}}),
                    "both name layer 0 ATTN_Q_A");
  expect_plan_error(c, with({"something.else", StDtype::F32, {1}}), "unrecognised tensor 'something.else'");
  expect_plan_error(c, with({"model.layers.2.mlp.experts.gate_up_proj", StDtype::BF16, {4, 512, 256}}),
                    "both fused and per-expert");
  auto bad_shape = base;
  for (auto& d : bad_shape)
    if (d.name == "layers.1.attn.wq_b.weight") d.shape = {512, 32};
  expect_plan_error(c, bad_shape,
                    "'layers.1.attn.wq_b.weight' BF16 [512, 32]: shape mismatch (expected logical shape [512, 64])");
  auto bad_dtype = base;
  for (auto& d : bad_dtype)
    if (d.name == "layers.0.ffn.gate.tid2eid") d.dtype = StDtype::F32;
  expect_plan_error(c, bad_dtype, "an integer table is required");
  auto fp8_no_scale = base;
  for (auto& d : fp8_no_scale)
    if (d.name == "layers.1.attn.wq_a.weight") d.dtype = StDtype::F8_E4M3;
  expect_plan_error(c, fp8_no_scale, "FP8 weight without a .scale tensor");
  expect_plan_error(c, with({"layers.1.attn.wq_a.scale", StDtype::F8_E8M0, {1, 2}}),
                    "scale tensor 'layers.1.attn.wq_a.scale' belongs to no quantised weight");
  // Many problems are all reported (capped), not just the first.
  auto p = hf_plan_conversion(c, {});
  ASSERT_FALSE(p.has_value());
  EXPECT_NE(p.error().message.find("problem(s) mapping"), std::string::npos);
  EXPECT_NE(p.error().message.find("... and"), std::string::npos);
}

TEST(HfNames, QuantisedStorageAndMtp) {
  HfConfig c = parse_ok(flash_release_config().dump());
  // Shrink the Flash config so a full tensor list is cheap but keeps its structure.
  c.num_hidden_layers = 4;
  c.compress_ratios = {0, 0, 4, 128};
  c.n_routed_experts = 4;
  c.num_experts_per_tok = 2;
  c.vocab_size = 300;
  ASSERT_TRUE(hf_config_validate(c).has_value());
  std::vector<HfTensorDesc> d;
  for (const auto& id : hf_expected_tensors(c, HfSpelling::RELEASE, true)) {
    auto shape = hf_logical_shape(c, id);
    std::string name = *hf_tensor_name(id, HfSpelling::RELEASE);
    const bool fp8 = id.role == HfRole::ATTN_Q_A || id.role == HfRole::ATTN_Q_B || id.role == HfRole::MTP_E_PROJ;
    const bool fp4 = id.role == HfRole::EXPERT_GATE || id.role == HfRole::EXPERT_UP || id.role == HfRole::EXPERT_DOWN;
    const std::string base = name.substr(0, name.size() - 7);  // drop ".weight"
    if (fp8) {
      d.push_back({name, StDtype::F8_E4M3, shape});
      d.push_back({base + ".scale", StDtype::F8_E8M0, {(shape[0] + 127) / 128, (shape[1] + 127) / 128}});
    } else if (fp4) {
      d.push_back({name, StDtype::I8, {shape[0], shape[1] / 2}});
      d.push_back({base + ".scale", StDtype::F8_E8M0, {shape[0], shape[1] / 32}});
    } else {
      d.push_back({name, id.role == HfRole::FFN_TID2EID ? StDtype::I64 : StDtype::BF16, shape});
    }
  }
  // Without MTP: the mtp.* tensors (and their scales) are ignored, everything else is planned.
  HfConversionPlan p = plan_ok(c, d);
  EXPECT_FALSE(p.ignored.empty());
  for (const auto& n : p.ignored) EXPECT_EQ(n.rfind("mtp.", 0), 0u) << n;
  size_t fp8 = 0, fp4 = 0;
  for (const auto& t : p.tensors)
    for (const auto& pc : t.pieces) {
      if (pc.storage == HfStorage::FP8_BLOCK) {
        ++fp8;
        EXPECT_EQ(pc.scale, pc.source.substr(0, pc.source.size() - 7) + ".scale");
      }
      if (pc.storage == HfStorage::FP4_PACKED) ++fp4;
    }
  EXPECT_EQ(fp8, 2u * 4);      // wq_a + wq_b per layer
  EXPECT_EQ(fp4, 3u * 4 * 4);  // 3 stacked tensors x 4 experts x 4 layers
  // With MTP: the mtp.0 module is planned (window-only block, top-k routing with bias).
  HfConversionPlan m = plan_ok(c, d, HfPlanOptions{true});
  EXPECT_TRUE(m.ignored.empty());
  std::set<std::string> names;
  for (const auto& t : m.tensors) names.insert(t.name);
  for (const char* n :
       {"mtp.0.e_proj.weight", "mtp.0.h_proj.weight", "mtp.0.enorm.weight", "mtp.0.hnorm.weight", "mtp.0.norm.weight",
        "mtp.0.hc_head_fn.weight", "mtp.0.hc_head_base.weight", "mtp.0.hc_head_scale.weight", "mtp.0.attn_q_a.weight",
        "mtp.0.exp_probs_b.bias", "mtp.0.ffn_gate_exps.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  EXPECT_FALSE(names.count("mtp.0.ffn_gate_tid2eid.weight"));
  EXPECT_FALSE(names.count("mtp.0.attn_compressor_kv.weight"));
  // FP4 with the wrong packed width is a shape error
  for (auto& x : d)
    if (x.name == "layers.1.ffn.experts.0.w1.weight") x.shape[1] = 4096;
  expect_plan_error(c, d,
                    "'layers.1.ffn.experts.0.w1.weight' I8 [2048, 4096]: tensor 'layers.1.ffn.experts.0.w1.weight'");
}

// =================================================================================================
// end to end: write a micro checkpoint, plan it, read every GGUF tensor back
// =================================================================================================

namespace {

const char* k_micro_config = R"({"model_type": "deepseek_v4", "vocab_size": 6, "hidden_size": 8,
  "num_hidden_layers": 3, "num_attention_heads": 2, "head_dim": 8, "qk_rope_head_dim": 4, "q_lora_rank": 4,
  "o_groups": 1, "o_lora_rank": 4, "n_routed_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 4,
  "compress_ratios": [0, 4, 128], "num_hash_layers": 1, "index_n_heads": 2, "index_head_dim": 4,
  "index_topk": 2, "hc_mult": 2, "sliding_window": 4})";

// Deterministic bf16-exact values: multiples of 1/16 in [-1.875, 1.875].
std::vector<float> values_for(const std::string& name, uint64_t n) {
  uint64_t h = 0;
  for (char ch : name) h = h * 131 + static_cast<unsigned char>(ch);
  std::vector<float> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<float>(static_cast<int>((h + i * 7) % 61) - 30) / 16.0f;
  return v;
}

uint64_t product(const std::vector<uint64_t>& s) {
  uint64_t n = 1;
  for (uint64_t d : s) n *= d;
  return n;
}

// Expected GGUF content of a planned tensor, from first principles: plain tensors are their
// source; stacked experts gather per-expert or fused rows.
std::vector<float> expected_gguf(const HfConfig& c, const GgufTensorPlan& t, HfSpelling sp,
                                 const std::map<std::string, std::vector<float>>& src) {
  const HfTensorId& id = t.id;
  const uint64_t E = c.n_routed_experts, F = c.moe_intermediate_size, D = c.hidden_size;
  const bool expert = id.role == HfRole::EXPERT_GATE || id.role == HfRole::EXPERT_UP || id.role == HfRole::EXPERT_DOWN;
  if (!expert) return src.at(*hf_tensor_name(id, sp));
  std::vector<float> out;
  for (uint64_t e = 0; e < E; ++e) {
    if (sp == HfSpelling::TRANSFORMERS_MODULE) {
      const bool down = id.role == HfRole::EXPERT_DOWN;
      const auto& f =
          src.at(*hf_tensor_name({down ? HfRole::FUSED_DOWN : HfRole::FUSED_GATE_UP, id.layer, -1, false}, sp));
      if (down) {
        out.insert(out.end(), f.begin() + e * D * F, f.begin() + (e + 1) * D * F);
      } else {
        uint64_t first = e * 2 * F + (id.role == HfRole::EXPERT_UP ? F : 0);
        out.insert(out.end(), f.begin() + first * D, f.begin() + (first + F) * D);
      }
    } else {
      const auto& x = src.at(*hf_tensor_name({id.role, id.layer, static_cast<int32_t>(e), false}, sp));
      out.insert(out.end(), x.begin(), x.end());
    }
  }
  return out;
}

}  // namespace

TEST(HfEndToEnd, ShardedFusedCheckpoint) {
  HfConfig c = parse_ok(k_micro_config);
  TempDir dir;
  std::map<std::string, std::vector<float>> src;
  std::vector<Entry> shard[2];
  std::string weight_map;
  int k = 0;
  for (const auto& id : hf_expected_tensors(c, HfSpelling::TRANSFORMERS_MODULE, false)) {
    const std::string name = *hf_tensor_name(id, HfSpelling::TRANSFORMERS_MODULE);
    const auto shape = hf_logical_shape(c, id);
    Entry e{name, "BF16", shape, {}};
    if (id.role == HfRole::FFN_TID2EID) {
      std::vector<int64_t> ids(product(shape));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 5 + 1) % c.n_routed_experts);
      e.dtype = "I64";
      e.bytes = le_bytes(ids);
      src[name] = std::vector<float>(ids.begin(), ids.end());
    } else {
      src[name] = values_for(name, product(shape));
      e.bytes = bf16_bytes(src[name]);
    }
    const int s = k++ % 2;
    weight_map +=
        std::string(weight_map.empty() ? "" : ",") + "\"" + name + "\":\"part" + std::to_string(s) + ".safetensors\"";
    shard[s].push_back(std::move(e));
  }
  dir.write("part0.safetensors", build(shard[0], "{\"format\":\"pt\"}"));
  dir.write("part1.safetensors", build(shard[1]));
  dir.write_text("model.safetensors.index.json", "{\"metadata\":{},\"weight_map\":{" + weight_map + "}}");
  dir.write_text("config.json", k_micro_config);

  auto cfg = hf_config_load(dir.path.string());
  ASSERT_TRUE(cfg.has_value()) << cfg.error().message;
  auto ck = HfCheckpoint::open(dir.path.string());
  ASSERT_TRUE(ck.has_value()) << ck.error().message;
  auto plan = hf_plan_conversion(*cfg, hf_describe(**ck));
  ASSERT_TRUE(plan.has_value()) << plan.error().message;
  ASSERT_FALSE(plan->tensors.empty());
  for (const auto& t : plan->tensors) {
    const auto want = expected_gguf(*cfg, t, HfSpelling::TRANSFORMERS_MODULE, src);
    ASSERT_EQ(want.size(), t.n_elements()) << t.name;
    if (t.element == GgufElement::INT32) {
      std::vector<int32_t> got(t.n_elements());
      ASSERT_TRUE(hf_read_planned_i32(**ck, t, got.data()).has_value()) << t.name;
      EXPECT_EQ(std::vector<float>(got.begin(), got.end()), want) << t.name;
      EXPECT_FALSE(hf_read_planned_f32(**ck, t, std::vector<float>(t.n_elements()).data()).has_value());
    } else {
      std::vector<float> got(t.n_elements());
      ASSERT_TRUE(hf_read_planned_f32(**ck, t, got.data()).has_value()) << t.name;
      EXPECT_EQ(got, want) << t.name;
    }
  }
}

TEST(HfEndToEnd, ReleaseCheckpointWithFp8Experts) {
  HfConfig c = parse_ok(k_micro_config);
  TempDir dir;
  std::map<std::string, std::vector<float>> src;
  std::vector<Entry> entries;
  for (const auto& id : hf_expected_tensors(c, HfSpelling::RELEASE, false)) {
    const std::string name = *hf_tensor_name(id, HfSpelling::RELEASE);
    const auto shape = hf_logical_shape(c, id);
    if (id.role == HfRole::FFN_TID2EID) {
      std::vector<int64_t> ids(product(shape));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % c.n_routed_experts);
      entries.push_back({name, "I64", shape, le_bytes(ids)});
      src[name] = std::vector<float>(ids.begin(), ids.end());
    } else if (id.role == HfRole::EXPERT_GATE && id.layer == 1) {
      // FP8 storage: one 128x128 block (the tensor is [4, 8]) with scale 2^(129-127) = 4
      std::vector<uint8_t> codes(product(shape));
      std::vector<float> v(codes.size());
      for (size_t i = 0; i < codes.size(); ++i) {
        codes[i] = static_cast<uint8_t>((i * 13 + id.expert * 3) % 0x70);
        v[i] = fp8_e4m3_decode(codes[i]) * 4.0f;
      }
      entries.push_back({name, "F8_E4M3", shape, codes});
      entries.push_back({name.substr(0, name.size() - 7) + ".scale", "F8_E8M0", {1, 1}, {129}});
      src[name] = v;
    } else {
      src[name] = values_for(name, product(shape));
      entries.push_back({name, "F32", shape, le_bytes(src[name])});
    }
  }
  dir.write("model.safetensors", build(entries));
  auto ck = HfCheckpoint::open(dir.path.string());
  ASSERT_TRUE(ck.has_value()) << ck.error().message;
  auto plan = hf_plan_conversion(c, hf_describe(**ck));
  ASSERT_TRUE(plan.has_value()) << plan.error().message;
  size_t fp8_pieces = 0;
  for (const auto& t : plan->tensors) {
    for (const auto& p : t.pieces) fp8_pieces += p.storage == HfStorage::FP8_BLOCK;
    const auto want = expected_gguf(c, t, HfSpelling::RELEASE, src);
    if (t.element == GgufElement::INT32) {
      std::vector<int32_t> got(t.n_elements());
      ASSERT_TRUE(hf_read_planned_i32(**ck, t, got.data()).has_value()) << t.name;
      EXPECT_EQ(std::vector<float>(got.begin(), got.end()), want) << t.name;
    } else {
      std::vector<float> got(t.n_elements());
      ASSERT_TRUE(hf_read_planned_f32(**ck, t, got.data()).has_value()) << t.name;
      EXPECT_EQ(got, want) << t.name;
    }
  }
  EXPECT_EQ(fp8_pieces, c.n_routed_experts);
  // A plan made for another checkpoint fails cleanly on this one.
  auto other = hf_plan_conversion(c, descs_for(c, HfSpelling::TRANSFORMERS_MODULE));
  ASSERT_TRUE(other.has_value()) << other.error().message;
  std::vector<float> buf(other->tensors[0].n_elements());
  auto e = hf_read_planned_f32(**ck, other->tensors[0], buf.data());
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("not found"), std::string::npos) << e.error().message;
}

// The committed golden fixture (tools/golden/make_golden.py), once the lead has generated it:
// transformers' own checkpoint must plan and read completely, every float must be f16-exact
// (the generator guarantees it, so F16 GGUF storage is lossless) and every hash row must hold
// distinct expert ids.
TEST(HfGoldenFixture, TransformersCheckpointPlansAndReads) {
  const fs::path dir = fs::path(DSV4_TEST_DATA_DIR) / "golden" / "flash_tiny";
  if (!fs::exists(dir / "model.safetensors"))
    GTEST_SKIP() << "no fixture at " << dir << " (run tools/golden/make_golden.py)";
  auto cfg = hf_config_load(dir.string());
  ASSERT_TRUE(cfg.has_value()) << cfg.error().message;
  auto ck = HfCheckpoint::open(dir.string());
  ASSERT_TRUE(ck.has_value()) << ck.error().message;
  auto plan = hf_plan_conversion(*cfg, hf_describe(**ck));
  ASSERT_TRUE(plan.has_value()) << plan.error().message;
  for (const auto& t : plan->tensors) {
    if (t.element == GgufElement::INT32) {
      std::vector<int32_t> v(t.n_elements());
      ASSERT_TRUE(hf_read_planned_i32(**ck, t, v.data()).has_value()) << t.name;
      const uint64_t k = t.ne[0];
      for (uint64_t r = 0; r < t.ne[1]; ++r) {
        std::set<int32_t> row(v.begin() + r * k, v.begin() + (r + 1) * k);
        EXPECT_EQ(row.size(), k) << t.name << " row " << r;
        EXPECT_TRUE(*row.begin() >= 0 && *row.rbegin() < static_cast<int32_t>(cfg->n_routed_experts)) << t.name;
      }
      continue;
    }
    std::vector<float> v(t.n_elements());
    ASSERT_TRUE(hf_read_planned_f32(**ck, t, v.data()).has_value()) << t.name;
    size_t inexact = 0;
    for (float x : v) inexact += f16_round(x) != x;
    EXPECT_EQ(inexact, 0u) << t.name;
  }
}
