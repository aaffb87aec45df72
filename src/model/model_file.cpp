#include "model/model_file.h"

#include <sys/stat.h>

namespace dsv4 {

const char* const k_model_help =
    "get a DeepSeek V4 Flash GGUF (e.g. DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2.gguf from "
    "https://huggingface.co/antirez/deepseek-v4-gguf), or make a small random test model with "
    "`dsv4 synth --preset tiny -o tiny.gguf`";

expected<std::unique_ptr<ModelFile>> open_model(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error("model file '%s' not found: %s", path.c_str(), k_model_help);
  auto g = GgufFile::open(path);
  if (!g) return g.error();
  auto m = std::make_unique<ModelFile>();
  m->gguf = std::move(*g);
  auto spec = ModelSpec::from_gguf(*m->gguf);
  if (!spec) return spec.error().with_context(path);
  auto w = bind_weights(*m->gguf, *spec);
  if (!w) return w.error();
  m->weights = std::move(*w);
  return m;
}

}  // namespace dsv4
