// The declarative tensor table: every tensor of a DeepSeek V4 GGUF (main model
// and the optional MTP block), its name, its shape as a function of the
// ModelSpec, and the types it may have (formats.md §1.6–§1.9). Loading,
// validation, synth, convert, CUDA upload and inspect all walk this one table.
//
// Dims are in GGUF order: ne[0] is the row length (the PyTorch last dim), so an
// HF weight [out, in] is ne = [in, out] and a stacked expert tensor
// [in, out, n_expert].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "model/model_spec.h"

namespace dsv4 {

// Which types a tensor may have. Published types: see recipe_type().
enum class TypeClass {
  F32_VEC,         // 1-D norms, biases, sinks, mHC base/scale: F32 only
  I32_TABLE,       // hash-routing table: I32 only
  F16_MAT,         // published F16 (embedding, router, mHC fn, compressor, indexer): F16 | F32
  DENSE_MAT,       // published Q8_0 (attention projections, shared expert, output head): Q8_0 | F16 | F32
  EXPERT_GATE_UP,  // routed gate/up: IQ2_XXS | Q2_K | Q4_K | Q8_0 | F16 | F32 (gate and up identical)
  EXPERT_DOWN,     // routed down: Q2_K | Q4_K | Q8_0 | F16 | F32
};

bool type_allowed(TypeClass c, GgmlType t);
std::string allowed_types(TypeClass c);  // "Q8_0, F16, F32"

enum class GlobalTensor { TOKEN_EMBD, OUTPUT_HC_BASE, OUTPUT_HC_FN, OUTPUT_HC_SCALE, OUTPUT_NORM, OUTPUT, COUNT };

// Per-layer tensors; the MTP block uses the same slots (minus compressor,
// indexer and hash table) plus its MtpTensor head tensors.
enum class LayerTensor {
  HC_ATTN_FN,
  HC_ATTN_SCALE,
  HC_ATTN_BASE,
  ATTN_NORM,
  ATTN_Q_A,
  ATTN_Q_A_NORM,
  ATTN_Q_B,
  ATTN_KV,
  ATTN_KV_A_NORM,
  ATTN_SINKS,
  ATTN_OUTPUT_A,
  ATTN_OUTPUT_B,
  HC_FFN_FN,
  HC_FFN_SCALE,
  HC_FFN_BASE,
  FFN_NORM,
  FFN_GATE_INP,
  EXP_PROBS_B,
  FFN_GATE_TID2EID,
  FFN_GATE_EXPS,
  FFN_UP_EXPS,
  FFN_DOWN_EXPS,
  FFN_GATE_SHEXP,
  FFN_UP_SHEXP,
  FFN_DOWN_SHEXP,
  ATTN_COMPRESSOR_APE,
  ATTN_COMPRESSOR_KV,
  ATTN_COMPRESSOR_GATE,
  ATTN_COMPRESSOR_NORM,
  INDEXER_ATTN_Q_B,
  INDEXER_PROJ,
  INDEXER_COMPRESSOR_APE,
  INDEXER_COMPRESSOR_KV,
  INDEXER_COMPRESSOR_GATE,
  INDEXER_COMPRESSOR_NORM,
  COUNT
};

enum class MtpTensor { HC_HEAD_BASE, HC_HEAD_FN, HC_HEAD_SCALE, E_PROJ, H_PROJ, ENORM, HNORM, NORM, COUNT };

// The DSpark drafter's tensors beside its stages' blocks (ds4-variants-mtp-dspark.md §4.1): stage 0's
// main_proj/main_norm, the final stage's head, Markov correction and confidence head.
enum class DSparkTensor {
  MAIN_PROJ,
  MAIN_NORM,
  NORM,
  HC_HEAD_BASE,
  HC_HEAD_FN,
  HC_HEAD_SCALE,
  MARKOV_W1,
  MARKOV_W2,
  CONFIDENCE,
  COUNT
};

// What a DSpark support file's metadata says (dspark.*; §4.1).
struct DSparkMeta {
  uint32_t block_size = 5;             // proposals per pass
  uint32_t markov_rank = 256;          // width of the Markov state
  uint32_t noise_token_id = 128799;    // the token of the block's draft rows after the first
  std::vector<uint32_t> target_layers  // main layers whose output states feed main_proj
      {40, 41, 42};
  uint32_t stage_count = 3;
};

enum class TensorScope { GLOBAL, LAYER, MTP_HEAD, MTP_LAYER, DSPARK_HEAD };

struct TensorSpec {
  std::string name;          // full GGUF name, e.g. "blk.3.attn_q_a.weight"
  std::vector<uint64_t> ne;  // expected dims (GGUF order)
  TypeClass cls;
  TensorScope scope;
  int layer = -1;        // block index for LAYER scope
  int slot = 0;          // GlobalTensor / LayerTensor / MtpTensor value
  bool required = true;  // false: may be absent (exp_probs_b.bias on top-k layers)

  uint64_t n_elements() const;
};

// The main model's tensors in file order (globals, then blk.0 .. blk.L-1).
std::vector<TensorSpec> main_tensor_table(const ModelSpec& spec);
// The MTP block's tensors (prefix "mtp.0.").
std::vector<TensorSpec> mtp_tensor_table(const ModelSpec& spec);
// A DSpark support file's tensors: stage S's block under "mtp.S." (scope MTP_LAYER, layer S), and
// the DSparkTensor ones (scope DSPARK_HEAD).
std::vector<TensorSpec> dspark_tensor_table(const ModelSpec& spec, const DSparkMeta& meta);

// How weights are quantised when dsv4 writes a model (synth, convert).
enum class QuantRecipe {
  Q2,     // published q2: routed gate/up IQ2_XXS, down Q2_K; dense Q8_0; the rest F16/F32
  Q2_Q4,  // published q2-q4: as Q2, with the routed experts of the last k_q2_q4_tail_layers layers Q4_K
  Q4,     // published q4: routed experts Q4_K; otherwise as Q2
  Q8,     // routed experts Q8_0; otherwise as Q2
  MXFP4,  // published mxfp4 ("MXFP4Experts"): routed experts MXFP4; otherwise as Q2
  F16,    // every matrix F16
  F32,    // every matrix F32
};
// q2-q4: Flash's layers 37-42 (the file splices those layers' routed experts from the q4 file into q2).
constexpr int k_q2_q4_tail_layers = 6;
const char* quant_recipe_name(QuantRecipe r);
expected<QuantRecipe> quant_recipe_from_name(const std::string& name);
// The type recipe r gives tensor t of a model with n_layer layers.
GgmlType recipe_type(QuantRecipe r, const TensorSpec& t, uint32_t n_layer);

}  // namespace dsv4
