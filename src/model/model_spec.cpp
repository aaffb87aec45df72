#include "model/model_spec.h"

#include <cmath>

#include "gguf/gguf.h"

namespace dsv4 {

const char* layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::WINDOW: return "window";
    case LayerKind::COMPRESSED: return "compressed";
    case LayerKind::SPARSE: return "sparse";
  }
  return "?";
}

LayerKind ModelSpec::layer_kind(uint32_t il) const {
  uint32_t r = ratio(il);
  if (r == 0) return LayerKind::WINDOW;
  return r == 4 ? LayerKind::SPARSE : LayerKind::COMPRESSED;
}

uint32_t ModelSpec::compress_width(uint32_t il) const {
  return layer_kind(il) == LayerKind::SPARSE ? 2 * head_dim : head_dim;
}

namespace {

constexpr const char* k_prefix = "deepseek4.";

std::string key(const char* k) { return std::string(k_prefix) + k; }

expected<uint32_t> read_u32(const GgufFile& f, const char* k) {
  std::string full = key(k);
  DSV4_TRY_ASSIGN(GgufScalar s, f.get_scalar(full));
  auto v = s.as_u64();
  if (!v || *v > 0xffffffffull)
    return make_error("metadata %s must be a non-negative integer that fits 32 bits (found %s)", full.c_str(),
                      gguf_type_name(s.type));
  return static_cast<uint32_t>(*v);
}

expected<uint64_t> read_u64(const GgufFile& f, const char* k) {
  std::string full = key(k);
  DSV4_TRY_ASSIGN(GgufScalar s, f.get_scalar(full));
  auto v = s.as_u64();
  if (!v)
    return make_error("metadata %s must be a non-negative integer (found %s)", full.c_str(), gguf_type_name(s.type));
  return *v;
}

expected<float> read_f32(const GgufFile& f, const char* k) {
  std::string full = key(k);
  DSV4_TRY_ASSIGN(GgufScalar s, f.get_scalar(full));
  if (s.type == GgufType::BOOL || s.type == GgufType::STRING)
    return make_error("metadata %s must be a number (found %s)", full.c_str(), gguf_type_name(s.type));
  auto v = s.as_double();
  if (!v || !std::isfinite(*v)) return make_error("metadata %s must be a finite number", full.c_str());
  return static_cast<float>(*v);
}

expected<bool> read_bool(const GgufFile& f, const char* k) {
  std::string full = key(k);
  DSV4_TRY_ASSIGN(GgufScalar s, f.get_scalar(full));
  if (s.type != GgufType::BOOL)
    return make_error("metadata %s must be a bool (found %s)", full.c_str(), gguf_type_name(s.type));
  return s.u != 0;
}

expected<std::vector<uint32_t>> read_u32_array(const GgufFile& f, const char* k) {
  std::string full = key(k);
  DSV4_TRY_ASSIGN(auto arr, f.get_array(full));
  std::vector<uint32_t> out;
  for (const auto& s : arr) {
    auto v = s.as_u64();
    if (!v || *v > 0xffffffffull)
      return make_error("metadata %s must hold non-negative integers (found %s)", full.c_str(), gguf_type_name(s.type));
    out.push_back(static_cast<uint32_t>(*v));
  }
  return out;
}

expected<std::vector<float>> read_f32_array(const GgufFile& f, const char* k) {
  std::string full = key(k);
  DSV4_TRY_ASSIGN(auto arr, f.get_array(full));
  std::vector<float> out;
  for (const auto& s : arr) {
    if (!s.is_float())
      return make_error("metadata %s must hold floats (found %s)", full.c_str(), gguf_type_name(s.type));
    out.push_back(static_cast<float>(s.f));
  }
  return out;
}

}  // namespace

expected<ModelSpec> ModelSpec::from_gguf(const GgufFile& f) {
  auto arch = f.get_string("general.architecture");
  if (arch && *arch != "deepseek4")
    return make_error("this is a \"%.*s\" model; dsv4 runs DeepSeek V4 (general.architecture = \"deepseek4\")",
                      static_cast<int>(arch->size()), arch->data());
  if (!f.find("deepseek4.block_count"))
    return make_error("not a DeepSeek V4 GGUF: metadata deepseek4.block_count is missing");

  ModelSpec s;
  if (auto n = f.get_string("general.name")) s.name = std::string(*n);
  DSV4_TRY_ASSIGN(s.n_layer, read_u32(f, "block_count"));
  DSV4_TRY_ASSIGN(s.n_embd, read_u32(f, "embedding_length"));
  DSV4_TRY_ASSIGN(s.n_vocab, read_u32(f, "vocab_size"));
  DSV4_TRY_ASSIGN(s.n_head, read_u32(f, "attention.head_count"));
  DSV4_TRY_ASSIGN(s.n_head_kv, read_u32(f, "attention.head_count_kv"));
  DSV4_TRY_ASSIGN(s.head_dim, read_u32(f, "attention.key_length"));
  DSV4_TRY_ASSIGN(uint32_t v_dim, read_u32(f, "attention.value_length"));
  if (v_dim != s.head_dim)
    return make_error("attention.value_length (%u) must equal attention.key_length (%u): DeepSeek V4 shares K and V",
                      v_dim, s.head_dim);
  DSV4_TRY_ASSIGN(s.rope_dim, read_u32(f, "rope.dimension_count"));
  DSV4_TRY_ASSIGN(s.q_lora_rank, read_u32(f, "attention.q_lora_rank"));
  DSV4_TRY_ASSIGN(s.o_lora_rank, read_u32(f, "attention.output_lora_rank"));
  DSV4_TRY_ASSIGN(s.o_groups, read_u32(f, "attention.output_group_count"));
  DSV4_TRY_ASSIGN(s.n_expert, read_u32(f, "expert_count"));
  DSV4_TRY_ASSIGN(s.n_expert_used, read_u32(f, "expert_used_count"));
  DSV4_TRY_ASSIGN(s.expert_ff, read_u32(f, "expert_feed_forward_length"));
  DSV4_TRY_ASSIGN(s.n_expert_shared, read_u32(f, "expert_shared_count"));
  DSV4_TRY_ASSIGN(s.n_hash_layers, read_u32(f, "hash_layer_count"));
  for (const char* k : {"expert_group_count", "expert_group_used_count"}) {
    if (!f.find(key(k))) continue;
    DSV4_TRY_ASSIGN(uint32_t g, read_u32(f, k));
    if (g > 1) return make_error("deepseek4.%s = %u: group-limited routing is not part of DeepSeek V4", k, g);
  }
  DSV4_TRY_ASSIGN(s.sliding_window, read_u32(f, "attention.sliding_window"));
  DSV4_TRY_ASSIGN(s.indexer_heads, read_u32(f, "attention.indexer.head_count"));
  DSV4_TRY_ASSIGN(s.indexer_head_dim, read_u32(f, "attention.indexer.key_length"));
  DSV4_TRY_ASSIGN(s.indexer_top_k, read_u32(f, "attention.indexer.top_k"));
  DSV4_TRY_ASSIGN(s.hc_count, read_u32(f, "hyper_connection.count"));
  DSV4_TRY_ASSIGN(s.hc_sinkhorn_iters, read_u32(f, "hyper_connection.sinkhorn_iterations"));
  DSV4_TRY_ASSIGN(s.compress_ratios, read_u32_array(f, "attention.compress_ratios"));
  DSV4_TRY_ASSIGN(s.swiglu_clamp, read_f32_array(f, "swiglu_clamp_exp"));
  DSV4_TRY_ASSIGN(s.rope_orig_ctx, read_u64(f, "rope.scaling.original_context_length"));
  DSV4_TRY_ASSIGN(s.rope_theta, read_f32(f, "rope.freq_base"));
  DSV4_TRY_ASSIGN(s.rope_scale_factor, read_f32(f, "rope.scaling.factor"));
  DSV4_TRY_ASSIGN(s.yarn_beta_fast, read_f32(f, "rope.scaling.yarn_beta_fast"));
  DSV4_TRY_ASSIGN(s.yarn_beta_slow, read_f32(f, "rope.scaling.yarn_beta_slow"));
  DSV4_TRY_ASSIGN(s.compress_rope_theta, read_f32(f, "attention.compress_rope_freq_base"));
  DSV4_TRY_ASSIGN(s.expert_weights_scale, read_f32(f, "expert_weights_scale"));
  DSV4_TRY_ASSIGN(s.rms_eps, read_f32(f, "attention.layer_norm_rms_epsilon"));
  DSV4_TRY_ASSIGN(s.hc_eps, read_f32(f, "hyper_connection.epsilon"));
  DSV4_TRY_ASSIGN(s.expert_weights_norm, read_bool(f, "expert_weights_norm"));
  if (f.find(key("context_length"))) {
    DSV4_TRY_ASSIGN(s.context_length, read_u64(f, "context_length"));
  }
  auto st = s.validate();
  if (!st) return st.error().with_context("invalid DeepSeek V4 metadata");
  return s;
}

Status ModelSpec::validate() const {
  auto in = [](uint64_t v, uint64_t lo, uint64_t hi) { return v >= lo && v <= hi; };
  if (!in(n_layer, 1, 1024)) return make_error("block_count %u out of range [1, 1024]", n_layer);
  if (!in(n_embd, 1, 1 << 16)) return make_error("embedding_length %u out of range [1, 65536]", n_embd);
  if (!in(n_vocab, 8, 1 << 22)) return make_error("vocab_size %u out of range", n_vocab);
  if (!in(n_head, 1, 1024)) return make_error("attention.head_count %u out of range", n_head);
  if (n_head_kv != 1) return make_error("attention.head_count_kv = %u: DeepSeek V4 uses one shared KV head", n_head_kv);
  if (!in(head_dim, 2, 4096)) return make_error("attention.key_length %u out of range [2, 4096]", head_dim);
  if (rope_dim == 0 || rope_dim % 2 || rope_dim > head_dim)
    return make_error("rope.dimension_count %u must be even, positive and at most key_length %u", rope_dim, head_dim);
  if (!in(q_lora_rank, 1, 1 << 16)) return make_error("attention.q_lora_rank %u out of range", q_lora_rank);
  // wo_a splits the concatenated head outputs [H * d_h] into G equal slices (a slice may cut a head).
  if (o_groups == 0 || (uint64_t{n_head} * head_dim) % o_groups)
    return make_error("attention.output_group_count %u must divide head_count x key_length = %u x %u", o_groups, n_head,
                      head_dim);
  if (!in(o_lora_rank, 1, 1 << 16)) return make_error("attention.output_lora_rank %u out of range", o_lora_rank);
  if (!in(n_expert, 1, 1 << 16)) return make_error("expert_count %u out of range", n_expert);
  if (!in(n_expert_used, 1, n_expert))
    return make_error("expert_used_count %u must be in [1, expert_count %u]", n_expert_used, n_expert);
  if (!in(expert_ff, 1, 1 << 20)) return make_error("expert_feed_forward_length %u out of range", expert_ff);
  if (!in(n_expert_shared, 0, 64)) return make_error("expert_shared_count %u out of range", n_expert_shared);
  if (n_hash_layers > n_layer) return make_error("hash_layer_count %u exceeds block_count %u", n_hash_layers, n_layer);
  if (!in(sliding_window, 1, 1 << 20)) return make_error("attention.sliding_window %u out of range", sliding_window);
  if (!in(hc_count, 1, 64)) return make_error("hyper_connection.count %u out of range", hc_count);
  if (!in(hc_sinkhorn_iters, 1, 1000))
    return make_error("hyper_connection.sinkhorn_iterations %u out of range", hc_sinkhorn_iters);
  if (compress_ratios.size() < n_layer)
    return make_error("attention.compress_ratios has %zu entries, need at least block_count = %u",
                      compress_ratios.size(), n_layer);
  if (swiglu_clamp.size() < n_layer)
    return make_error("swiglu_clamp_exp has %zu entries, need at least block_count = %u", swiglu_clamp.size(), n_layer);
  bool any_sparse = false;
  for (size_t il = 0; il < compress_ratios.size(); ++il) {
    uint32_t r = compress_ratios[il];
    if (r != 0 && (r < 2 || r > 4096))
      return make_error("attention.compress_ratios[%zu] = %u: ratios are 0 (window only) or in [2, 4096]", il, r);
    if (il < n_layer && r == 4) any_sparse = true;
  }
  for (size_t il = 0; il < n_layer; ++il)
    if (!(swiglu_clamp[il] > 0)) return make_error("swiglu_clamp_exp[%zu] must be positive", il);
  if (any_sparse) {
    if (!in(indexer_heads, 1, 1024)) return make_error("attention.indexer.head_count %u out of range", indexer_heads);
    // Indexer queries and keys carry RoPE on their last rope_dim dims.
    if (!in(indexer_head_dim, rope_dim, 4096))
      return make_error("attention.indexer.key_length %u must be in [rope.dimension_count %u, 4096]", indexer_head_dim,
                        rope_dim);
    if (indexer_top_k == 0) return make_error("attention.indexer.top_k must be positive");
  }
  if (!(rope_theta > 0) || !(compress_rope_theta > 0)) return make_error("rope bases must be positive");
  if (!(rope_scale_factor >= 1))
    return make_error("rope.scaling.factor %g must be >= 1", static_cast<double>(rope_scale_factor));
  if (rope_orig_ctx == 0) return make_error("rope.scaling.original_context_length must be positive");
  if (!(rms_eps > 0) || !(hc_eps > 0)) return make_error("epsilons must be positive");
  if (!(expert_weights_scale > 0)) return make_error("expert_weights_scale must be positive");
  return {};
}

void ModelSpec::write_gguf(GgufWriter& w) const {
  w.set_string("general.architecture", "deepseek4");
  if (!name.empty()) w.set_string("general.name", name);
  auto u = [&](const char* k, uint32_t v) { w.set_u32(key(k), v); };
  auto f = [&](const char* k, float v) { w.set_f32(key(k), v); };
  if (context_length) w.set_u64(key("context_length"), context_length);
  u("block_count", n_layer);
  u("embedding_length", n_embd);
  u("vocab_size", n_vocab);
  u("attention.head_count", n_head);
  u("attention.head_count_kv", n_head_kv);
  u("attention.key_length", head_dim);
  u("attention.value_length", head_dim);
  u("rope.dimension_count", rope_dim);
  u("attention.q_lora_rank", q_lora_rank);
  u("attention.output_lora_rank", o_lora_rank);
  u("attention.output_group_count", o_groups);
  u("expert_count", n_expert);
  u("expert_used_count", n_expert_used);
  u("expert_feed_forward_length", expert_ff);
  u("expert_shared_count", n_expert_shared);
  u("hash_layer_count", n_hash_layers);
  u("expert_group_count", 0);
  u("expert_group_used_count", 0);
  u("attention.sliding_window", sliding_window);
  u("attention.indexer.head_count", indexer_heads);
  u("attention.indexer.key_length", indexer_head_dim);
  u("attention.indexer.top_k", indexer_top_k);
  u("hyper_connection.count", hc_count);
  u("hyper_connection.sinkhorn_iterations", hc_sinkhorn_iters);
  w.set_array_u32(key("attention.compress_ratios"), compress_ratios);
  w.set_array_f32(key("swiglu_clamp_exp"), swiglu_clamp);
  w.set_u64(key("rope.scaling.original_context_length"), rope_orig_ctx);
  f("rope.freq_base", rope_theta);
  f("rope.scaling.factor", rope_scale_factor);
  f("rope.scaling.yarn_beta_fast", yarn_beta_fast);
  f("rope.scaling.yarn_beta_slow", yarn_beta_slow);
  f("attention.compress_rope_freq_base", compress_rope_theta);
  f("expert_weights_scale", expert_weights_scale);
  f("attention.layer_norm_rms_epsilon", rms_eps);
  f("hyper_connection.epsilon", hc_eps);
  w.set_bool(key("expert_weights_norm"), expert_weights_norm);
  w.set_string(key("expert_gating_func"), "sqrtsoftplus");
}

static void set_common_v4(ModelSpec& s) {
  s.n_vocab = 129280;
  s.n_head_kv = 1;
  s.head_dim = 512;
  s.rope_dim = 64;
  s.o_lora_rank = 1024;
  s.n_expert_used = 6;
  s.n_expert_shared = 1;
  s.n_hash_layers = 3;
  s.sliding_window = 128;
  s.indexer_heads = 64;
  s.indexer_head_dim = 128;
  s.hc_count = 4;
  s.hc_sinkhorn_iters = 20;
  s.rope_orig_ctx = 65536;
  s.rope_theta = 10000.0f;
  s.compress_rope_theta = 160000.0f;
  s.rope_scale_factor = 16.0f;
  s.yarn_beta_fast = 32.0f;
  s.yarn_beta_slow = 1.0f;
  s.expert_weights_norm = true;
  s.rms_eps = 1e-6f;
  s.hc_eps = 1e-6f;
  s.context_length = 1048576;
}

ModelSpec ModelSpec::flash() {
  ModelSpec s;
  set_common_v4(s);
  s.name = "DeepSeek V4 Flash";
  s.n_layer = 43;
  s.n_embd = 4096;
  s.n_head = 64;
  s.q_lora_rank = 1024;
  s.o_groups = 8;
  s.n_expert = 256;
  s.expert_ff = 2048;
  s.indexer_top_k = 512;
  s.expert_weights_scale = 1.5f;
  // [0, 0, 4, 128, 4, 128, ..., 4, 128, 4] + MTP entry 0 (model-spec.md §1.2)
  for (uint32_t il = 0; il < s.n_layer; ++il) s.compress_ratios.push_back(il < 2 ? 0 : (il % 2 == 0 ? 4 : 128));
  s.compress_ratios.push_back(0);
  s.swiglu_clamp.assign(s.n_layer + 1, 10.0f);
  return s;
}

ModelSpec ModelSpec::pro() {
  ModelSpec s;
  set_common_v4(s);
  s.name = "DeepSeek V4 Pro";
  s.n_layer = 61;
  s.n_embd = 7168;
  s.n_head = 128;
  s.q_lora_rank = 1536;
  s.o_groups = 16;
  s.n_expert = 384;
  s.expert_ff = 3072;
  s.indexer_top_k = 1024;
  s.expert_weights_scale = 2.5f;
  // [128, 128, 4, 128, ..., 4] + MTP entry 0
  for (uint32_t il = 0; il < s.n_layer; ++il) s.compress_ratios.push_back(il < 2 ? 128 : (il % 2 == 0 ? 4 : 128));
  s.compress_ratios.push_back(0);
  s.swiglu_clamp.assign(s.n_layer + 1, 10.0f);
  return s;
}

bool ModelSpec::same_hyperparameters(const ModelSpec& o) const {
  auto ratios = [](const ModelSpec& m) {
    return std::vector<uint32_t>(m.compress_ratios.begin(), m.compress_ratios.begin() + m.n_layer);
  };
  auto clamps = [](const ModelSpec& m) {
    return std::vector<float>(m.swiglu_clamp.begin(), m.swiglu_clamp.begin() + m.n_layer);
  };
  auto close = [](float a, float b) { return std::fabs(a - b) <= 1e-6f * std::max(std::fabs(b), 1.0f); };
  return n_layer == o.n_layer && n_embd == o.n_embd && n_vocab == o.n_vocab && n_head == o.n_head &&
         n_head_kv == o.n_head_kv && head_dim == o.head_dim && rope_dim == o.rope_dim && q_lora_rank == o.q_lora_rank &&
         o_lora_rank == o.o_lora_rank && o_groups == o.o_groups && n_expert == o.n_expert &&
         n_expert_used == o.n_expert_used && n_expert_shared == o.n_expert_shared && expert_ff == o.expert_ff &&
         n_hash_layers == o.n_hash_layers && sliding_window == o.sliding_window && indexer_heads == o.indexer_heads &&
         indexer_head_dim == o.indexer_head_dim && indexer_top_k == o.indexer_top_k && hc_count == o.hc_count &&
         hc_sinkhorn_iters == o.hc_sinkhorn_iters && ratios(*this) == ratios(o) && clamps(*this) == clamps(o) &&
         rope_orig_ctx == o.rope_orig_ctx && close(rope_theta, o.rope_theta) &&
         close(compress_rope_theta, o.compress_rope_theta) && close(rope_scale_factor, o.rope_scale_factor) &&
         close(yarn_beta_fast, o.yarn_beta_fast) && close(yarn_beta_slow, o.yarn_beta_slow) &&
         close(expert_weights_scale, o.expert_weights_scale) && expert_weights_norm == o.expert_weights_norm &&
         close(rms_eps, o.rms_eps) && close(hc_eps, o.hc_eps);
}

std::string ModelSpec::recognise() const {
  if (same_hyperparameters(flash())) return "DeepSeek V4 Flash";
  if (same_hyperparameters(pro())) return "DeepSeek V4 Pro";
  return strfmt("custom DeepSeek V4 shape (%u layers, %u embd, %u experts)", n_layer, n_embd, n_expert);
}

}  // namespace dsv4
