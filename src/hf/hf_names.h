// Checkpoint tensor names -> GGUF tensors (formats.md §1.6 / §1.8 / §7).
//
// A DeepSeek V4 tensor has one identity (HfTensorId: role, layer, expert, MTP or not) and
// several spellings, all accepted by hf_parse_tensor_name, with or without a leading "model.":
//  * RELEASE — DeepSeek's checkpoint: "embed.weight", "head.weight", "norm.weight",
//    "hc_head_{fn,base,scale}", "layers.N.attn.wq_a.weight", "layers.N.attn.kv_norm.weight",
//    "layers.N.ffn.experts.E.w1.weight" (w1 gate, w3 up, w2 down), "mtp.0.e_proj.weight", ...
//    FP8 weights carry "<base>.scale" (F8_E8M0), FP4 experts are I8 [out, in/2] + "<base>.scale".
//  * TRANSFORMERS_SAVED — what transformers 5.17 `save_pretrained` writes for
//    DeepseekV4ForCausalLM (verified by tools/golden/make_golden.py): the release names under
//    "model." for the layers, the trunk in transformers' spelling ("model.embed_tokens.weight",
//    "model.norm.weight", "model.hc_head.hc_fn", but "head.weight"), and the attention's kv_norm
//    as "model.layers.N.attn.norm.weight" (its reverse renaming maps ".kv_norm." to ".norm.").
//  * TRANSFORMERS_MODULE — transformers' module names ("model.layers.N.self_attn.q_a_proj.weight",
//    "...mlp.gate.e_score_correction_bias", fused experts "...mlp.experts.gate_up_proj"
//    [E, 2F, D] (gate rows first) and "...mlp.experts.down_proj" [E, D, F]), as written with
//    save_pretrained(save_original_format=False).
//
// GGUF layout: a PyTorch tensor [out, in] is GGUF ne = [in, out] with the same bytes (no
// transpose); routed experts are stacked: ne = [in, out, E], expert e's rows after expert e-1's.
// A planned GGUF tensor is therefore the concatenation of row ranges ("pieces") of checkpoint
// tensors, each viewed as [rows, row_length] with row_length = GGUF ne0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "hf/hf_config.h"
#include "hf/safetensors.h"

namespace dsv4 {

enum class HfRole : uint8_t {
  // trunk
  TOKEN_EMBD,
  OUTPUT_NORM,
  OUTPUT,
  OUTPUT_HC_FN,
  OUTPUT_HC_BASE,
  OUTPUT_HC_SCALE,
  // per block (main layers and the MTP block)
  HC_ATTN_FN,
  HC_ATTN_SCALE,
  HC_ATTN_BASE,
  ATTN_NORM,
  ATTN_Q_A,
  ATTN_Q_A_NORM,
  ATTN_Q_B,
  ATTN_KV,
  ATTN_KV_NORM,
  ATTN_SINKS,
  ATTN_OUT_A,
  ATTN_OUT_B,
  HC_FFN_FN,
  HC_FFN_SCALE,
  HC_FFN_BASE,
  FFN_NORM,
  FFN_GATE_INP,
  FFN_EXP_PROBS_B,
  FFN_TID2EID,
  EXPERT_GATE,
  EXPERT_UP,
  EXPERT_DOWN,
  FFN_GATE_SHEXP,
  FFN_UP_SHEXP,
  FFN_DOWN_SHEXP,
  CMP_APE,
  CMP_KV,
  CMP_GATE,
  CMP_NORM,
  IDX_Q_B,
  IDX_PROJ,
  IDX_CMP_APE,
  IDX_CMP_KV,
  IDX_CMP_GATE,
  IDX_CMP_NORM,
  // transformers' fused routed experts (one tensor for all experts of a layer)
  FUSED_GATE_UP,
  FUSED_DOWN,
  // MTP head (mtp.N.)
  MTP_E_PROJ,
  MTP_H_PROJ,
  MTP_ENORM,
  MTP_HNORM,
  MTP_NORM,
  MTP_HC_HEAD_FN,
  MTP_HC_HEAD_BASE,
  MTP_HC_HEAD_SCALE,
  COUNT
};

const char* hf_role_name(HfRole r);

struct HfTensorId {
  HfRole role = HfRole::TOKEN_EMBD;
  int32_t layer = -1;   // block index; for MTP tensors the MTP module index; -1 for the trunk
  int32_t expert = -1;  // EXPERT_* roles: the expert (-1 in a plan = all experts, stacked)
  bool mtp = false;     // a tensor of MTP module `layer`
  bool operator==(const HfTensorId&) const = default;
};

std::string hf_id_string(const HfTensorId& id);  // "layer 3 ATTN_Q_A", "mtp 0 expert 5 EXPERT_GATE"

enum class HfSpelling { RELEASE, TRANSFORMERS_SAVED, TRANSFORMERS_MODULE };

// nullopt for names that are not model tensors (scale companions, unknown names).
std::optional<HfTensorId> hf_parse_tensor_name(std::string_view name);
// The tensor's name in a spelling; nullopt where that spelling has no such tensor (per-expert
// tensors in TRANSFORMERS_MODULE, fused ones elsewhere, MTP in the transformers spellings).
std::optional<std::string> hf_tensor_name(const HfTensorId& id, HfSpelling spelling);
// GGUF name; EXPERT_* ids (any expert) name the stacked tensor. FUSED_* have none ("").
std::string hf_gguf_name(const HfTensorId& id);
// PyTorch-order logical shape of the tensor under config `c` (per-expert shapes for EXPERT_*).
std::vector<uint64_t> hf_logical_shape(const HfConfig& c, const HfTensorId& id);
// Every tensor a checkpoint of config `c` holds in `spelling` (per-expert tensors for RELEASE and
// TRANSFORMERS_SAVED, fused ones for TRANSFORMERS_MODULE; MTP only for RELEASE with include_mtp).
std::vector<HfTensorId> hf_expected_tensors(const HfConfig& c, HfSpelling spelling, bool include_mtp);

// ---- conversion plan ----------------------------------------------------------------------------

struct HfTensorDesc {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<uint64_t> shape;
};
std::vector<HfTensorDesc> hf_describe(const HfCheckpoint& ck);

enum class HfStorage {
  PLAIN,       // F32/F16/BF16/F64 (or an integer table), logical shape as stored
  FP8_BLOCK,   // F8_E4M3 + 128x128 block scales (StScaledFormat::FP8_BLOCK)
  FP4_PACKED,  // I8/U8 [rows, cols/2] + per-32 scales (StScaledFormat::FP4_PACKED)
};

struct HfPiece {
  std::string source;  // checkpoint tensor name
  std::string scale;   // its scale tensor ("" for PLAIN)
  HfStorage storage = HfStorage::PLAIN;
  uint64_t first_row = 0;  // rows of the source's logical [rows, row_length] view
  uint64_t n_rows = 0;
  uint64_t row_length = 0;  // = GGUF ne0
};

enum class GgufElement { FLOAT, INT32 };

struct GgufTensorPlan {
  std::string name;          // GGUF tensor name
  std::vector<uint64_t> ne;  // GGUF dims, ne[0] fastest
  GgufElement element = GgufElement::FLOAT;
  HfTensorId id;                // EXPERT_* with expert = -1 for the stacked expert tensors
  std::vector<HfPiece> pieces;  // concatenated in order: the tensor's rows in GGUF order
  uint64_t n_elements() const;
};

struct HfConversionPlan {
  std::vector<GgufTensorPlan> tensors;  // trunk, then blk.0..L-1 (then mtp.N) in formats.md order
  std::vector<std::string> ignored;     // mtp.* tensors when the MTP block was not requested
};

struct HfPlanOptions {
  bool include_mtp = false;  // also plan the MTP module (mtp.0.*; RELEASE checkpoints only)
};

// Resolves every GGUF tensor of config `c` against the checkpoint's tensors: names in any
// spelling, per-expert or fused experts, plain/FP8/FP4 storage with shapes checked against the
// config. Errors list unknown tensors, missing tensors, shape/dtype mismatches, ambiguous
// duplicates (the same tensor under two spellings) and tensors this config does not use.
expected<HfConversionPlan> hf_plan_conversion(const HfConfig& c, const std::vector<HfTensorDesc>& tensors,
                                              const HfPlanOptions& options = {});

// Reads one planned tensor from `ck` in GGUF element order (n_elements values).
Status hf_read_planned_f32(const HfCheckpoint& ck, const GgufTensorPlan& plan, float* out);
Status hf_read_planned_i32(const HfCheckpoint& ck, const GgufTensorPlan& plan, int32_t* out);

}  // namespace dsv4
