// dsv4 convert: a DeepSeek V4 checkpoint (transformers / official safetensors) to GGUF.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "convert/convert.h"
#include "core/progress.h"

namespace dsv4::tools {

namespace {

struct ConvertArgs {
  std::string from_hf, out, type = "q2";
  int threads = 0;
};

int run_convert(const ConvertArgs& a) {
  auto recipe = quant_recipe_from_name(a.type);
  if (!recipe) {
    std::fprintf(stderr, "dsv4 convert: error: %s\n", recipe.error().message.c_str());
    return 2;
  }
  ConvertOptions o;
  o.hf_dir = a.from_hf;
  o.output = a.out;
  o.recipe = *recipe;
  o.threads = a.threads;
  std::unique_ptr<Progress> progress;  // created at the first report, when the total is known
  auto r = convert_hf(o, [&](uint64_t done, uint64_t total) {
    if (!progress) progress = std::make_unique<Progress>("convert " + a.type, total);
    progress->update(done);
  });
  if (progress) progress->finish();
  if (!r) {
    std::fprintf(stderr, "dsv4 convert: error: %s\n", r.error().message.c_str());
    return 1;
  }
  std::printf("wrote %s: %zu tensors, %llu bytes of tensor data (%s), vocabulary from %s\n", a.out.c_str(),
              r->n_tensors, static_cast<unsigned long long>(r->tensor_bytes), a.type.c_str(), r->vocab_source.c_str());
  if (r->mxfp4_repacked + r->mxfp4_quantised > 0)
    std::printf(
        "MXFP4 experts: %zu tensors copied losslessly from the checkpoint's FP4 codes and scales, %zu quantised "
        "from other types\n",
        r->mxfp4_repacked, r->mxfp4_quantised);
  return 0;
}

}  // namespace

void register_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* cmd =
      app.add_subcommand("convert", "Convert a DeepSeek V4 safetensors checkpoint to a GGUF in the published layout");
  cmd->add_option("--from-hf", a->from_hf, "Checkpoint folder (config.json + *.safetensors)")->required();
  cmd->add_option("-o,--output", a->out, "Output GGUF")->required();
  cmd->add_option("--type", a->type,
                  "q2 (IQ2_XXS/Q2_K experts, Q8_0 dense) | q2-q4 | q4 (Q4_K experts) | mxfp4 (MXFP4 experts: the "
                  "checkpoint's FP4 experts copied losslessly) | q8 | f16 | f32")
      ->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "Quantiser threads (0 = all cores)")->capture_default_str();
  cmd->callback([a] { set_exit_code(run_convert(*a)); });
}

}  // namespace dsv4::tools
