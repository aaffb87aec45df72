// config.json of a DeepSeek V4 checkpoint -> typed hyperparameters (model-spec.md §1).
//
// Two spellings exist and both are accepted:
//  * DeepSeek's release config: `compress_ratios` (L+1 entries, the last is the MTP block),
//    `num_hash_layers`, `qk_rope_head_dim`, `rope_theta`, `compress_rope_theta`, and
//    `rope_scaling` = {"type": "yarn", "factor", "original_max_position_embeddings",
//    "beta_fast", "beta_slow"} (YaRN applies to the compressed layers only).
//  * transformers 5.x (what save_pretrained writes): `layer_types`
//    ("sliding_attention" / "compressed_sparse_attention" / "heavily_compressed_attention")
//    with `compress_rates` {type: ratio}, `mlp_layer_types` ("hash_moe" first, then "moe"),
//    `partial_rotary_factor` (× head_dim = RoPE dims; it also writes `qk_rope_head_dim`), and
//    `rope_parameters` = {"main": {...}, "compress": {..., "rope_type": "yarn", ...}} or a flat
//    dict.
// Missing fields take transformers' DeepseekV4Config defaults (the Flash values) and are listed
// in `defaulted`; the core dimensions have no default and must be present. Every value is type-
// and range-checked; errors name the field. `hf_config_validate` checks the cross-field
// invariants of a DeepSeek V4 model (the shapes transformers' DeepseekV4 builds); what only
// `reference` numerics or a backend needs is checked when the converted model is loaded.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace dsv4 {

struct HfYarn {
  bool enabled = false;  // false: compressed layers use plain RoPE with compress_rope_theta
  double factor = 1.0;
  uint64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 1.0;  // V4 never scales cos/sin (model-spec §1.1): must stay 1
};

enum class HfScheduleSource { COMPRESS_RATIOS, LAYER_TYPES, DEFAULT };

struct HfConfig {
  std::string model_type;  // "deepseek_v4" (or empty when the file has none)

  // core dimensions (required)
  uint32_t vocab_size = 0;
  uint32_t hidden_size = 0;
  uint32_t num_hidden_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t head_dim = 0;
  uint32_t q_lora_rank = 0;
  uint32_t o_groups = 0;
  uint32_t o_lora_rank = 0;
  uint32_t n_routed_experts = 0;
  uint32_t num_experts_per_tok = 0;
  uint32_t moe_intermediate_size = 0;

  // attention
  uint32_t num_key_value_heads = 1;
  uint32_t qk_rope_head_dim = 64;  // RoPE dims at the end of every head
  uint32_t sliding_window = 128;
  std::vector<uint32_t> compress_ratios;  // one per main layer: 0, 4 or 128
  uint32_t mtp_compress_ratio = 0;        // entry L of the release's list (0 when absent)
  HfScheduleSource schedule_source = HfScheduleSource::DEFAULT;
  uint32_t index_n_heads = 64;
  uint32_t index_head_dim = 128;
  uint32_t index_topk = 512;

  // mHC
  uint32_t hc_mult = 4;
  uint32_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rms_norm_eps = 1e-6;

  // MoE
  uint32_t n_shared_experts = 1;
  uint32_t num_hash_layers = 3;  // layers [0, num_hash_layers) route by the tid2eid table
  std::string scoring_func = "sqrtsoftplus";
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.5;
  double swiglu_limit = 10.0;

  // RoPE: ratio-0 layers plain rope_theta; compressed layers compress_rope_theta (+ YaRN)
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  HfYarn yarn;
  uint64_t max_position_embeddings = 1048576;

  // tokens / misc
  int64_t bos_token_id = 0;
  std::vector<int64_t> eos_token_ids = {1};
  bool tie_word_embeddings = false;
  uint32_t num_nextn_predict_layers = 1;
  std::string expert_dtype;    // "fp4" / "fp8" in release configs, "" when absent
  bool fp8_quantized = false;  // a `quantization_config` with quant_method "fp8" is present

  std::vector<std::string> defaulted;  // fields absent from the JSON that took defaults

  bool is_hash_layer(uint32_t il) const { return il < num_hash_layers; }
  uint32_t ratio(uint32_t il) const { return compress_ratios[il]; }
  uint32_t n_rot() const { return qk_rope_head_dim; }
};

// Parses and validates. `source` names the text in error messages.
expected<HfConfig> hf_config_parse(std::string_view json_text, const std::string& source = "config.json");
// Reads `path` (a config.json, or a folder containing one) and parses it.
expected<HfConfig> hf_config_load(const std::string& path);
// Cross-field invariants (called by hf_config_parse; exposed for configs built in code).
Status hf_config_validate(const HfConfig& c);

}  // namespace dsv4
