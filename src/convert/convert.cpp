#include "convert/convert.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "quant/quant.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "hf/hf_names.h"
#include "hf/safetensors.h"
#include "quant/quant.h"
#include "synth/synth_vocab.h"

namespace dsv4 {

expected<ModelSpec> spec_from_hf(const HfConfig& c) {
  if (c.scoring_func != "sqrtsoftplus")
    return make_error("config scoring_func \"%s\": DeepSeek V4 routes with sqrtsoftplus", c.scoring_func.c_str());
  if (c.yarn.attention_factor != 1.0) return make_error("config YaRN attention_factor must be 1 for DeepSeek V4");
  ModelSpec s;
  s.name = "DeepSeek V4 (converted)";
  s.n_layer = c.num_hidden_layers;
  s.n_embd = c.hidden_size;
  s.n_vocab = c.vocab_size;
  s.n_head = c.num_attention_heads;
  s.n_head_kv = c.num_key_value_heads;
  s.head_dim = c.head_dim;
  s.rope_dim = c.qk_rope_head_dim;
  s.q_lora_rank = c.q_lora_rank;
  s.o_lora_rank = c.o_lora_rank;
  s.o_groups = c.o_groups;
  s.n_expert = c.n_routed_experts;
  s.n_expert_used = c.num_experts_per_tok;
  s.n_expert_shared = c.n_shared_experts;
  s.expert_ff = c.moe_intermediate_size;
  s.n_hash_layers = c.num_hash_layers;
  s.sliding_window = c.sliding_window;
  s.indexer_heads = c.index_n_heads;
  s.indexer_head_dim = c.index_head_dim;
  s.indexer_top_k = c.index_topk;
  s.hc_count = c.hc_mult;
  s.hc_sinkhorn_iters = c.hc_sinkhorn_iters;
  s.compress_ratios = c.compress_ratios;
  s.compress_ratios.push_back(c.mtp_compress_ratio);
  s.swiglu_clamp.assign(s.n_layer + 1, static_cast<float>(c.swiglu_limit));
  s.rope_theta = static_cast<float>(c.rope_theta);
  s.compress_rope_theta = static_cast<float>(c.compress_rope_theta);
  if (c.yarn.enabled) {
    s.rope_scale_factor = static_cast<float>(c.yarn.factor);
    s.rope_orig_ctx = c.yarn.original_max_position_embeddings;
    s.yarn_beta_fast = static_cast<float>(c.yarn.beta_fast);
    s.yarn_beta_slow = static_cast<float>(c.yarn.beta_slow);
  } else {
    // Factor 1 makes the YaRN blend the identity: plain RoPE with compress_rope_theta.
    s.rope_scale_factor = 1.0f;
    s.rope_orig_ctx = c.max_position_embeddings;
    s.yarn_beta_fast = 32.0f;
    s.yarn_beta_slow = 1.0f;
  }
  s.expert_weights_scale = static_cast<float>(c.routed_scaling_factor);
  s.expert_weights_norm = c.norm_topk_prob;
  s.rms_eps = static_cast<float>(c.rms_norm_eps);
  s.hc_eps = static_cast<float>(c.hc_eps);
  s.context_length = c.max_position_embeddings;
  DSV4_TRY(s.validate());
  return s;
}

namespace {

// tokenizer.json (HF `tokenizers`): BPE vocab, merges and added tokens.
expected<SynthVocab> vocab_from_tokenizer_json(const std::string& path, uint32_t n_vocab) {
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return make_error("%s is not valid JSON", path.c_str());
  const auto& model = j["model"];
  if (!model.is_object() || model.value("type", "") != "BPE" || !model["vocab"].is_object() ||
      !model["merges"].is_array())
    return make_error("%s: expected a BPE model with vocab and merges", path.c_str());
  SynthVocab v;
  v.tokens.assign(n_vocab, "");
  v.types.assign(n_vocab, static_cast<int32_t>(TokenType::UNUSED));
  auto put = [&](const std::string& text, int64_t id, TokenType type) -> Status {
    if (id < 0 || id >= static_cast<int64_t>(n_vocab))
      return make_error("%s: token id %lld outside the model vocabulary of %u", path.c_str(),
                        static_cast<long long>(id), n_vocab);
    v.tokens[static_cast<size_t>(id)] = text;
    v.types[static_cast<size_t>(id)] = static_cast<int32_t>(type);
    return {};
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      return make_error("%s: vocab id of \"%s\" is not an integer", path.c_str(), text.c_str());
    DSV4_TRY(put(text, id.get<int64_t>(), TokenType::NORMAL));
  }
  if (j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"]) {
      if (!t.is_object() || !t["id"].is_number_integer() || !t["content"].is_string()) continue;
      DSV4_TRY(put(t["content"].get<std::string>(), t["id"].get<int64_t>(),
                   t.value("special", false) ? TokenType::CONTROL : TokenType::USER_DEFINED));
    }
  for (const auto& m : model["merges"]) {
    if (m.is_string())
      v.merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else
      return make_error("%s: a merge is neither \"a b\" nor [a, b]", path.c_str());
  }
  for (uint32_t id = 0; id < n_vocab; ++id)
    if (v.tokens[id].empty()) v.tokens[id] = strfmt("<\xef\xbd\x9cunused\xe2\x96\x81%u\xef\xbd\x9c>", id);
  return v;
}

// Reads GGUF rows [row0, row0 + n) of a planned tensor (its pieces concatenated) as f32 or i32.
Status read_rows(const HfCheckpoint& ck, const GgufTensorPlan& plan, uint64_t row0, uint64_t n, float* f32,
                 int32_t* i32) {
  uint64_t at = 0;  // first GGUF row of the current piece
  const uint64_t ne0 = plan.ne[0];
  for (const auto& p : plan.pieces) {
    uint64_t lo = std::max(row0, at), hi = std::min(row0 + n, at + p.n_rows);
    if (lo < hi) {
      const StTensor* src = ck.find(p.source);
      if (!src) return make_error("tensor %s disappeared from the checkpoint", p.source.c_str());
      uint64_t src_row = p.first_row + (lo - at), rows = hi - lo;
      uint64_t off = (lo - row0) * ne0;
      if (i32) {
        DSV4_TRY(st_read_rows_i32(*src, src_row, rows, i32 + off));
      } else if (p.storage == HfStorage::PLAIN) {
        DSV4_TRY(st_read_rows_f32(*src, src_row, rows, f32 + off));
      } else {
        const StTensor* scale = ck.find(p.scale);
        if (!scale) return make_error("scale tensor %s missing", p.scale.c_str());
        auto fmt = p.storage == HfStorage::FP8_BLOCK ? StScaledFormat::FP8_BLOCK : StScaledFormat::FP4_PACKED;
        DSV4_TRY(st_read_rows_f32_scaled(*src, *scale, fmt, src_row, rows, f32 + off));
      }
    }
    at += p.n_rows;
  }
  return {};
}

// Whether every piece of a planned tensor is packed FP4 with one E8M0 scale per 32 values: its MXFP4
// blocks are then the checkpoint's bytes rearranged (formats.md §2.8), with no arithmetic.
bool fp4_repackable(const HfCheckpoint& ck, const GgufTensorPlan& plan) {
  for (const HfPiece& p : plan.pieces) {
    if (p.storage != HfStorage::FP4_PACKED || p.row_length % quant::k_qk_mxfp4) return false;
    const StTensor* s = ck.find(p.scale);
    if (!s || s->dtype != StDtype::F8_E8M0) return false;
  }
  return !plan.pieces.empty();
}

// GGUF rows [row0, row0 + n) of a repackable tensor as MXFP4 blocks: byte 0 = the source's scale byte;
// byte 1 + i = the code of element 32b + i (low nibble) and of element 32b + 16 + i (high nibble), where
// the source holds element 2k in the low nibble of byte k and 2k + 1 in the high one.
Status repack_mxfp4_rows(const HfCheckpoint& ck, const GgufTensorPlan& plan, uint64_t row0, uint64_t n, uint8_t* dst) {
  const uint64_t ne0 = plan.ne[0], blocks = ne0 / quant::k_qk_mxfp4;
  const uint64_t rb = ggml_row_bytes(GgmlType::MXFP4, ne0);
  uint64_t at = 0;
  for (const HfPiece& p : plan.pieces) {
    const uint64_t lo = std::max(row0, at), hi = std::min(row0 + n, at + p.n_rows);
    if (lo < hi) {
      const StTensor* w = ck.find(p.source);
      const StTensor* s = ck.find(p.scale);
      if (!w || !s) return make_error("tensor %s or its scale disappeared from the checkpoint", p.source.c_str());
      DSV4_TRY_ASSIGN(const auto shape, st_scaled_logical_shape(*w, *s, StScaledFormat::FP4_PACKED));
      if (shape.second != ne0 || p.first_row + (hi - at) > shape.first)
        return make_error("%s: packed FP4 rows do not fit the planned tensor", p.source.c_str());
      for (uint64_t r = lo; r < hi; ++r) {
        const uint64_t src_row = p.first_row + (r - at);
        const uint8_t* codes = w->data + src_row * (ne0 / 2);
        const uint8_t* scales = s->data + src_row * blocks;
        uint8_t* out = dst + (r - row0) * rb;
        auto code = [&](uint64_t k) { return static_cast<uint8_t>((codes[k / 2] >> (4 * (k & 1))) & 0xF); };
        for (uint64_t b = 0; b < blocks; ++b) {
          uint8_t* blk = out + b * sizeof(quant::BlockMXFP4);
          blk[0] = scales[b];
          for (uint64_t i = 0; i < 16; ++i)
            blk[1 + i] = static_cast<uint8_t>(code(32 * b + i) | code(32 * b + 16 + i) << 4);
        }
      }
    }
    at += p.n_rows;
  }
  return {};
}

}  // namespace

Status check_recipe_fits(const ModelSpec& spec, QuantRecipe recipe) {
  for (const TensorSpec& t : main_tensor_table(spec)) {
    const GgmlType type = recipe_type(recipe, t, spec.n_layer);
    const uint32_t block = ggml_type_info(type).block_elems;
    if (t.ne[0] % block)
      return make_error(
          "%s has rows of %llu values: the %s recipe stores it as %s, whose blocks hold %u values; "
          "convert with --type f16 or f32",
          t.name.c_str(), static_cast<unsigned long long>(t.ne[0]), quant_recipe_name(recipe), ggml_type_name(type),
          block);
  }
  return {};
}

expected<ConvertReport> convert_hf(const ConvertOptions& o, const std::function<void(uint64_t, uint64_t)>& progress) {
  DSV4_TRY_ASSIGN(HfConfig cfg, hf_config_load(o.hf_dir));
  DSV4_TRY_ASSIGN(ModelSpec spec, spec_from_hf(cfg));
  DSV4_TRY(check_recipe_fits(spec, o.recipe));
  DSV4_TRY_ASSIGN(auto ck, HfCheckpoint::open(o.hf_dir));
  DSV4_TRY_ASSIGN(HfConversionPlan plan, hf_plan_conversion(cfg, hf_describe(*ck)));
  std::unordered_map<std::string, const GgufTensorPlan*> by_name;
  for (const auto& t : plan.tensors) by_name[t.name] = &t;

  ConvertReport report;
  GgufWriter w;
  spec.write_gguf(w);
  w.set_string("general.name", "DeepSeek V4 converted from " + std::filesystem::path(o.hf_dir).filename().string() +
                                   " (" + quant_recipe_name(o.recipe) + ")");
  SynthVocab vocab;
  std::string tj = (std::filesystem::path(o.hf_dir) / "tokenizer.json").string();
  if (std::filesystem::exists(tj)) {
    DSV4_TRY_ASSIGN(vocab, vocab_from_tokenizer_json(tj, spec.n_vocab));
    report.vocab_source = "tokenizer.json";
  } else {
    if (spec.n_vocab < 300)
      return make_error("%s has no tokenizer.json and a vocabulary below 300 tokens", o.hf_dir.c_str());
    vocab = make_synth_vocab(spec.n_vocab);
    report.vocab_source = "synthetic byte-level vocabulary (no tokenizer.json)";
    log_warn("%s has no tokenizer.json: writing a synthetic byte-level vocabulary", o.hf_dir.c_str());
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "joyai-llm");
  w.set_array_string("tokenizer.ggml.tokens", vocab.tokens);
  w.set_array_i32("tokenizer.ggml.token_type", vocab.types);
  w.set_array_string("tokenizer.ggml.merges", vocab.merges);
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(cfg.bos_token_id));
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(cfg.eos_token_ids.empty() ? 1 : cfg.eos_token_ids[0]));

  auto pool = std::make_shared<ThreadPool>(o.threads);
  const HfCheckpoint* ckp = ck.get();
  for (const TensorSpec& t : main_tensor_table(spec)) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      if (t.required) return make_error("the checkpoint has no source for %s", t.name.c_str());
      continue;
    }
    const GgufTensorPlan* p = it->second;
    if (p->ne != t.ne) return make_error("%s: planned shape does not match the tensor table", t.name.c_str());
    const GgmlType type = recipe_type(o.recipe, t, spec.n_layer);
    const uint64_t ne0 = t.ne[0];
    const bool is_int = t.cls == TypeClass::I32_TABLE;
    const bool repack = type == GgmlType::MXFP4 && fp4_repackable(*ck, *p);
    if (type == GgmlType::MXFP4) ++(repack ? report.mxfp4_repacked : report.mxfp4_quantised);
    report.n_tensors++;
    report.tensor_bytes += ggml_type_bytes(type, t.n_elements());
    const std::string name = t.name;
    w.add_tensor(t.name, type, t.ne,
                 [ckp, p, type, ne0, is_int, repack, name, pool](uint64_t r0, uint64_t nr, uint8_t* dst) -> Status {
                   if (is_int) return read_rows(*ckp, *p, r0, nr, nullptr, reinterpret_cast<int32_t*>(dst));
                   std::vector<float> rows(static_cast<size_t>(nr * ne0));
                   DSV4_TRY(read_rows(*ckp, *p, r0, nr, rows.data(), nullptr));
                   const uint64_t rb = ggml_row_bytes(type, ne0);
                   if (repack) {
                     // Copied, then checked back: every block decodes to the checkpoint's own value.
                     DSV4_TRY(repack_mxfp4_rows(*ckp, *p, r0, nr, dst));
                     std::vector<float> back(static_cast<size_t>(ne0));
                     for (uint64_t r = 0; r < nr; ++r) {
                       quant::dequantize_row(type, dst + r * rb, back.data(), static_cast<int64_t>(ne0));
                       for (uint64_t c = 0; c < ne0; ++c)
                         if (back[c] != rows[r * ne0 + c])
                           return make_error("%s row %llu: the repacked MXFP4 value %g is not the checkpoint's %g",
                                             name.c_str(), static_cast<unsigned long long>(r0 + r),
                                             static_cast<double>(back[c]), static_cast<double>(rows[r * ne0 + c]));
                     }
                     return {};
                   }
                   pool->parallel_for(static_cast<size_t>(nr), [&](size_t b, size_t e) {
                     for (size_t r = b; r < e; ++r)
                       quant::quantize_row(type, rows.data() + r * ne0, dst + r * rb, static_cast<int64_t>(ne0),
                                           nullptr);
                   });
                   return {};
                 });
  }
  DSV4_TRY(w.write(o.output, progress, 16ull << 20));
  return report;
}

}  // namespace dsv4
