#include "model/tensor_table.h"

namespace dsv4 {

bool type_allowed(TypeClass c, GgmlType t) {
  using G = GgmlType;
  switch (c) {
    case TypeClass::F32_VEC: return t == G::F32;
    case TypeClass::I32_TABLE: return t == G::I32;
    case TypeClass::F16_MAT: return t == G::F16 || t == G::F32;
    // Every type both backends' matmuls compute with (the op harness tests each), not only the published
    // Q8_0: files with Q4_K attention projections or shared experts ("AProjQ4", "SExpQ4") load too.
    case TypeClass::DENSE_MAT:
      return t == G::Q8_0 || t == G::Q4_K || t == G::Q2_K || t == G::IQ2_XXS || t == G::F16 || t == G::F32;
    // MXFP4: routed experts only (the published MXFP4Experts file).
    case TypeClass::EXPERT_GATE_UP:
      return t == G::IQ2_XXS || t == G::Q2_K || t == G::Q4_K || t == G::Q8_0 || t == G::MXFP4 || t == G::F16 ||
             t == G::F32;
    case TypeClass::EXPERT_DOWN:
      return t == G::Q2_K || t == G::Q4_K || t == G::Q8_0 || t == G::MXFP4 || t == G::F16 || t == G::F32;
  }
  return false;
}

std::string allowed_types(TypeClass c) {
  std::string s;
  for (GgmlType t : {GgmlType::IQ2_XXS, GgmlType::Q2_K, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::MXFP4, GgmlType::F16,
                     GgmlType::F32, GgmlType::I32}) {
    if (!type_allowed(c, t)) continue;
    if (!s.empty()) s += ", ";
    s += ggml_type_name(t);
  }
  return s;
}

uint64_t TensorSpec::n_elements() const {
  uint64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

namespace {

using LT = LayerTensor;

// One row of the per-layer table: slot, name suffix, class, and a shape rule.
struct LayerRow {
  LT slot;
  const char* suffix;
  TypeClass cls;
};

constexpr LayerRow k_layer_rows[] = {
    {LT::HC_ATTN_FN, "hc_attn_fn.weight", TypeClass::F16_MAT},
    {LT::HC_ATTN_SCALE, "hc_attn_scale.weight", TypeClass::F32_VEC},
    {LT::HC_ATTN_BASE, "hc_attn_base.weight", TypeClass::F32_VEC},
    {LT::ATTN_NORM, "attn_norm.weight", TypeClass::F32_VEC},
    {LT::ATTN_Q_A, "attn_q_a.weight", TypeClass::DENSE_MAT},
    {LT::ATTN_Q_A_NORM, "attn_q_a_norm.weight", TypeClass::F32_VEC},
    {LT::ATTN_Q_B, "attn_q_b.weight", TypeClass::DENSE_MAT},
    {LT::ATTN_KV, "attn_kv.weight", TypeClass::DENSE_MAT},
    {LT::ATTN_KV_A_NORM, "attn_kv_a_norm.weight", TypeClass::F32_VEC},
    {LT::ATTN_SINKS, "attn_sinks.weight", TypeClass::F32_VEC},
    {LT::ATTN_OUTPUT_A, "attn_output_a.weight", TypeClass::DENSE_MAT},
    {LT::ATTN_OUTPUT_B, "attn_output_b.weight", TypeClass::DENSE_MAT},
    {LT::HC_FFN_FN, "hc_ffn_fn.weight", TypeClass::F16_MAT},
    {LT::HC_FFN_SCALE, "hc_ffn_scale.weight", TypeClass::F32_VEC},
    {LT::HC_FFN_BASE, "hc_ffn_base.weight", TypeClass::F32_VEC},
    {LT::FFN_NORM, "ffn_norm.weight", TypeClass::F32_VEC},
    {LT::FFN_GATE_INP, "ffn_gate_inp.weight", TypeClass::F16_MAT},
    {LT::EXP_PROBS_B, "exp_probs_b.bias", TypeClass::F32_VEC},
    {LT::FFN_GATE_TID2EID, "ffn_gate_tid2eid.weight", TypeClass::I32_TABLE},
    {LT::FFN_GATE_EXPS, "ffn_gate_exps.weight", TypeClass::EXPERT_GATE_UP},
    {LT::FFN_UP_EXPS, "ffn_up_exps.weight", TypeClass::EXPERT_GATE_UP},
    {LT::FFN_DOWN_EXPS, "ffn_down_exps.weight", TypeClass::EXPERT_DOWN},
    {LT::FFN_GATE_SHEXP, "ffn_gate_shexp.weight", TypeClass::DENSE_MAT},
    {LT::FFN_UP_SHEXP, "ffn_up_shexp.weight", TypeClass::DENSE_MAT},
    {LT::FFN_DOWN_SHEXP, "ffn_down_shexp.weight", TypeClass::DENSE_MAT},
    {LT::ATTN_COMPRESSOR_APE, "attn_compressor_ape.weight", TypeClass::F16_MAT},
    {LT::ATTN_COMPRESSOR_KV, "attn_compressor_kv.weight", TypeClass::F16_MAT},
    {LT::ATTN_COMPRESSOR_GATE, "attn_compressor_gate.weight", TypeClass::F16_MAT},
    {LT::ATTN_COMPRESSOR_NORM, "attn_compressor_norm.weight", TypeClass::F32_VEC},
    {LT::INDEXER_ATTN_Q_B, "indexer.attn_q_b.weight", TypeClass::F16_MAT},
    {LT::INDEXER_PROJ, "indexer.proj.weight", TypeClass::F16_MAT},
    {LT::INDEXER_COMPRESSOR_APE, "indexer_compressor_ape.weight", TypeClass::F16_MAT},
    {LT::INDEXER_COMPRESSOR_KV, "indexer_compressor_kv.weight", TypeClass::F16_MAT},
    {LT::INDEXER_COMPRESSOR_GATE, "indexer_compressor_gate.weight", TypeClass::F16_MAT},
    {LT::INDEXER_COMPRESSOR_NORM, "indexer_compressor_norm.weight", TypeClass::F32_VEC},
};
static_assert(sizeof(k_layer_rows) / sizeof(k_layer_rows[0]) == static_cast<size_t>(LT::COUNT));

// Presence of a per-layer tensor: 0 absent, 1 required, 2 optional.
// `ratio` is the layer's compress ratio; `hash` whether it is hash-routed;
// `mtp` for the MTP block (no compressor, indexer or hash table; bias required).
int presence(LT slot, uint32_t ratio, bool hash, bool mtp) {
  switch (slot) {
    case LT::EXP_PROBS_B: return mtp ? 1 : (hash ? 0 : 2);
    case LT::FFN_GATE_TID2EID: return hash && !mtp ? 1 : 0;
    case LT::ATTN_COMPRESSOR_APE:
    case LT::ATTN_COMPRESSOR_KV:
    case LT::ATTN_COMPRESSOR_GATE:
    case LT::ATTN_COMPRESSOR_NORM: return !mtp && ratio != 0 ? 1 : 0;
    case LT::INDEXER_ATTN_Q_B:
    case LT::INDEXER_PROJ:
    case LT::INDEXER_COMPRESSOR_APE:
    case LT::INDEXER_COMPRESSOR_KV:
    case LT::INDEXER_COMPRESSOR_GATE:
    case LT::INDEXER_COMPRESSOR_NORM: return !mtp && ratio == 4 ? 1 : 0;
    case LT::HC_ATTN_FN:
    case LT::HC_ATTN_SCALE:
    case LT::HC_ATTN_BASE:
    case LT::ATTN_NORM:
    case LT::ATTN_Q_A:
    case LT::ATTN_Q_A_NORM:
    case LT::ATTN_Q_B:
    case LT::ATTN_KV:
    case LT::ATTN_KV_A_NORM:
    case LT::ATTN_SINKS:
    case LT::ATTN_OUTPUT_A:
    case LT::ATTN_OUTPUT_B:
    case LT::HC_FFN_FN:
    case LT::HC_FFN_SCALE:
    case LT::HC_FFN_BASE:
    case LT::FFN_NORM:
    case LT::FFN_GATE_INP:
    case LT::FFN_GATE_EXPS:
    case LT::FFN_UP_EXPS:
    case LT::FFN_DOWN_EXPS:
    case LT::FFN_GATE_SHEXP:
    case LT::FFN_UP_SHEXP:
    case LT::FFN_DOWN_SHEXP: return 1;
    case LT::COUNT: break;
  }
  return 0;
}

// Shape of a per-layer tensor (GGUF order).
std::vector<uint64_t> layer_shape(const ModelSpec& s, LT slot, uint32_t ratio) {
  const uint64_t D = s.n_embd, hd = s.head_dim, H = s.n_head, G = s.o_groups, E = s.n_expert, F = s.expert_ff;
  const uint64_t hc = s.hc_count, mix = s.hc_mix_width();
  const uint64_t Fs = F * s.n_expert_shared;
  const uint64_t c = ratio == 4 ? 2 : 1;
  const uint64_t dI = s.indexer_head_dim;
  switch (slot) {
    case LT::HC_ATTN_FN:
    case LT::HC_FFN_FN: return {hc * D, mix};
    case LT::HC_ATTN_SCALE:
    case LT::HC_FFN_SCALE: return {3};
    case LT::HC_ATTN_BASE:
    case LT::HC_FFN_BASE: return {mix};
    case LT::ATTN_NORM:
    case LT::FFN_NORM: return {D};
    case LT::ATTN_Q_A: return {D, s.q_lora_rank};
    case LT::ATTN_Q_A_NORM: return {s.q_lora_rank};
    case LT::ATTN_Q_B: return {s.q_lora_rank, H * hd};
    case LT::ATTN_KV: return {D, hd};
    case LT::ATTN_KV_A_NORM: return {hd};
    case LT::ATTN_SINKS: return {H};
    case LT::ATTN_OUTPUT_A: return {H * hd / G, G * s.o_lora_rank};
    case LT::ATTN_OUTPUT_B: return {G * s.o_lora_rank, D};
    case LT::FFN_GATE_INP: return {D, E};
    case LT::EXP_PROBS_B: return {E};
    case LT::FFN_GATE_TID2EID: return {s.n_expert_used, s.n_vocab};
    case LT::FFN_GATE_EXPS:
    case LT::FFN_UP_EXPS: return {D, F, E};
    case LT::FFN_DOWN_EXPS: return {F, D, E};
    case LT::FFN_GATE_SHEXP:
    case LT::FFN_UP_SHEXP: return {D, Fs};
    case LT::FFN_DOWN_SHEXP: return {Fs, D};
    case LT::ATTN_COMPRESSOR_APE: return {c * hd, ratio};
    case LT::ATTN_COMPRESSOR_KV:
    case LT::ATTN_COMPRESSOR_GATE: return {D, c * hd};
    case LT::ATTN_COMPRESSOR_NORM: return {hd};
    case LT::INDEXER_ATTN_Q_B: return {s.q_lora_rank, s.indexer_heads * dI};
    case LT::INDEXER_PROJ: return {D, s.indexer_heads};
    case LT::INDEXER_COMPRESSOR_APE: return {2 * dI, 4};
    case LT::INDEXER_COMPRESSOR_KV:
    case LT::INDEXER_COMPRESSOR_GATE: return {D, 2 * dI};
    case LT::INDEXER_COMPRESSOR_NORM: return {dI};
    case LT::COUNT: break;
  }
  return {};
}

void add_block(std::vector<TensorSpec>& out, const ModelSpec& s, const std::string& prefix, int layer, uint32_t ratio,
               bool hash, bool mtp) {
  for (const auto& row : k_layer_rows) {
    int p = presence(row.slot, ratio, hash, mtp);
    if (p == 0) continue;
    TensorSpec t;
    t.name = prefix + row.suffix;
    t.ne = layer_shape(s, row.slot, ratio);
    t.cls = row.cls;
    t.scope = mtp ? TensorScope::MTP_LAYER : TensorScope::LAYER;
    t.layer = layer;
    t.slot = static_cast<int>(row.slot);
    t.required = p == 1;
    out.push_back(std::move(t));
  }
}

}  // namespace

std::vector<TensorSpec> main_tensor_table(const ModelSpec& s) {
  std::vector<TensorSpec> out;
  const uint64_t D = s.n_embd, hc = s.hc_count;
  auto global = [&](GlobalTensor slot, const char* name, std::vector<uint64_t> ne, TypeClass cls) {
    out.push_back({name, std::move(ne), cls, TensorScope::GLOBAL, -1, static_cast<int>(slot), true});
  };
  global(GlobalTensor::TOKEN_EMBD, "token_embd.weight", {D, s.n_vocab}, TypeClass::F16_MAT);
  global(GlobalTensor::OUTPUT_HC_BASE, "output_hc_base.weight", {hc}, TypeClass::F32_VEC);
  global(GlobalTensor::OUTPUT_HC_FN, "output_hc_fn.weight", {hc * D, hc}, TypeClass::F16_MAT);
  global(GlobalTensor::OUTPUT_HC_SCALE, "output_hc_scale.weight", {1}, TypeClass::F32_VEC);
  global(GlobalTensor::OUTPUT_NORM, "output_norm.weight", {D}, TypeClass::F32_VEC);
  global(GlobalTensor::OUTPUT, "output.weight", {D, s.n_vocab}, TypeClass::DENSE_MAT);
  for (uint32_t il = 0; il < s.n_layer; ++il)
    add_block(out, s, "blk." + std::to_string(il) + ".", static_cast<int>(il), s.ratio(il), s.is_hash_layer(il), false);
  return out;
}

std::vector<TensorSpec> mtp_tensor_table(const ModelSpec& s) {
  std::vector<TensorSpec> out;
  const uint64_t D = s.n_embd, hc = s.hc_count;
  auto head = [&](MtpTensor slot, const char* name, std::vector<uint64_t> ne, TypeClass cls) {
    out.push_back(
        {std::string("mtp.0.") + name, std::move(ne), cls, TensorScope::MTP_HEAD, -1, static_cast<int>(slot), true});
  };
  head(MtpTensor::HC_HEAD_BASE, "hc_head_base.weight", {hc}, TypeClass::F32_VEC);
  head(MtpTensor::HC_HEAD_FN, "hc_head_fn.weight", {hc * D, hc}, TypeClass::F16_MAT);
  head(MtpTensor::HC_HEAD_SCALE, "hc_head_scale.weight", {1}, TypeClass::F32_VEC);
  head(MtpTensor::E_PROJ, "e_proj.weight", {D, D}, TypeClass::DENSE_MAT);
  head(MtpTensor::H_PROJ, "h_proj.weight", {D, D}, TypeClass::DENSE_MAT);
  head(MtpTensor::ENORM, "enorm.weight", {D}, TypeClass::F32_VEC);
  head(MtpTensor::HNORM, "hnorm.weight", {D}, TypeClass::F32_VEC);
  head(MtpTensor::NORM, "norm.weight", {D}, TypeClass::F32_VEC);
  add_block(out, s, "mtp.0.", static_cast<int>(s.n_layer), 0, false, true);
  return out;
}

std::vector<TensorSpec> dspark_tensor_table(const ModelSpec& s, const DSparkMeta& m) {
  std::vector<TensorSpec> out;
  const uint64_t D = s.n_embd, hc = s.hc_count, V = s.n_vocab, R = m.markov_rank;
  const uint64_t n_target = m.target_layers.size();
  const std::string last = "mtp." + std::to_string(m.stage_count - 1) + ".";
  auto head = [&](DSparkTensor slot, const std::string& name, std::vector<uint64_t> ne, TypeClass cls) {
    out.push_back({name, std::move(ne), cls, TensorScope::DSPARK_HEAD, -1, static_cast<int>(slot), true});
  };
  for (uint32_t st = 0; st < m.stage_count; ++st) {
    const std::string prefix = "mtp." + std::to_string(st) + ".";
    if (st == 0) {
      head(DSparkTensor::MAIN_PROJ, prefix + "main_proj.weight", {n_target * D, D}, TypeClass::DENSE_MAT);
      head(DSparkTensor::MAIN_NORM, prefix + "main_norm.weight", {D}, TypeClass::F32_VEC);
    }
    add_block(out, s, prefix, static_cast<int>(st), 0, false, true);
  }
  head(DSparkTensor::NORM, last + "norm.weight", {D}, TypeClass::F32_VEC);
  head(DSparkTensor::HC_HEAD_BASE, last + "hc_head_base.weight", {hc}, TypeClass::F32_VEC);
  head(DSparkTensor::HC_HEAD_FN, last + "hc_head_fn.weight", {hc * D, hc}, TypeClass::F16_MAT);
  head(DSparkTensor::HC_HEAD_SCALE, last + "hc_head_scale.weight", {1}, TypeClass::F32_VEC);
  head(DSparkTensor::MARKOV_W1, last + "markov_head.markov_w1.weight", {R, V}, TypeClass::DENSE_MAT);
  head(DSparkTensor::MARKOV_W2, last + "markov_head.markov_w2.weight", {R, V}, TypeClass::DENSE_MAT);
  head(DSparkTensor::CONFIDENCE, last + "confidence_head.proj.weight", {D + R, 1}, TypeClass::DENSE_MAT);
  return out;
}

const char* quant_recipe_name(QuantRecipe r) {
  switch (r) {
    case QuantRecipe::Q2: return "q2";
    case QuantRecipe::Q2_Q4: return "q2-q4";
    case QuantRecipe::Q4: return "q4";
    case QuantRecipe::Q8: return "q8";
    case QuantRecipe::MXFP4: return "mxfp4";
    case QuantRecipe::F16: return "f16";
    case QuantRecipe::F32: return "f32";
  }
  return "?";
}

expected<QuantRecipe> quant_recipe_from_name(const std::string& name) {
  for (QuantRecipe r : {QuantRecipe::Q2, QuantRecipe::Q2_Q4, QuantRecipe::Q4, QuantRecipe::Q8, QuantRecipe::MXFP4,
                        QuantRecipe::F16, QuantRecipe::F32})
    if (name == quant_recipe_name(r)) return r;
  return make_error("unknown quantisation \"%s\" (expected q2, q2-q4, q4, q8, mxfp4, f16 or f32)", name.c_str());
}

GgmlType recipe_type(QuantRecipe r, const TensorSpec& t, uint32_t n_layer) {
  using G = GgmlType;
  switch (t.cls) {
    case TypeClass::F32_VEC: return G::F32;
    case TypeClass::I32_TABLE: return G::I32;
    case TypeClass::F16_MAT: return r == QuantRecipe::F32 ? G::F32 : G::F16;
    case TypeClass::DENSE_MAT: return r == QuantRecipe::F32 ? G::F32 : r == QuantRecipe::F16 ? G::F16 : G::Q8_0;
    case TypeClass::EXPERT_GATE_UP:
    case TypeClass::EXPERT_DOWN: {
      bool down = t.cls == TypeClass::EXPERT_DOWN;
      switch (r) {
        case QuantRecipe::Q2: return down ? G::Q2_K : G::IQ2_XXS;
        case QuantRecipe::Q2_Q4:
          if (t.layer >= 0 && t.layer + k_q2_q4_tail_layers >= static_cast<int>(n_layer)) return G::Q4_K;
          return down ? G::Q2_K : G::IQ2_XXS;
        case QuantRecipe::Q4: return G::Q4_K;
        case QuantRecipe::Q8: return G::Q8_0;
        case QuantRecipe::MXFP4: return G::MXFP4;
        case QuantRecipe::F16: return G::F16;
        case QuantRecipe::F32: return G::F32;
      }
    }
  }
  return G::F32;
}

}  // namespace dsv4
