// Binding a GGUF's tensors to the model: every tensor of the tensor table is
// looked up by exact name and checked for rank, each dimension and an allowed
// type; routed gate/up must share a type. All mismatches are reported together,
// each naming the tensor, the expected and the actual shape/type.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model_spec.h"
#include "model/tensor_table.h"

namespace dsv4 {

// A bound tensor: a typed view of bytes (in the mmap, or owned elsewhere).
struct TensorRef {
  const uint8_t* data = nullptr;
  GgmlType type = GgmlType::F32;
  uint64_t ne[4] = {1, 1, 1, 1};
  uint64_t n_bytes = 0;
  std::string name;

  explicit operator bool() const { return data != nullptr; }
  uint64_t row_bytes() const { return ggml_row_bytes(type, ne[0]); }
  uint64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  const uint8_t* row(uint64_t r) const { return data + r * row_bytes(); }
  // For stacked experts [in, out, n_expert]: bytes of one expert and its start.
  uint64_t expert_bytes() const { return ne[1] * row_bytes(); }
  const uint8_t* expert(uint64_t e) const { return data + e * expert_bytes(); }
  // Element access for F32 vectors (norms, biases) and I32 tables.
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(data); }
};

struct LayerWeights {
  std::array<TensorRef, static_cast<size_t>(LayerTensor::COUNT)> t;
  const TensorRef& operator[](LayerTensor s) const { return t[static_cast<size_t>(s)]; }
  TensorRef& operator[](LayerTensor s) { return t[static_cast<size_t>(s)]; }
};

struct MtpWeights {
  std::array<TensorRef, static_cast<size_t>(MtpTensor::COUNT)> head;
  LayerWeights block;
  const TensorRef& operator[](MtpTensor s) const { return head[static_cast<size_t>(s)]; }
};

// A DSpark support file (ds4-variants-mtp-dspark.md §4): its stages' blocks, head tensors and metadata.
struct DSparkWeights {
  DSparkMeta meta;
  std::vector<LayerWeights> stages;
  std::array<TensorRef, static_cast<size_t>(DSparkTensor::COUNT)> head;
  const TensorRef& operator[](DSparkTensor s) const { return head[static_cast<size_t>(s)]; }
};

// How the routed experts (and the rest) are stored, for messages and KV-cache headers.
struct QuantMix {
  GgmlType expert_gate_up = GgmlType::F32;
  GgmlType expert_down = GgmlType::F32;
  GgmlType dense = GgmlType::F32;  // attn_q_a of layer 0 as a representative
  // The last tail_layers layers' routed experts in other types (0: every layer as layer 0; q2-q4: 6, Q4_K).
  uint32_t tail_layers = 0;
  GgmlType tail_gate_up = GgmlType::F32, tail_down = GgmlType::F32;
  bool published_layout = false;  // exactly the published q2, q2-q4 or q4 recipe
  std::string describe() const;   // "q2 (IQ2_XXS gate/up, Q2_K down, Q8_0 dense) — published layout"
  int routed_bits() const;        // 2 or 4 (ds4 KV-cache convention), 8/16/32 otherwise
};

struct ModelWeights {
  ModelSpec spec;
  std::array<TensorRef, static_cast<size_t>(GlobalTensor::COUNT)> global;
  std::vector<LayerWeights> layers;
  QuantMix mix;
  uint64_t n_bytes = 0;              // sum over bound tensors
  std::vector<std::string> ignored;  // tensors in the file that the table does not know

  const TensorRef& operator[](GlobalTensor s) const { return global[static_cast<size_t>(s)]; }
};

// Checks one tensor's rank, dims and type against its spec ("" when it matches).
std::string check_tensor(const TensorSpec& spec, const GgufTensorInfo& t);

// Binds all main-model tensors of `f` (whose metadata gave `spec`).
expected<ModelWeights> bind_weights(const GgufFile& f, const ModelSpec& spec);
// Binds the MTP block from its own GGUF (formats.md §1.8; no metadata read).
expected<MtpWeights> bind_mtp_weights(const GgufFile& f, const ModelSpec& spec);
// Reads and checks a DSpark support file's metadata (dspark.*, also spelt deepseek4.dspark.* and
// deepseek4.dspark_*) against the main model, then binds its tensors.
expected<DSparkMeta> read_dspark_meta(const GgufFile& f, const ModelSpec& spec);
expected<DSparkWeights> bind_dspark_weights(const GgufFile& f, const ModelSpec& spec);

}  // namespace dsv4
