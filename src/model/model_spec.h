// ModelSpec: every hyperparameter of a DeepSeek V4 model, read from the
// `deepseek4.*` GGUF metadata (formats.md §1.4) and validated. Shape-generic:
// the published Flash values, V4 Pro's values and tiny test shapes all load.
// Nothing in the engine hard-codes Flash's numbers; they are only defaults of
// the presets and the yardstick that `recognise()` compares against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace dsv4 {

class GgufFile;
class GgufWriter;

// What kind of attention a layer runs (model-spec.md §1.2, §5).
enum class LayerKind {
  WINDOW,      // compress ratio 0: 128-token raw window only
  COMPRESSED,  // ratio m (e.g. 128): window + all compressed rows (HCA)
  SPARSE,      // ratio 4: overlapping compressor + lightning indexer top-k (CSA)
};

const char* layer_kind_name(LayerKind k);

struct ModelSpec {
  std::string name;                       // general.name (informational)
  uint32_t n_layer = 0;                   // L (excluding MTP)
  uint32_t n_embd = 0;                    // D
  uint32_t n_vocab = 0;                   // V
  uint32_t n_head = 0;                    // H query heads
  uint32_t n_head_kv = 1;                 // shared K=V heads (must be 1)
  uint32_t head_dim = 0;                  // d_h (= key_length = value_length)
  uint32_t rope_dim = 0;                  // d_r: rotated tail of each head
  uint32_t q_lora_rank = 0;               // r_q
  uint32_t o_lora_rank = 0;               // r_o, rank per output group
  uint32_t o_groups = 0;                  // G
  uint32_t n_expert = 0;                  // E routed experts
  uint32_t n_expert_used = 0;             // k
  uint32_t n_expert_shared = 0;           // shared experts (fused width F * n_expert_shared)
  uint32_t expert_ff = 0;                 // F
  uint32_t n_hash_layers = 0;             // layers < n_hash route by token-id table
  uint32_t sliding_window = 0;            // W raw tokens incl. the current one
  uint32_t indexer_heads = 0;             // H_I
  uint32_t indexer_head_dim = 0;          // d_I
  uint32_t indexer_top_k = 0;             // K_I
  uint32_t hc_count = 0;                  // n_hc mHC streams
  uint32_t hc_sinkhorn_iters = 0;         // T_sk
  std::vector<uint32_t> compress_ratios;  // per layer; may hold extra trailing entries (MTP)
  std::vector<float> swiglu_clamp;        // per layer
  uint64_t rope_orig_ctx = 0;             // YaRN original context
  float rope_theta = 0;                   // θ for ratio-0 layers
  float compress_rope_theta = 0;          // θ_c for compressed layers
  float rope_scale_factor = 0;            // YaRN factor s
  float yarn_beta_fast = 0, yarn_beta_slow = 0;
  float expert_weights_scale = 0;  // α
  bool expert_weights_norm = true;
  float rms_eps = 0;
  float hc_eps = 0;
  uint64_t context_length = 0;  // advertised max context (0 if absent)

  // ---- derived ------------------------------------------------------------
  uint32_t ratio(uint32_t il) const { return compress_ratios[il]; }
  LayerKind layer_kind(uint32_t il) const;
  bool is_hash_layer(uint32_t il) const { return il < n_hash_layers; }
  uint32_t nope_dim() const { return head_dim - rope_dim; }
  uint32_t hc_mix_width() const { return (2 + hc_count) * hc_count; }  // 24 for 4 streams
  uint32_t compress_width(uint32_t il) const;  // c * head_dim: 2x for overlapping ratio-4 layers
  uint32_t mtp_ratio() const { return compress_ratios.size() > n_layer ? compress_ratios[n_layer] : 0; }

  // Structural validation (ranges, divisibility, consistent lengths): the shapes
  // transformers' DeepseekV4 can build, nothing more. Every valid shape runs in
  // `plain` numerics on the CPU; what `reference` numerics and the CUDA kernels
  // need on top is checked when a Model is created (model/shape_fit.h).
  Status validate() const;

  // Reads and validates the deepseek4.* keys of a GGUF.
  static expected<ModelSpec> from_gguf(const GgufFile& f);
  // Writes the deepseek4.* keys (and general.architecture/name).
  void write_gguf(GgufWriter& w) const;

  // The published models' values.
  static ModelSpec flash();
  static ModelSpec pro();
  // "DeepSeek V4 Flash", "DeepSeek V4 Pro" or "custom (...)" for other shapes.
  std::string recognise() const;
  bool same_hyperparameters(const ModelSpec& o) const;
};

}  // namespace dsv4
