// CUDA test helpers for tests that link the model and synth layers: the command line they share, the synthetic
// tiny model written to a temporary file for the object's lifetime and opened, and seeded in-vocabulary token ids.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/assert.h"
#include "cuda_test_util.h"
#include "model/model_file.h"
#include "synth/synth.h"

namespace dsv4::cudatest {

// seed_arg's command line (cuda_test_util.h), then an exit with 77 (ctest's "skipped") when no CUDA device is
// present.
inline uint64_t tiny_test_seed(const char* name, int argc, char** argv, uint64_t seed) {
  seed = seed_arg(name, argc, argv, seed);
  if (!cuda_device_present()) {
    std::fprintf(stderr, "%s: no CUDA device: nothing to test\n", name);
    std::exit(77);
  }
  return seed;
}

struct TinyModelFile {
  std::string path;
  std::unique_ptr<ModelFile> mf;
  // `tag` names the file (tests running at once use different tags); `seed` the random weights.
  TinyModelFile(const std::string& tag, uint64_t seed) {
    path = (std::filesystem::temp_directory_path() / ("dsv4_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
               .string();
    DSV4_ASSERT(synth_write(synth_plan(*find_preset("tiny"), seed), path, 2).has_value(), "synth_write");
    auto m = open_model(path);
    DSV4_ASSERT(m.has_value(), "open_model: %s", m ? "" : m.error().message.c_str());
    mf = std::move(*m);
  }
  ~TinyModelFile() { std::filesystem::remove(path); }
  TinyModelFile(const TinyModelFile&) = delete;
  TinyModelFile& operator=(const TinyModelFile&) = delete;
};

// n token ids in [3, V) from `seed` (a 64-bit LCG).
inline std::vector<int32_t> seeded_tokens(uint64_t seed, size_t n, int64_t V) {
  std::vector<int32_t> t(n);
  uint64_t x = seed * 2654435761u + 1;
  for (auto& v : t) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<int32_t>(3 + (x >> 33) % static_cast<uint64_t>(V - 3));
  }
  return t;
}

}  // namespace dsv4::cudatest
