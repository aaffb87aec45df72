// `dsv4 convert --from-hf DIR`: a DeepSeek V4 checkpoint in the transformers /
// official layout (config.json + safetensors; BF16/F16/F32, or the official
// FP8 block / FP4 expert formats) to a GGUF in the published ds4 tensor layout
// (formats.md §1), quantised with a recipe (q2 / q4 / q8 / f16 / f32).
// Tensors are read and quantised in row chunks, so memory stays bounded.
#pragma once

#include <functional>
#include <string>

#include "core/error.h"
#include "hf/hf_config.h"
#include "model/model_spec.h"
#include "model/tensor_table.h"

namespace dsv4 {

struct ConvertOptions {
  std::string hf_dir;
  std::string output;
  QuantRecipe recipe = QuantRecipe::Q2;
  int threads = 0;
};

// The ModelSpec of a checkpoint config (errors for features V4 does not have).
expected<ModelSpec> spec_from_hf(const HfConfig& c);

// Whether every tensor's rows are whole blocks of the type the recipe gives it
// (Q8_0: 32 values, Q2_K / Q4_K / IQ2_XXS: 256; F16 / F32 take any width). The
// error names the first tensor that does not fit, its type and block size.
Status check_recipe_fits(const ModelSpec& spec, QuantRecipe recipe);

struct ConvertReport {
  size_t n_tensors = 0;
  uint64_t tensor_bytes = 0;
  std::string vocab_source;  // "tokenizer.json" or "synthetic byte-level vocabulary"
  // --type mxfp4: routed-expert tensors whose MXFP4 blocks were copied from the checkpoint's packed FP4
  // codes and E8M0 scales (lossless; each row checked back against the checkpoint's values), and those
  // quantised from other source types.
  size_t mxfp4_repacked = 0, mxfp4_quantised = 0;
};

expected<ConvertReport> convert_hf(const ConvertOptions& o,
                                   const std::function<void(uint64_t done, uint64_t total)>& progress = {});

}  // namespace dsv4
