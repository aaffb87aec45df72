// Test helpers: the synthetic tiny model written to a temporary file for the test's lifetime and opened,
// and random in-vocabulary token ids.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "model/model_file.h"
#include "synth/synth.h"

namespace dsv4::test {

// `tag` names the file (tests running at once use different tags); `seed` the random weights.
struct TinyFile {
  std::string path;
  std::unique_ptr<ModelFile> mf;
  TinyFile(const std::string& tag, uint64_t seed) {
    path = (std::filesystem::temp_directory_path() / ("dsv4_test_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
               .string();
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny"), seed), path, 2).has_value());
    auto m = open_model(path);
    EXPECT_TRUE(m.has_value());
    if (m) mf = std::move(*m);
  }
  ~TinyFile() { std::filesystem::remove(path); }
};

// n token ids in [3, vocab) from `seed`.
inline std::vector<int32_t> random_tokens(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(n);
  for (auto& v : t) v = static_cast<int32_t>(3 + g() % (vocab - 3));
  return t;
}

}  // namespace dsv4::test
