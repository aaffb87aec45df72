// Opening a model file: map the GGUF, read and validate the ModelSpec, bind
// every tensor. Errors say what is wrong and what to do about it.
#pragma once

#include <memory>
#include <string>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/model_spec.h"
#include "model/weights.h"

namespace dsv4 {

struct ModelFile {
  std::unique_ptr<GgufFile> gguf;
  ModelWeights weights;  // weights.spec is the model's ModelSpec
  const ModelSpec& spec() const { return weights.spec; }
};

// A hint appended to "file not found" errors: how to get or make a model.
extern const char* const k_model_help;

expected<std::unique_ptr<ModelFile>> open_model(const std::string& path);

}  // namespace dsv4
