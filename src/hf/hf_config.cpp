#include "hf/hf_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/mapped_file.h"
#include "hf/json_check.h"

namespace dsv4 {

namespace {

using json = nlohmann::json;

// Typed field access over one JSON object. Absent (or null) fields keep the caller's default
// and are recorded; present fields of the wrong type or range are errors naming the field.
class Fields {
 public:
  Fields(const json& obj, std::string where, std::vector<std::string>* defaulted)
      : obj_(obj), where_(std::move(where)), defaulted_(defaulted) {}

  const json* get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const char* key) const { return get(key) != nullptr; }

  Error bad(const char* key, const char* what) const {
    const json* v = get(key);
    return make_error("%s: field \"%s\" %s (got %s)", where_.c_str(), key, what, v ? v->dump().c_str() : "nothing");
  }

  // Integers: JSON integers, or floats with an integral value (some writers emit 4096.0).
  static bool as_u64(const json& v, uint64_t& out) {
    if (v.is_number_unsigned()) {
      out = v.get<uint64_t>();
      return true;
    }
    if (v.is_number_integer()) return false;  // negative
    if (v.is_number_float()) {
      double d = v.get<double>();
      if (!(d >= 0.0) || d > 9.0e15 || std::floor(d) != d) return false;
      out = static_cast<uint64_t>(d);
      return true;
    }
    return false;
  }

  Status u32(const char* key, uint32_t& out, bool required, uint32_t min_value = 0) {
    const json* v = get(key);
    if (!v) {
      if (required) return make_error("%s: required field \"%s\" is missing", where_.c_str(), key);
      note_default(key);
      return {};
    }
    uint64_t x = 0;
    if (!as_u64(*v, x) || x > std::numeric_limits<uint32_t>::max())
      return bad(key, "is not a non-negative 32-bit integer");
    if (x < min_value)
      return make_error("%s: field \"%s\" must be >= %u (got %llu)", where_.c_str(), key, min_value,
                        (unsigned long long)x);
    out = static_cast<uint32_t>(x);
    return {};
  }

  Status u64(const char* key, uint64_t& out) {
    const json* v = get(key);
    if (!v) {
      note_default(key);
      return {};
    }
    if (!as_u64(*v, out)) return bad(key, "is not a non-negative integer");
    return {};
  }

  Status i64(const char* key, int64_t& out) {
    const json* v = get(key);
    if (!v) {
      note_default(key);
      return {};
    }
    if (v->is_number_integer()) {
      out = v->get<int64_t>();
      return {};
    }
    return bad(key, "is not an integer");
  }

  // Finite number; `positive` requires > 0.
  Status f64(const char* key, double& out, bool positive) {
    const json* v = get(key);
    if (!v) {
      note_default(key);
      return {};
    }
    if (!v->is_number()) return bad(key, "is not a number");
    double d = v->get<double>();
    if (!std::isfinite(d)) return bad(key, "is not finite");
    if (positive && !(d > 0.0)) return bad(key, "must be > 0");
    out = d;
    return {};
  }

  Status boolean(const char* key, bool& out) {
    const json* v = get(key);
    if (!v) {
      note_default(key);
      return {};
    }
    if (!v->is_boolean()) return bad(key, "is not a boolean");
    out = v->get<bool>();
    return {};
  }

  Status string(const char* key, std::string& out) {
    const json* v = get(key);
    if (!v) {
      note_default(key);
      return {};
    }
    if (!v->is_string()) return bad(key, "is not a string");
    out = v->get<std::string>();
    return {};
  }

  void note_default(const char* key) {
    if (defaulted_) defaulted_->push_back(where_ == "config" ? key : where_ + "." + key);
  }

 private:
  const json& obj_;
  std::string where_;
  std::vector<std::string>* defaulted_;
};

uint32_t layer_type_ratio(const std::string& t, const json* rates, bool& ok, std::string& err) {
  ok = true;
  auto rate = [&](const char* name, uint32_t dflt) -> uint32_t {
    if (!rates) return dflt;
    auto it = rates->find(name);
    if (it == rates->end()) return dflt;
    uint64_t v = 0;
    if (!Fields::as_u64(*it, v) || v > 1u << 20) {
      ok = false;
      err = std::string("compress_rates.") + name + " is not a valid ratio";
      return 0;
    }
    return static_cast<uint32_t>(v);
  };
  if (t == "sliding_attention") return 0;
  if (t == "compressed_sparse_attention") return rate("compressed_sparse_attention", 4);
  if (t == "heavily_compressed_attention") return rate("heavily_compressed_attention", 128);
  ok = false;
  err = "unknown layer type \"" + t + "\"";
  return 0;
}

// YaRN sub-dict (release `rope_scaling`, transformers `rope_parameters.compress` or flat).
Status parse_yarn(const json& d, const std::string& where, HfYarn& y) {
  std::string type;
  Fields f(d, where, nullptr);
  if (f.has("rope_type"))
    DSV4_TRY(f.string("rope_type", type));
  else if (f.has("type"))
    DSV4_TRY(f.string("type", type));
  if (type.empty() || type == "default") {
    y.enabled = false;
    return {};
  }
  if (type != "yarn")
    return make_error("%s: unsupported rope type \"%s\" (DeepSeek V4 uses yarn)", where.c_str(), type.c_str());
  y.enabled = true;
  if (!f.has("factor")) return make_error("%s: yarn needs \"factor\"", where.c_str());
  if (!f.has("original_max_position_embeddings"))
    return make_error("%s: yarn needs \"original_max_position_embeddings\"", where.c_str());
  DSV4_TRY(f.f64("factor", y.factor, true));
  DSV4_TRY(f.u64("original_max_position_embeddings", y.original_max_position_embeddings));
  DSV4_TRY(f.f64("beta_fast", y.beta_fast, true));
  DSV4_TRY(f.f64("beta_slow", y.beta_slow, true));
  DSV4_TRY(f.f64("attention_factor", y.attention_factor, true));
  return {};
}

}  // namespace

expected<HfConfig> hf_config_parse(std::string_view json_text, const std::string& source) {
  auto ctx = [&](const Error& e) { return e.with_context(source); };
  auto parsed = json_parse_checked(json_text);
  if (!parsed) return ctx(parsed.error());
  const json root = std::move(parsed).value();
  if (!root.is_object()) return ctx(make_error("top level is not a JSON object"));

  HfConfig c;
  Fields f(root, "config", &c.defaulted);
  auto run = [&]() -> Status {
    DSV4_TRY(f.string("model_type", c.model_type));
    if (!c.model_type.empty() && c.model_type.rfind("deepseek_v4", 0) != 0)
      return make_error("config: model_type \"%s\" is not a DeepSeek V4 model", c.model_type.c_str());

    DSV4_TRY(f.u32("vocab_size", c.vocab_size, true, 2));
    DSV4_TRY(f.u32("hidden_size", c.hidden_size, true, 1));
    DSV4_TRY(f.u32("num_hidden_layers", c.num_hidden_layers, true, 1));
    DSV4_TRY(f.u32("num_attention_heads", c.num_attention_heads, true, 1));
    DSV4_TRY(f.u32("head_dim", c.head_dim, true, 1));
    DSV4_TRY(f.u32("q_lora_rank", c.q_lora_rank, true, 1));
    DSV4_TRY(f.u32("o_groups", c.o_groups, true, 1));
    DSV4_TRY(f.u32("o_lora_rank", c.o_lora_rank, true, 1));
    DSV4_TRY(f.u32("n_routed_experts", c.n_routed_experts, true, 1));
    DSV4_TRY(f.u32("num_experts_per_tok", c.num_experts_per_tok, true, 1));
    DSV4_TRY(f.u32("moe_intermediate_size", c.moe_intermediate_size, true, 1));

    DSV4_TRY(f.u32("num_key_value_heads", c.num_key_value_heads, false, 1));
    DSV4_TRY(f.u32("sliding_window", c.sliding_window, false, 1));
    DSV4_TRY(f.u32("index_n_heads", c.index_n_heads, false, 1));
    DSV4_TRY(f.u32("index_head_dim", c.index_head_dim, false, 1));
    DSV4_TRY(f.u32("index_topk", c.index_topk, false, 1));
    DSV4_TRY(f.u32("hc_mult", c.hc_mult, false, 1));
    DSV4_TRY(f.u32("hc_sinkhorn_iters", c.hc_sinkhorn_iters, false, 1));
    DSV4_TRY(f.f64("hc_eps", c.hc_eps, true));
    DSV4_TRY(f.f64("rms_norm_eps", c.rms_norm_eps, true));
    DSV4_TRY(f.u32("n_shared_experts", c.n_shared_experts, false, 1));
    DSV4_TRY(f.string("scoring_func", c.scoring_func));
    DSV4_TRY(f.boolean("norm_topk_prob", c.norm_topk_prob));
    DSV4_TRY(f.f64("routed_scaling_factor", c.routed_scaling_factor, true));
    DSV4_TRY(f.f64("swiglu_limit", c.swiglu_limit, true));
    DSV4_TRY(f.u64("max_position_embeddings", c.max_position_embeddings));
    DSV4_TRY(f.i64("bos_token_id", c.bos_token_id));
    DSV4_TRY(f.boolean("tie_word_embeddings", c.tie_word_embeddings));
    DSV4_TRY(f.u32("num_nextn_predict_layers", c.num_nextn_predict_layers, false));
    DSV4_TRY(f.string("expert_dtype", c.expert_dtype));

    // eos_token_id: an integer or a list of integers
    if (const json* e = f.get("eos_token_id")) {
      c.eos_token_ids.clear();
      if (e->is_number_integer())
        c.eos_token_ids.push_back(e->get<int64_t>());
      else if (e->is_array()) {
        for (const auto& x : *e) {
          if (!x.is_number_integer()) return f.bad("eos_token_id", "is not an integer or a list of integers");
          c.eos_token_ids.push_back(x.get<int64_t>());
        }
      } else {
        return f.bad("eos_token_id", "is not an integer or a list of integers");
      }
    } else {
      f.note_default("eos_token_id");
    }

    if (const json* q = f.get("quantization_config")) {
      if (!q->is_object()) return f.bad("quantization_config", "is not an object");
      auto m = q->find("quant_method");
      if (m != q->end() && m->is_string() && m->get<std::string>() == "fp8") c.fp8_quantized = true;
    }

    // ---- RoPE dims: qk_rope_head_dim and/or partial_rotary_factor (must agree) ----
    bool have_rope_dims = false;
    if (f.has("qk_rope_head_dim")) {
      DSV4_TRY(f.u32("qk_rope_head_dim", c.qk_rope_head_dim, false, 2));
      have_rope_dims = true;
    }
    if (f.has("partial_rotary_factor")) {
      double prf = 0;
      DSV4_TRY(f.f64("partial_rotary_factor", prf, true));
      double dims = prf * c.head_dim;
      if (prf > 1.0 || std::fabs(dims - std::round(dims)) > 1e-6)
        return f.bad("partial_rotary_factor", "times head_dim is not a whole number of dims <= head_dim");
      uint32_t d = static_cast<uint32_t>(std::lround(dims));
      if (have_rope_dims && d != c.qk_rope_head_dim)
        return make_error("config: partial_rotary_factor x head_dim = %u disagrees with qk_rope_head_dim = %u", d,
                          c.qk_rope_head_dim);
      c.qk_rope_head_dim = d;
      have_rope_dims = true;
    }
    if (!have_rope_dims) {
      // transformers' default factor is 64/512 of head_dim
      c.qk_rope_head_dim = c.head_dim / 8;
      f.note_default("qk_rope_head_dim");
    }

    // ---- layer schedule ----
    const uint32_t L = c.num_hidden_layers;
    if (const json* lt = f.get("layer_types")) {
      if (!lt->is_array() || lt->size() < L) return f.bad("layer_types", "is not a list with one entry per layer");
      const json* rates = f.get("compress_rates");
      if (rates && !rates->is_object()) return f.bad("compress_rates", "is not an object");
      for (uint32_t i = 0; i < L; ++i) {
        if (!(*lt)[i].is_string()) return f.bad("layer_types", "has a non-string entry");
        bool ok = true;
        std::string err;
        uint32_t r = layer_type_ratio((*lt)[i].get<std::string>(), rates, ok, err);
        if (!ok) return make_error("config: layer_types[%u]: %s", i, err.c_str());
        c.compress_ratios.push_back(r);
      }
      c.schedule_source = HfScheduleSource::LAYER_TYPES;
    } else if (const json* cr = f.get("compress_ratios")) {
      if (!cr->is_array() || cr->size() < L)
        return f.bad("compress_ratios", "is not a list with (at least) one entry per layer");
      for (size_t i = 0; i < cr->size(); ++i) {
        uint64_t r = 0;
        if (!Fields::as_u64((*cr)[i], r) || r > 1u << 20) return f.bad("compress_ratios", "has an invalid entry");
        if (i < L)
          c.compress_ratios.push_back(static_cast<uint32_t>(r));
        else if (i == L)
          c.mtp_compress_ratio = static_cast<uint32_t>(r);
      }
      c.schedule_source = HfScheduleSource::COMPRESS_RATIOS;
    } else {
      // transformers' default: 2 heavily compressed layers, then alternating ratio 4 / 128
      for (uint32_t i = 0; i < L; ++i) c.compress_ratios.push_back(i < 2 ? 128 : ((i - 2) % 2 ? 4 : 128));
      c.schedule_source = HfScheduleSource::DEFAULT;
      f.note_default("compress_ratios");
    }

    // ---- hash layers: num_hash_layers, or the leading "hash_moe" entries of mlp_layer_types ----
    if (const json* mt = f.get("mlp_layer_types")) {
      if (!mt->is_array() || mt->size() < L) return f.bad("mlp_layer_types", "is not a list with one entry per layer");
      uint32_t n_hash = 0;
      bool in_prefix = true;
      for (uint32_t i = 0; i < L; ++i) {
        if (!(*mt)[i].is_string()) return f.bad("mlp_layer_types", "has a non-string entry");
        std::string t = (*mt)[i].get<std::string>();
        if (t == "hash_moe") {
          if (!in_prefix)
            return make_error("config: mlp_layer_types[%u] is hash_moe after a moe layer (hash layers must come first)",
                              i);
          ++n_hash;
        } else if (t == "moe") {
          in_prefix = false;
        } else {
          return make_error("config: mlp_layer_types[%u] = \"%s\" (expected hash_moe or moe)", i, t.c_str());
        }
      }
      if (f.has("num_hash_layers")) {
        uint32_t nh = 0;
        DSV4_TRY(f.u32("num_hash_layers", nh, false));
        if (nh != n_hash)
          return make_error("config: num_hash_layers = %u disagrees with mlp_layer_types (%u hash_moe)", nh, n_hash);
      }
      c.num_hash_layers = n_hash;
    } else {
      DSV4_TRY(f.u32("num_hash_layers", c.num_hash_layers, false));
    }

    // ---- RoPE bases and YaRN ----
    const json* rp = f.get("rope_parameters");
    if (rp && !rp->is_object()) return f.bad("rope_parameters", "is not an object");
    const json* rp_main = rp && rp->contains("main") ? &(*rp)["main"] : nullptr;
    const json* rp_comp = rp && rp->contains("compress") ? &(*rp)["compress"] : nullptr;
    if ((rp_main && !rp_main->is_object()) || (rp_comp && !rp_comp->is_object()))
      return f.bad("rope_parameters", "has a non-object \"main\"/\"compress\" entry");
    DSV4_TRY(f.f64("rope_theta", c.rope_theta, true));
    DSV4_TRY(f.f64("compress_rope_theta", c.compress_rope_theta, true));
    if (rp_main) {
      Fields m(*rp_main, "rope_parameters.main", nullptr);
      if (m.has("rope_theta")) DSV4_TRY(m.f64("rope_theta", c.rope_theta, true));
      std::string type;
      if (m.has("rope_type")) DSV4_TRY(m.string("rope_type", type));
      if (!type.empty() && type != "default")
        return make_error("config: rope_parameters.main.rope_type \"%s\" (ratio-0 layers use plain RoPE)",
                          type.c_str());
    }
    if (rp_comp) {
      Fields m(*rp_comp, "rope_parameters.compress", nullptr);
      if (m.has("rope_theta")) DSV4_TRY(m.f64("rope_theta", c.compress_rope_theta, true));
      DSV4_TRY(parse_yarn(*rp_comp, "config: rope_parameters.compress", c.yarn));
    } else if (const json* rs = f.get("rope_scaling")) {
      if (!rs->is_object()) return f.bad("rope_scaling", "is not an object");
      DSV4_TRY(parse_yarn(*rs, "config: rope_scaling", c.yarn));
    } else if (rp && !rp_main) {
      DSV4_TRY(parse_yarn(*rp, "config: rope_parameters", c.yarn));
    } else {
      f.note_default("rope_scaling");
    }
    return hf_config_validate(c);
  };
  if (auto st = run(); !st) return ctx(st.error());
  return c;
}

expected<HfConfig> hf_config_load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  DSV4_TRY_ASSIGN(auto m, MappedFile::open(file));
  std::string_view text(reinterpret_cast<const char*>(m->data()), m->size());
  return hf_config_parse(text, file);
}

Status hf_config_validate(const HfConfig& c) {
  if (c.num_key_value_heads != 1)
    return make_error("num_key_value_heads = %u: DeepSeek V4 attention has one shared K=V head", c.num_key_value_heads);
  if (c.qk_rope_head_dim == 0 || c.qk_rope_head_dim % 2 || c.qk_rope_head_dim > c.head_dim)
    return make_error("qk_rope_head_dim = %u must be even, > 0 and <= head_dim = %u", c.qk_rope_head_dim, c.head_dim);
  const bool indexer = std::find(c.compress_ratios.begin(), c.compress_ratios.end(), 4u) != c.compress_ratios.end();
  if (indexer && c.qk_rope_head_dim > c.index_head_dim)
    return make_error("qk_rope_head_dim = %u exceeds index_head_dim = %u (indexer vectors carry RoPE too)",
                      c.qk_rope_head_dim, c.index_head_dim);
  // wo_a splits the concatenated head outputs [num_attention_heads * head_dim] into o_groups equal slices.
  if ((uint64_t{c.num_attention_heads} * c.head_dim) % c.o_groups)
    return make_error("num_attention_heads x head_dim = %u x %u is not a multiple of o_groups = %u",
                      c.num_attention_heads, c.head_dim, c.o_groups);
  if (c.num_experts_per_tok > c.n_routed_experts)
    return make_error("num_experts_per_tok = %u exceeds n_routed_experts = %u", c.num_experts_per_tok,
                      c.n_routed_experts);
  if (c.num_hash_layers > c.num_hidden_layers)
    return make_error("num_hash_layers = %u exceeds num_hidden_layers = %u", c.num_hash_layers, c.num_hidden_layers);
  if (c.compress_ratios.size() != c.num_hidden_layers)
    return make_error("%zu compress ratios for %u layers", c.compress_ratios.size(), c.num_hidden_layers);
  for (size_t i = 0; i < c.compress_ratios.size(); ++i) {
    uint32_t r = c.compress_ratios[i];
    if (r != 0 && r != 4 && r != 128)
      return make_error("layer %zu has compress ratio %u (supported: 0 window only, 4 with indexer, 128)", i, r);
  }
  if (c.mtp_compress_ratio != 0)
    return make_error("MTP compress ratio %u (the MTP block is window-only)", c.mtp_compress_ratio);
  if (c.scoring_func != "sqrtsoftplus")
    return make_error("scoring_func \"%s\" is not supported (DeepSeek V4 routes with sqrtsoftplus)",
                      c.scoring_func.c_str());
  if (c.yarn.enabled) {
    if (!(c.yarn.factor >= 1.0)) return make_error("yarn factor %g must be >= 1", c.yarn.factor);
    if (c.yarn.original_max_position_embeddings == 0) return make_error("yarn original_max_position_embeddings is 0");
    if (c.yarn.attention_factor != 1.0)
      return make_error("yarn attention_factor %g: DeepSeek V4 never scales cos/sin (must be 1)",
                        c.yarn.attention_factor);
  }
  if (c.vocab_size < 2) return make_error("vocab_size %u is too small", c.vocab_size);
  if (c.bos_token_id < 0 || c.bos_token_id >= c.vocab_size)
    return make_error("bos_token_id %lld outside the vocabulary", (long long)c.bos_token_id);
  for (int64_t e : c.eos_token_ids)
    if (e < 0 || e >= c.vocab_size) return make_error("eos_token_id %lld outside the vocabulary", (long long)e);
  if (c.tie_word_embeddings) return make_error("tie_word_embeddings = true: DeepSeek V4 has an untied head");
  return {};
}

}  // namespace dsv4
