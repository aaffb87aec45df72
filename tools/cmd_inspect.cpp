// dsv4 inspect: what a GGUF holds and whether dsv4 can run it.
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "model/model_file.h"
#include "util.h"

namespace dsv4::tools {

namespace {

struct InspectArgs {
  std::string path;
  bool json = false;
  bool all_metadata = false;
};

struct TypeStats {
  uint64_t count = 0, bytes = 0;
};

int run_inspect(const InspectArgs& a) {
  nlohmann::ordered_json j;
  j["file"] = a.path;
  auto fail = [&](const std::string& msg) {
    if (a.json) {
      j["valid"] = false;
      j["error"] = msg;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("validation: FAILED\n");
      std::fprintf(stderr, "dsv4 inspect: error: %s\n", msg.c_str());
    }
    return 1;
  };

  auto g = GgufFile::open(a.path);
  if (!g) return fail(g.error().message);
  const GgufFile& f = **g;

  std::map<std::string, TypeStats> by_type;
  for (const auto& t : f.tensors()) {
    auto& s = by_type[ggml_type_name(t.type)];
    s.count++;
    s.bytes += t.n_bytes;
  }
  j["file_bytes"] = f.file_size();
  j["gguf_version"] = f.version();
  j["alignment"] = f.alignment();
  j["metadata_count"] = f.kvs().size();
  j["tensor_count"] = f.tensors().size();
  j["tensor_bytes"] = f.tensor_data_bytes();
  for (const auto& [name, s] : by_type) j["types"][name] = {{"tensors", s.count}, {"bytes", s.bytes}};
  for (const auto& kv : f.kvs()) {
    bool big_array = kv.type == GgufType::ARRAY && kv.count > 64;
    if (a.all_metadata || !big_array)
      j["metadata"][std::string(kv.key)] = gguf_value_to_string(kv, a.all_metadata ? 64 : 8);
    else
      j["metadata"][std::string(kv.key)] =
          strfmt("[%s x %llu]", gguf_type_name(kv.elem_type), static_cast<unsigned long long>(kv.count));
  }

  if (!a.json) {
    std::printf("file: %s (%s bytes, %s)\n", a.path.c_str(), with_commas(f.file_size()).c_str(),
                human_bytes(f.file_size()).c_str());
    std::printf("GGUF v%u, alignment %llu, %zu metadata keys, %zu tensors\n", f.version(),
                static_cast<unsigned long long>(f.alignment()), f.kvs().size(), f.tensors().size());
    std::printf("metadata:\n");
    for (const auto& [k, v] : j["metadata"].items())
      std::printf("  %-48s %s\n", k.c_str(), v.get<std::string>().c_str());
    std::printf("tensor data: %s bytes (%s)\n", with_commas(f.tensor_data_bytes()).c_str(),
                human_bytes(f.tensor_data_bytes()).c_str());
    for (const auto& [name, s] : by_type)
      std::printf("  %-8s %5llu tensors %18s bytes (%s)\n", name.c_str(), static_cast<unsigned long long>(s.count),
                  with_commas(s.bytes).c_str(), human_bytes(s.bytes).c_str());
  }

  auto spec = ModelSpec::from_gguf(f);
  if (!spec) return fail(spec.error().message);
  uint32_t n_window = 0, n_sparse = 0, n_comp = 0;
  for (uint32_t il = 0; il < spec->n_layer; ++il) {
    switch (spec->layer_kind(il)) {
      case LayerKind::WINDOW: ++n_window; break;
      case LayerKind::SPARSE: ++n_sparse; break;
      case LayerKind::COMPRESSED: ++n_comp; break;
    }
  }
  std::string model = spec->recognise();
  std::string layers = strfmt("%u layers: %u window-only, %u sparse (ratio 4 + indexer), %u compressed; %u hash-routed",
                              spec->n_layer, n_window, n_sparse, n_comp, spec->n_hash_layers);
  j["model"] = model;
  j["layers"] = layers;
  auto w = bind_weights(f, *spec);
  if (!w) return fail(w.error().message);
  j["quant"] = w->mix.describe();
  j["ignored_tensors"] = w->ignored;
  j["valid"] = true;
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model: %s (%s)\n", model.c_str(), layers.c_str());
  std::printf("quant: %s\n", w->mix.describe().c_str());
  if (!w->ignored.empty())
    std::printf("note: %zu tensors not used by dsv4 (e.g. %s)\n", w->ignored.size(), w->ignored[0].c_str());
  std::printf("validation: OK\n");
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Show a GGUF's metadata, tensors and quant mix, and validate it as a DeepSeek V4 model");
  cmd->add_option("file", args->path, "GGUF file")->required();
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--all-metadata", args->all_metadata, "Show long arrays (vocabulary) in full");
  cmd->callback([args] { set_exit_code(run_inspect(*args)); });
}

}  // namespace dsv4::tools
