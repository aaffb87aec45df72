#include "hf/hf_names.h"

#include <algorithm>
#include <map>
#include <set>

namespace dsv4 {

namespace {

using R = HfRole;

// One per-block tensor: GGUF suffix (after "blk.N." / "mtp.N."), release suffix (after
// "layers.N." / "mtp.N."), transformers-saved suffix where it differs, transformers module
// suffix. Rows are in the GGUF order of formats.md §1.6. The routed experts have no fixed
// suffix (release: ffn.experts.E.w{1,3,2}.weight; module: fused tensors) and are handled apart.
struct BlockRow {
  R role;
  const char* gguf;
  const char* release;
  const char* saved;
  const char* module;
};

constexpr BlockRow k_block_rows[] = {
    {R::HC_ATTN_FN, "hc_attn_fn.weight", "hc_attn_fn", nullptr, "attn_hc.fn"},
    {R::HC_ATTN_SCALE, "hc_attn_scale.weight", "hc_attn_scale", nullptr, "attn_hc.scale"},
    {R::HC_ATTN_BASE, "hc_attn_base.weight", "hc_attn_base", nullptr, "attn_hc.base"},
    {R::ATTN_NORM, "attn_norm.weight", "attn_norm.weight", nullptr, "input_layernorm.weight"},
    {R::ATTN_Q_A, "attn_q_a.weight", "attn.wq_a.weight", nullptr, "self_attn.q_a_proj.weight"},
    {R::ATTN_Q_A_NORM, "attn_q_a_norm.weight", "attn.q_norm.weight", nullptr, "self_attn.q_a_norm.weight"},
    {R::ATTN_Q_B, "attn_q_b.weight", "attn.wq_b.weight", nullptr, "self_attn.q_b_proj.weight"},
    {R::ATTN_KV, "attn_kv.weight", "attn.wkv.weight", nullptr, "self_attn.kv_proj.weight"},
    {R::ATTN_KV_NORM, "attn_kv_a_norm.weight", "attn.kv_norm.weight", "attn.norm.weight", "self_attn.kv_norm.weight"},
    {R::ATTN_SINKS, "attn_sinks.weight", "attn.attn_sink", nullptr, "self_attn.sinks"},
    {R::ATTN_OUT_A, "attn_output_a.weight", "attn.wo_a.weight", nullptr, "self_attn.o_a_proj.weight"},
    {R::ATTN_OUT_B, "attn_output_b.weight", "attn.wo_b.weight", nullptr, "self_attn.o_b_proj.weight"},
    {R::HC_FFN_FN, "hc_ffn_fn.weight", "hc_ffn_fn", nullptr, "ffn_hc.fn"},
    {R::HC_FFN_SCALE, "hc_ffn_scale.weight", "hc_ffn_scale", nullptr, "ffn_hc.scale"},
    {R::HC_FFN_BASE, "hc_ffn_base.weight", "hc_ffn_base", nullptr, "ffn_hc.base"},
    {R::FFN_NORM, "ffn_norm.weight", "ffn_norm.weight", nullptr, "post_attention_layernorm.weight"},
    {R::FFN_GATE_INP, "ffn_gate_inp.weight", "ffn.gate.weight", nullptr, "mlp.gate.weight"},
    {R::FFN_EXP_PROBS_B, "exp_probs_b.bias", "ffn.gate.bias", nullptr, "mlp.gate.e_score_correction_bias"},
    {R::FFN_TID2EID, "ffn_gate_tid2eid.weight", "ffn.gate.tid2eid", nullptr, "mlp.gate.tid2eid"},
    {R::EXPERT_GATE, "ffn_gate_exps.weight", nullptr, nullptr, nullptr},
    {R::EXPERT_UP, "ffn_up_exps.weight", nullptr, nullptr, nullptr},
    {R::EXPERT_DOWN, "ffn_down_exps.weight", nullptr, nullptr, nullptr},
    {R::FFN_GATE_SHEXP, "ffn_gate_shexp.weight", "ffn.shared_experts.w1.weight", nullptr,
     "mlp.shared_experts.gate_proj.weight"},
    {R::FFN_UP_SHEXP, "ffn_up_shexp.weight", "ffn.shared_experts.w3.weight", nullptr,
     "mlp.shared_experts.up_proj.weight"},
    {R::FFN_DOWN_SHEXP, "ffn_down_shexp.weight", "ffn.shared_experts.w2.weight", nullptr,
     "mlp.shared_experts.down_proj.weight"},
    {R::CMP_APE, "attn_compressor_ape.weight", "attn.compressor.ape", nullptr, "self_attn.compressor.position_bias"},
    {R::CMP_KV, "attn_compressor_kv.weight", "attn.compressor.wkv.weight", nullptr,
     "self_attn.compressor.kv_proj.weight"},
    {R::CMP_GATE, "attn_compressor_gate.weight", "attn.compressor.wgate.weight", nullptr,
     "self_attn.compressor.gate_proj.weight"},
    {R::CMP_NORM, "attn_compressor_norm.weight", "attn.compressor.norm.weight", nullptr,
     "self_attn.compressor.kv_norm.weight"},
    {R::IDX_Q_B, "indexer.attn_q_b.weight", "attn.indexer.wq_b.weight", nullptr,
     "self_attn.compressor.indexer.q_b_proj.weight"},
    {R::IDX_PROJ, "indexer.proj.weight", "attn.indexer.weights_proj.weight", nullptr,
     "self_attn.compressor.indexer.scorer.weights_proj.weight"},
    {R::IDX_CMP_APE, "indexer_compressor_ape.weight", "attn.indexer.compressor.ape", nullptr,
     "self_attn.compressor.indexer.position_bias"},
    {R::IDX_CMP_KV, "indexer_compressor_kv.weight", "attn.indexer.compressor.wkv.weight", nullptr,
     "self_attn.compressor.indexer.kv_proj.weight"},
    {R::IDX_CMP_GATE, "indexer_compressor_gate.weight", "attn.indexer.compressor.wgate.weight", nullptr,
     "self_attn.compressor.indexer.gate_proj.weight"},
    {R::IDX_CMP_NORM, "indexer_compressor_norm.weight", "attn.indexer.compressor.norm.weight", nullptr,
     "self_attn.compressor.indexer.kv_norm.weight"},
};

// Trunk tensors (GGUF order): full names; the transformers spellings include "model." where
// transformers writes it.
struct TrunkRow {
  R role;
  const char* gguf;
  const char* release;
  const char* saved;
  const char* module;
};

constexpr TrunkRow k_trunk_rows[] = {
    {R::TOKEN_EMBD, "token_embd.weight", "embed.weight", "model.embed_tokens.weight", "model.embed_tokens.weight"},
    {R::OUTPUT_HC_BASE, "output_hc_base.weight", "hc_head_base", "model.hc_head.hc_base", "model.hc_head.hc_base"},
    {R::OUTPUT_HC_FN, "output_hc_fn.weight", "hc_head_fn", "model.hc_head.hc_fn", "model.hc_head.hc_fn"},
    {R::OUTPUT_HC_SCALE, "output_hc_scale.weight", "hc_head_scale", "model.hc_head.hc_scale", "model.hc_head.hc_scale"},
    {R::OUTPUT_NORM, "output_norm.weight", "norm.weight", "model.norm.weight", "model.norm.weight"},
    {R::OUTPUT, "output.weight", "head.weight", "head.weight", "lm_head.weight"},
};

// MTP head tensors (after "mtp.N."), in the order of formats.md §1.8.
struct MtpRow {
  R role;
  const char* gguf;
  const char* release;
};

constexpr MtpRow k_mtp_rows[] = {
    {R::MTP_HC_HEAD_BASE, "hc_head_base.weight", "hc_head_base"},
    {R::MTP_HC_HEAD_FN, "hc_head_fn.weight", "hc_head_fn"},
    {R::MTP_HC_HEAD_SCALE, "hc_head_scale.weight", "hc_head_scale"},
    {R::MTP_E_PROJ, "e_proj.weight", "e_proj.weight"},
    {R::MTP_H_PROJ, "h_proj.weight", "h_proj.weight"},
    {R::MTP_ENORM, "enorm.weight", "enorm.weight"},
    {R::MTP_HNORM, "hnorm.weight", "hnorm.weight"},
    {R::MTP_NORM, "norm.weight", "norm.weight"},
};

constexpr const char* k_role_names[] = {
    "TOKEN_EMBD",        "OUTPUT_NORM",   "OUTPUT",        "OUTPUT_HC_FN",    "OUTPUT_HC_BASE",
    "OUTPUT_HC_SCALE",   "HC_ATTN_FN",    "HC_ATTN_SCALE", "HC_ATTN_BASE",    "ATTN_NORM",
    "ATTN_Q_A",          "ATTN_Q_A_NORM", "ATTN_Q_B",      "ATTN_KV",         "ATTN_KV_NORM",
    "ATTN_SINKS",        "ATTN_OUT_A",    "ATTN_OUT_B",    "HC_FFN_FN",       "HC_FFN_SCALE",
    "HC_FFN_BASE",       "FFN_NORM",      "FFN_GATE_INP",  "FFN_EXP_PROBS_B", "FFN_TID2EID",
    "EXPERT_GATE",       "EXPERT_UP",     "EXPERT_DOWN",   "FFN_GATE_SHEXP",  "FFN_UP_SHEXP",
    "FFN_DOWN_SHEXP",    "CMP_APE",       "CMP_KV",        "CMP_GATE",        "CMP_NORM",
    "IDX_Q_B",           "IDX_PROJ",      "IDX_CMP_APE",   "IDX_CMP_KV",      "IDX_CMP_GATE",
    "IDX_CMP_NORM",      "FUSED_GATE_UP", "FUSED_DOWN",    "MTP_E_PROJ",      "MTP_H_PROJ",
    "MTP_ENORM",         "MTP_HNORM",     "MTP_NORM",      "MTP_HC_HEAD_FN",  "MTP_HC_HEAD_BASE",
    "MTP_HC_HEAD_SCALE",
};
static_assert(sizeof(k_role_names) / sizeof(k_role_names[0]) == static_cast<size_t>(HfRole::COUNT));

bool is_trunk(R r) {
  return r == R::TOKEN_EMBD || r == R::OUTPUT_NORM || r == R::OUTPUT || r == R::OUTPUT_HC_FN ||
         r == R::OUTPUT_HC_BASE || r == R::OUTPUT_HC_SCALE;
}
bool is_expert(R r) { return r == R::EXPERT_GATE || r == R::EXPERT_UP || r == R::EXPERT_DOWN; }
bool is_fused(R r) { return r == R::FUSED_GATE_UP || r == R::FUSED_DOWN; }

const BlockRow* block_row(R r) {
  for (const auto& b : k_block_rows)
    if (b.role == r) return &b;
  return nullptr;
}
const TrunkRow* trunk_row(R r) {
  for (const auto& t : k_trunk_rows)
    if (t.role == r) return &t;
  return nullptr;
}
const MtpRow* mtp_row(R r) {
  for (const auto& m : k_mtp_rows)
    if (m.role == r) return &m;
  return nullptr;
}

std::string_view strip_model_prefix(std::string_view s) {
  constexpr std::string_view p = "model.";
  return s.substr(0, p.size()) == p ? s.substr(p.size()) : s;
}

// Decimal index at the start of `s` followed by '.', e.g. "12.attn..." -> 12, rest "attn...".
bool take_index(std::string_view& s, int32_t& out) {
  size_t i = 0;
  int64_t v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i < 9) v = v * 10 + (s[i++] - '0');
  if (i == 0 || i >= s.size() || s[i] != '.') return false;
  if (i > 1 && s[0] == '0') return false;  // no leading zeros: one spelling per index
  out = static_cast<int32_t>(v);
  s.remove_prefix(i + 1);
  return true;
}

bool take_prefix(std::string_view& s, std::string_view p) {
  if (s.substr(0, p.size()) != p) return false;
  s.remove_prefix(p.size());
  return true;
}

// Per-block tail (after "layers.N." or "mtp.N.") in any spelling.
std::optional<HfTensorId> parse_block_tail(std::string_view tail) {
  for (const auto& b : k_block_rows) {
    for (const char* s : {b.release, b.saved, b.module})
      if (s && tail == s) return HfTensorId{b.role, -1, -1, false};
  }
  // fused experts (transformers module names; "ffn." accepted as well)
  for (std::string_view pre : {"mlp.experts.", "ffn.experts."}) {
    std::string_view t = tail;
    if (!take_prefix(t, pre)) continue;
    if (t == "gate_up_proj") return HfTensorId{R::FUSED_GATE_UP, -1, -1, false};
    if (t == "down_proj") return HfTensorId{R::FUSED_DOWN, -1, -1, false};
    int32_t e = -1;
    if (!take_index(t, e)) return std::nullopt;
    if (pre == "ffn.experts.") {  // release: w1 gate, w3 up, w2 down
      if (t == "w1.weight") return HfTensorId{R::EXPERT_GATE, -1, e, false};
      if (t == "w3.weight") return HfTensorId{R::EXPERT_UP, -1, e, false};
      if (t == "w2.weight") return HfTensorId{R::EXPERT_DOWN, -1, e, false};
    } else {  // per-expert module naming used by older transformers MoE models
      if (t == "gate_proj.weight") return HfTensorId{R::EXPERT_GATE, -1, e, false};
      if (t == "up_proj.weight") return HfTensorId{R::EXPERT_UP, -1, e, false};
      if (t == "down_proj.weight") return HfTensorId{R::EXPERT_DOWN, -1, e, false};
    }
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

const char* hf_role_name(HfRole r) { return k_role_names[static_cast<size_t>(r)]; }

std::string hf_id_string(const HfTensorId& id) {
  std::string s;
  if (id.mtp)
    s = "mtp " + std::to_string(id.layer) + " ";
  else if (id.layer >= 0)
    s = "layer " + std::to_string(id.layer) + " ";
  if (id.expert >= 0) s += "expert " + std::to_string(id.expert) + " ";
  return s + hf_role_name(id.role);
}

std::optional<HfTensorId> hf_parse_tensor_name(std::string_view name) {
  std::string_view s = strip_model_prefix(name);
  if (take_prefix(s, "mtp.")) {
    int32_t n = -1;
    if (!take_index(s, n)) return std::nullopt;
    for (const auto& m : k_mtp_rows)
      if (s == m.release) return HfTensorId{m.role, n, -1, true};
    auto id = parse_block_tail(s);
    if (!id) return std::nullopt;
    id->layer = n;
    id->mtp = true;
    return id;
  }
  for (const auto& t : k_trunk_rows) {
    for (const char* sp : {t.release, t.saved, t.module})
      if (s == strip_model_prefix(sp)) return HfTensorId{t.role, -1, -1, false};
  }
  if (!take_prefix(s, "layers.")) return std::nullopt;
  int32_t layer = -1;
  if (!take_index(s, layer)) return std::nullopt;
  auto id = parse_block_tail(s);
  if (!id) return std::nullopt;
  id->layer = layer;
  return id;
}

std::optional<std::string> hf_tensor_name(const HfTensorId& id, HfSpelling spelling) {
  if (const TrunkRow* t = trunk_row(id.role)) {
    switch (spelling) {
      case HfSpelling::RELEASE: return std::string(t->release);
      case HfSpelling::TRANSFORMERS_SAVED: return std::string(t->saved);
      case HfSpelling::TRANSFORMERS_MODULE: return std::string(t->module);
    }
    DSV4_UNREACHABLE();
  }
  if (id.mtp && spelling != HfSpelling::RELEASE) return std::nullopt;  // transformers has no MTP module
  if (id.layer < 0) return std::nullopt;
  const std::string prefix =
      id.mtp ? "mtp." + std::to_string(id.layer) + "." : "layers." + std::to_string(id.layer) + ".";
  const std::string model = spelling == HfSpelling::RELEASE ? "" : "model.";
  if (const MtpRow* m = mtp_row(id.role))
    return id.mtp ? std::optional<std::string>(prefix + m->release) : std::nullopt;
  if (is_expert(id.role)) {
    if (spelling == HfSpelling::TRANSFORMERS_MODULE || id.expert < 0) return std::nullopt;
    const char* w = id.role == R::EXPERT_GATE ? "w1" : id.role == R::EXPERT_UP ? "w3" : "w2";
    return model + prefix + "ffn.experts." + std::to_string(id.expert) + "." + w + ".weight";
  }
  if (is_fused(id.role)) {
    if (spelling != HfSpelling::TRANSFORMERS_MODULE) return std::nullopt;
    return model + prefix + (id.role == R::FUSED_GATE_UP ? "mlp.experts.gate_up_proj" : "mlp.experts.down_proj");
  }
  const BlockRow* b = block_row(id.role);
  DSV4_ASSERT(b != nullptr, "role %s has no block row", hf_role_name(id.role));
  switch (spelling) {
    case HfSpelling::RELEASE: return prefix + b->release;
    case HfSpelling::TRANSFORMERS_SAVED: return model + prefix + (b->saved ? b->saved : b->release);
    case HfSpelling::TRANSFORMERS_MODULE: return model + prefix + b->module;
  }
  DSV4_UNREACHABLE();
}

std::string hf_gguf_name(const HfTensorId& id) {
  if (const TrunkRow* t = trunk_row(id.role)) return t->gguf;
  if (is_fused(id.role) || id.layer < 0) return "";
  const std::string prefix = id.mtp ? "mtp." + std::to_string(id.layer) + "." : "blk." + std::to_string(id.layer) + ".";
  if (const MtpRow* m = mtp_row(id.role)) return id.mtp ? prefix + m->gguf : "";
  const BlockRow* b = block_row(id.role);
  DSV4_ASSERT(b != nullptr, "role %s has no block row", hf_role_name(id.role));
  return prefix + b->gguf;
}

std::vector<uint64_t> hf_logical_shape(const HfConfig& c, const HfTensorId& id) {
  const uint64_t D = c.hidden_size, V = c.vocab_size, n = c.hc_mult, mix = (2 + n) * n;
  const uint64_t H = c.num_attention_heads, hd = c.head_dim, rq = c.q_lora_rank, G = c.o_groups, ro = c.o_lora_rank;
  const uint64_t E = c.n_routed_experts, F = c.moe_intermediate_size, Fs = F * c.n_shared_experts;
  const uint64_t HI = c.index_n_heads, dI = c.index_head_dim;
  uint64_t ratio = 0;
  if (id.layer >= 0 && !is_trunk(id.role))
    ratio = id.mtp ? c.mtp_compress_ratio
                   : (static_cast<size_t>(id.layer) < c.compress_ratios.size() ? c.compress_ratios[id.layer] : 0);
  const uint64_t cm = ratio == 4 ? 2 : 1;
  switch (id.role) {
    case R::TOKEN_EMBD:
    case R::OUTPUT: return {V, D};
    case R::OUTPUT_NORM:
    case R::ATTN_NORM:
    case R::FFN_NORM:
    case R::MTP_ENORM:
    case R::MTP_HNORM:
    case R::MTP_NORM: return {D};
    case R::OUTPUT_HC_FN:
    case R::MTP_HC_HEAD_FN: return {n, n * D};
    case R::OUTPUT_HC_BASE:
    case R::MTP_HC_HEAD_BASE: return {n};
    case R::OUTPUT_HC_SCALE:
    case R::MTP_HC_HEAD_SCALE: return {1};
    case R::HC_ATTN_FN:
    case R::HC_FFN_FN: return {mix, n * D};
    case R::HC_ATTN_BASE:
    case R::HC_FFN_BASE: return {mix};
    case R::HC_ATTN_SCALE:
    case R::HC_FFN_SCALE: return {3};
    case R::ATTN_Q_A: return {rq, D};
    case R::ATTN_Q_A_NORM: return {rq};
    case R::ATTN_Q_B: return {H * hd, rq};
    case R::ATTN_KV: return {hd, D};
    case R::ATTN_KV_NORM:
    case R::CMP_NORM: return {hd};
    case R::ATTN_SINKS: return {H};
    case R::ATTN_OUT_A: return {G * ro, H * hd / G};
    case R::ATTN_OUT_B: return {D, G * ro};
    case R::FFN_GATE_INP: return {E, D};
    case R::FFN_EXP_PROBS_B: return {E};
    case R::FFN_TID2EID: return {V, c.num_experts_per_tok};
    case R::EXPERT_GATE:
    case R::EXPERT_UP: return {F, D};
    case R::EXPERT_DOWN: return {D, F};
    case R::FUSED_GATE_UP: return {E, 2 * F, D};
    case R::FUSED_DOWN: return {E, D, F};
    case R::FFN_GATE_SHEXP:
    case R::FFN_UP_SHEXP: return {Fs, D};
    case R::FFN_DOWN_SHEXP: return {D, Fs};
    case R::CMP_APE: return {ratio, cm * hd};
    case R::CMP_KV:
    case R::CMP_GATE: return {cm * hd, D};
    case R::IDX_Q_B: return {HI * dI, rq};
    case R::IDX_PROJ: return {HI, D};
    case R::IDX_CMP_APE: return {4, 2 * dI};
    case R::IDX_CMP_KV:
    case R::IDX_CMP_GATE: return {2 * dI, D};
    case R::IDX_CMP_NORM: return {dI};
    case R::MTP_E_PROJ:
    case R::MTP_H_PROJ: return {D, D};
    case R::COUNT: break;
  }
  DSV4_UNREACHABLE();
}

namespace {

// Whether a (non-expert, non-fused) block role exists in a block with this schedule.
bool block_has(R role, uint32_t ratio, bool hash, bool mtp) {
  switch (role) {
    case R::FFN_EXP_PROBS_B: return mtp || !hash;
    case R::FFN_TID2EID: return hash && !mtp;
    case R::CMP_APE:
    case R::CMP_KV:
    case R::CMP_GATE:
    case R::CMP_NORM: return ratio != 0;
    case R::IDX_Q_B:
    case R::IDX_PROJ:
    case R::IDX_CMP_APE:
    case R::IDX_CMP_KV:
    case R::IDX_CMP_GATE:
    case R::IDX_CMP_NORM: return ratio == 4;
    case R::HC_ATTN_FN:
    case R::HC_ATTN_SCALE:
    case R::HC_ATTN_BASE:
    case R::ATTN_NORM:
    case R::ATTN_Q_A:
    case R::ATTN_Q_A_NORM:
    case R::ATTN_Q_B:
    case R::ATTN_KV:
    case R::ATTN_KV_NORM:
    case R::ATTN_SINKS:
    case R::ATTN_OUT_A:
    case R::ATTN_OUT_B:
    case R::HC_FFN_FN:
    case R::HC_FFN_SCALE:
    case R::HC_FFN_BASE:
    case R::FFN_NORM:
    case R::FFN_GATE_INP:
    case R::EXPERT_GATE:
    case R::EXPERT_UP:
    case R::EXPERT_DOWN:
    case R::FFN_GATE_SHEXP:
    case R::FFN_UP_SHEXP:
    case R::FFN_DOWN_SHEXP: return true;
    case R::TOKEN_EMBD:
    case R::OUTPUT_NORM:
    case R::OUTPUT:
    case R::OUTPUT_HC_FN:
    case R::OUTPUT_HC_BASE:
    case R::OUTPUT_HC_SCALE:
    case R::FUSED_GATE_UP:
    case R::FUSED_DOWN:
    case R::MTP_E_PROJ:
    case R::MTP_H_PROJ:
    case R::MTP_ENORM:
    case R::MTP_HNORM:
    case R::MTP_NORM:
    case R::MTP_HC_HEAD_FN:
    case R::MTP_HC_HEAD_BASE:
    case R::MTP_HC_HEAD_SCALE:
    case R::COUNT: return false;
  }
  return false;
}

// The blocks of a conversion: (index, mtp) pairs.
std::vector<std::pair<int32_t, bool>> blocks_of(const HfConfig& c, bool include_mtp) {
  std::vector<std::pair<int32_t, bool>> out;
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) out.emplace_back(static_cast<int32_t>(l), false);
  if (include_mtp)
    for (uint32_t m = 0; m < c.num_nextn_predict_layers; ++m) out.emplace_back(static_cast<int32_t>(m), true);
  return out;
}

}  // namespace

std::vector<HfTensorId> hf_expected_tensors(const HfConfig& c, HfSpelling spelling, bool include_mtp) {
  std::vector<HfTensorId> out;
  for (const auto& t : k_trunk_rows) out.push_back({t.role, -1, -1, false});
  const bool fused = spelling == HfSpelling::TRANSFORMERS_MODULE;
  for (auto [idx, mtp] : blocks_of(c, include_mtp && spelling == HfSpelling::RELEASE)) {
    if (mtp)
      for (const auto& m : k_mtp_rows) out.push_back({m.role, idx, -1, true});
    const uint32_t ratio = mtp ? c.mtp_compress_ratio : c.compress_ratios[idx];
    const bool hash = !mtp && c.is_hash_layer(static_cast<uint32_t>(idx));
    for (const auto& b : k_block_rows) {
      if (!block_has(b.role, ratio, hash, mtp)) continue;
      if (is_expert(b.role)) {
        if (fused) {
          if (b.role == R::EXPERT_GATE) out.push_back({R::FUSED_GATE_UP, idx, -1, mtp});
          if (b.role == R::EXPERT_DOWN) out.push_back({R::FUSED_DOWN, idx, -1, mtp});
          continue;
        }
        for (uint32_t e = 0; e < c.n_routed_experts; ++e) out.push_back({b.role, idx, static_cast<int32_t>(e), mtp});
        continue;
      }
      out.push_back({b.role, idx, -1, mtp});
    }
  }
  return out;
}

// ---- conversion plan ----------------------------------------------------------------------------

uint64_t GgufTensorPlan::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  return n;
}

std::vector<HfTensorDesc> hf_describe(const HfCheckpoint& ck) {
  std::vector<HfTensorDesc> out;
  for (const StTensor* t : ck.tensors()) out.push_back({t->name, t->dtype, t->shape});
  return out;
}

namespace {

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool is_plain_float(StDtype d) {
  return d == StDtype::F32 || d == StDtype::F16 || d == StDtype::BF16 || d == StDtype::F64;
}

// Companion scale of a quantised weight: "<base>.scale" (DeepSeek) or "<base>.weight_scale_inv"
// (transformers' FP8 naming), where <base> is the name without its ".weight".
std::vector<std::string> scale_names(const std::string& weight) {
  constexpr std::string_view w = ".weight";
  if (weight.size() <= w.size() || weight.compare(weight.size() - w.size(), w.size(), w) != 0) return {};
  std::string base = weight.substr(0, weight.size() - w.size());
  return {base + ".scale", base + ".weight_scale_inv"};
}

class Planner {
 public:
  Planner(const HfConfig& c, const std::vector<HfTensorDesc>& tensors, const HfPlanOptions& o) : c_(c), opt_(o) {
    for (const auto& t : tensors) by_name_.emplace(t.name, &t);
  }

  expected<HfConversionPlan> run() {
    index();
    if (problems_.empty()) {
      for (const auto& t : k_trunk_rows) plan_single({t.role, -1, -1, false});
      for (auto [idx, mtp] : blocks_of(c_, opt_.include_mtp)) plan_block(idx, mtp);
      check_unused();
    }
    if (!problems_.empty()) {
      std::string msg = std::to_string(problems_.size()) + " problem(s) mapping the checkpoint to GGUF tensors:";
      size_t shown = 0;
      for (const auto& p : problems_) {
        if (++shown > 25) {
          msg += "\n  ... and " + std::to_string(problems_.size() - 25) + " more";
          break;
        }
        msg += "\n  " + p;
      }
      return make_error("%s", msg.c_str());
    }
    return std::move(plan_);
  }

 private:
  struct Key {
    int role, layer, expert, mtp;
    auto operator<=>(const Key&) const = default;
  };
  static Key key(const HfTensorId& id) { return {static_cast<int>(id.role), id.layer, id.expert, id.mtp ? 1 : 0}; }

  void index() {
    for (const auto& [name, desc] : by_name_) {
      if (!opt_.include_mtp && name.rfind("mtp.", 0) == 0) {  // MTP module (and its scales) not requested
        plan_.ignored.push_back(name);
        continue;
      }
      auto id = hf_parse_tensor_name(name);
      if (id) {
        auto [it, fresh] = ids_.emplace(key(*id), name);
        if (!fresh) problems_.push_back("'" + it->second + "' and '" + name + "' both name " + hf_id_string(*id));
        continue;
      }
      bool is_scale = false;
      for (std::string_view suffix : {".scale", ".weight_scale_inv"}) {
        if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
          std::string weight = name.substr(0, name.size() - suffix.size()) + ".weight";
          if (by_name_.count(weight)) is_scale = true;
        }
      }
      if (is_scale) {
        scales_.insert(name);
        continue;
      }
      problems_.push_back("unrecognised tensor '" + name + "'");
    }
  }

  const HfTensorDesc* lookup(const HfTensorId& id) {
    auto it = ids_.find(key(id));
    if (it == ids_.end()) return nullptr;
    used_.insert(it->first);
    return by_name_.at(it->second);
  }

  // Builds a piece for rows [first_row, first_row + n_rows) of `d`, whose logical shape must be
  // `logical`. Returns false (and records a problem) on a storage/shape mismatch.
  bool make_piece(const HfTensorDesc& d, const std::vector<uint64_t>& logical, uint64_t first_row, uint64_t n_rows,
                  bool integer, HfPiece& out) {
    out = HfPiece{};
    out.source = d.name;
    out.first_row = first_row;
    out.n_rows = n_rows;
    out.row_length = logical.empty() ? 1 : logical.back();
    auto mismatch = [&](const std::string& why) {
      problems_.push_back("'" + d.name + "' " + st_dtype_name(d.dtype) + " " + shape_str(d.shape) + ": " + why +
                          " (expected logical shape " + shape_str(logical) + ")");
      return false;
    };
    if (integer) {
      if (!st_dtype_is_integer(d.dtype)) return mismatch("an integer table is required");
      if (d.shape != logical) return mismatch("shape mismatch");
      return true;
    }
    if (is_plain_float(d.dtype)) {
      if (d.shape != logical) return mismatch("shape mismatch");
      return true;
    }
    const bool fp8 = d.dtype == StDtype::F8_E4M3;
    const bool fp4 = d.dtype == StDtype::I8 || d.dtype == StDtype::U8;
    if (!fp8 && !fp4) return mismatch("unsupported dtype for a weight");
    if (logical.size() != 2) return mismatch("quantised storage is only supported for 2-D weights");
    const HfTensorDesc* scale = nullptr;
    for (const auto& s : scale_names(d.name)) {
      auto it = by_name_.find(s);
      if (it != by_name_.end()) {
        scale = it->second;
        used_scales_.insert(s);
        break;
      }
    }
    if (!scale)
      return mismatch(fp8 ? "FP8 weight without a .scale tensor" : "packed FP4 weight without a .scale tensor");
    StTensor w, s;
    w.name = d.name;
    w.dtype = d.dtype;
    w.shape = d.shape;
    s.name = scale->name;
    s.dtype = scale->dtype;
    s.shape = scale->shape;
    auto fmt = fp8 ? StScaledFormat::FP8_BLOCK : StScaledFormat::FP4_PACKED;
    auto rc = st_scaled_logical_shape(w, s, fmt);
    if (!rc) return mismatch(rc.error().message);
    if (rc->first != logical[0] || rc->second != logical[1]) return mismatch("logical shape mismatch");
    out.scale = scale->name;
    out.storage = fp8 ? HfStorage::FP8_BLOCK : HfStorage::FP4_PACKED;
    return true;
  }

  static std::vector<uint64_t> gguf_ne(std::vector<uint64_t> logical) {
    std::reverse(logical.begin(), logical.end());
    if (logical.empty()) logical.push_back(1);
    return logical;
  }

  void plan_single(const HfTensorId& id) {
    const HfTensorDesc* d = lookup(id);
    const std::string gguf = hf_gguf_name(id);
    if (!d) {
      std::string want = hf_tensor_name(id, HfSpelling::RELEASE).value_or("?");
      problems_.push_back("missing " + hf_id_string(id) + " (e.g. '" + want + "') for GGUF '" + gguf + "'");
      return;
    }
    const auto logical = hf_logical_shape(c_, id);
    const bool integer = id.role == R::FFN_TID2EID;
    GgufTensorPlan p;
    p.name = gguf;
    p.ne = gguf_ne(logical);
    p.element = integer ? GgufElement::INT32 : GgufElement::FLOAT;
    p.id = id;
    uint64_t rows = 1;
    for (size_t i = 0; i + 1 < logical.size(); ++i) rows *= logical[i];
    HfPiece piece;
    if (!make_piece(*d, logical, 0, rows, integer, piece)) return;
    p.pieces.push_back(std::move(piece));
    plan_.tensors.push_back(std::move(p));
  }

  // Stacked expert tensor `role` (EXPERT_GATE / _UP / _DOWN) of one block.
  void plan_experts(R role, int32_t idx, bool mtp) {
    const uint64_t E = c_.n_routed_experts, F = c_.moe_intermediate_size;
    const HfTensorId stacked{role, idx, -1, mtp};
    GgufTensorPlan p;
    p.name = hf_gguf_name(stacked);
    p.id = stacked;
    const auto per_expert = hf_logical_shape(c_, {role, idx, 0, mtp});  // [F, D] or [D, F]
    p.ne = {per_expert[1], per_expert[0], E};
    const HfTensorId fused_id{role == R::EXPERT_DOWN ? R::FUSED_DOWN : R::FUSED_GATE_UP, idx, -1, mtp};
    const bool have_fused = ids_.count(key(fused_id)) != 0;
    size_t n_per_expert = 0;
    for (uint64_t e = 0; e < E; ++e) n_per_expert += ids_.count(key({role, idx, static_cast<int32_t>(e), mtp}));
    if (have_fused && n_per_expert) {
      problems_.push_back("block " + hf_id_string(stacked) + ": both fused and per-expert tensors are present");
      return;
    }
    if (have_fused) {
      const HfTensorDesc* d = lookup(fused_id);
      const auto logical = hf_logical_shape(c_, fused_id);  // [E, 2F, D] or [E, D, F]
      if (role == R::EXPERT_DOWN) {
        HfPiece piece;
        if (!make_piece(*d, logical, 0, E * logical[1], false, piece)) return;
        p.pieces.push_back(std::move(piece));
      } else {
        const uint64_t half = role == R::EXPERT_GATE ? 0 : F;  // gate rows first, then up
        for (uint64_t e = 0; e < E; ++e) {
          HfPiece piece;
          if (!make_piece(*d, logical, e * 2 * F + half, F, false, piece)) return;
          p.pieces.push_back(std::move(piece));
        }
      }
      plan_.tensors.push_back(std::move(p));
      return;
    }
    for (uint64_t e = 0; e < E; ++e) {
      const HfTensorId id{role, idx, static_cast<int32_t>(e), mtp};
      const HfTensorDesc* d = lookup(id);
      if (!d) {
        problems_.push_back("missing " + hf_id_string(id) + " (e.g. '" +
                            hf_tensor_name(id, HfSpelling::RELEASE).value_or("?") + "')");
        return;
      }
      HfPiece piece;
      if (!make_piece(*d, per_expert, 0, per_expert[0], false, piece)) return;
      p.pieces.push_back(std::move(piece));
    }
    plan_.tensors.push_back(std::move(p));
  }

  void plan_block(int32_t idx, bool mtp) {
    if (mtp)
      for (const auto& m : k_mtp_rows) plan_single({m.role, idx, -1, true});
    const uint32_t ratio = mtp ? c_.mtp_compress_ratio : c_.compress_ratios[idx];
    const bool hash = !mtp && c_.is_hash_layer(static_cast<uint32_t>(idx));
    for (const auto& b : k_block_rows) {
      if (!block_has(b.role, ratio, hash, mtp)) continue;
      if (is_expert(b.role))
        plan_experts(b.role, idx, mtp);
      else
        plan_single({b.role, idx, -1, mtp});
    }
  }

  void check_unused() {
    for (const auto& [k, name] : ids_) {
      if (used_.count(k)) continue;
      HfTensorId id{static_cast<R>(k.role), k.layer, k.expert, k.mtp != 0};
      std::string why;
      if (!id.mtp && id.layer >= static_cast<int32_t>(c_.num_hidden_layers))
        why = "the config has fewer layers";
      else if (id.role == R::FFN_TID2EID)
        why = "the layer is not hash-routed";
      else if (id.role == R::FFN_EXP_PROBS_B)
        why = "hash-routed layers have no selection bias";
      else if (id.expert >= static_cast<int32_t>(c_.n_routed_experts))
        why = "expert index beyond n_routed_experts";
      else
        why = "this config's layer schedule has no such tensor";
      problems_.push_back("tensor '" + name + "' (" + hf_id_string(id) + ") is not used: " + why);
    }
    for (const auto& s : scales_)
      if (!used_scales_.count(s)) problems_.push_back("scale tensor '" + s + "' belongs to no quantised weight");
  }

  const HfConfig& c_;
  HfPlanOptions opt_;
  std::map<std::string, const HfTensorDesc*> by_name_;
  std::map<Key, std::string> ids_;
  std::set<Key> used_;
  std::set<std::string> scales_, used_scales_;
  std::vector<std::string> problems_;
  HfConversionPlan plan_;
};

}  // namespace

expected<HfConversionPlan> hf_plan_conversion(const HfConfig& c, const std::vector<HfTensorDesc>& tensors,
                                              const HfPlanOptions& options) {
  DSV4_TRY(hf_config_validate(c));
  Planner p(c, tensors, options);
  return p.run();
}

namespace {

template <class T, class ReadPlain, class ReadScaled>
Status read_planned(const HfCheckpoint& ck, const GgufTensorPlan& plan, T* out, ReadPlain plain, ReadScaled scaled) {
  uint64_t off = 0;
  const uint64_t total = plan.n_elements();
  for (const HfPiece& piece : plan.pieces) {
    const StTensor* t = ck.find(piece.source);
    if (!t) return make_error("GGUF '%s': checkpoint tensor '%s' not found", plan.name.c_str(), piece.source.c_str());
    const uint64_t n = piece.n_rows * piece.row_length;
    if (n > total - off)
      return make_error("GGUF '%s': pieces exceed %llu elements", plan.name.c_str(), (unsigned long long)total);
    switch (piece.storage) {
      case HfStorage::PLAIN:
        if (t->row_length() != piece.row_length)
          return make_error("GGUF '%s': '%s' rows are %llu long, the plan expects %llu", plan.name.c_str(),
                            t->name.c_str(), (unsigned long long)t->row_length(), (unsigned long long)piece.row_length);
        DSV4_TRY(plain(*t, piece.first_row, piece.n_rows, out + off));
        break;
      case HfStorage::FP8_BLOCK:
      case HfStorage::FP4_PACKED: {
        const StTensor* s = ck.find(piece.scale);
        if (!s) return make_error("GGUF '%s': scale tensor '%s' not found", plan.name.c_str(), piece.scale.c_str());
        auto fmt = piece.storage == HfStorage::FP8_BLOCK ? StScaledFormat::FP8_BLOCK : StScaledFormat::FP4_PACKED;
        DSV4_TRY(scaled(*t, *s, fmt, piece.first_row, piece.n_rows, out + off));
        break;
      }
    }
    off += n;
  }
  if (off != total)
    return make_error("GGUF '%s': pieces cover %llu of %llu elements", plan.name.c_str(), (unsigned long long)off,
                      (unsigned long long)total);
  return {};
}

}  // namespace

Status hf_read_planned_f32(const HfCheckpoint& ck, const GgufTensorPlan& plan, float* out) {
  if (plan.element != GgufElement::FLOAT) return make_error("GGUF '%s' is an integer table", plan.name.c_str());
  return read_planned(ck, plan, out, st_read_rows_f32, st_read_rows_f32_scaled);
}

Status hf_read_planned_i32(const HfCheckpoint& ck, const GgufTensorPlan& plan, int32_t* out) {
  if (plan.element != GgufElement::INT32) return make_error("GGUF '%s' is not an integer table", plan.name.c_str());
  auto no_scaled = [&](const StTensor& t, const StTensor&, StScaledFormat, uint64_t, uint64_t, int32_t*) -> Status {
    return make_error("integer tensor '%s' cannot be block-scaled", t.name.c_str());
  };
  return read_planned(ck, plan, out, st_read_rows_i32, no_scaled);
}

}  // namespace dsv4
