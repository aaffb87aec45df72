// dsv4 synth: write a random-weight model of a preset (see src/synth/).
#include <cstdio>
#include <thread>

#include "commands.h"
#include "core/progress.h"
#include "synth/synth.h"
#include "util.h"

namespace dsv4::tools {

namespace {

struct SynthArgs {
  std::string preset;
  std::string out;
  uint64_t seed = 1;
  double router_skew = 0;
  bool dry_run = false;
  bool list = false;
  bool mtp = false;
  bool dspark = false;
  int threads = 0;
};

int run_synth(const SynthArgs& a) {
  if (a.list) {
    for (const auto& p : synth_presets()) std::printf("%-12s %s\n", p.name.c_str(), p.description.c_str());
    return 0;
  }
  if (a.preset.empty()) {
    std::fprintf(stderr, "dsv4 synth: error: --preset is required (see --list-presets)\n");
    return 2;
  }
  auto preset = find_preset(a.preset);
  if (!preset) {
    std::fprintf(stderr, "dsv4 synth: error: %s\n", preset.error().message.c_str());
    return 2;
  }
  if (a.mtp && a.dspark) {
    std::fprintf(stderr, "dsv4 synth: error: --mtp and --dspark write different files: give one\n");
    return 2;
  }
  SynthPlan plan = a.mtp      ? synth_mtp_plan(*preset, a.seed)
                   : a.dspark ? synth_dspark_plan(*preset, a.seed)
                              : synth_plan(*preset, a.seed);
  plan.router_skew = a.router_skew;
  ThreadPool pool(a.threads);
  GgufWriter writer = synth_writer(plan, pool);
  std::printf("preset %s: %s\n", preset->name.c_str(), preset->description.c_str());
  std::printf("tensors: %zu\ntensor data: %s bytes (%s)\nfile size: %s bytes\n", plan.tensors.size(),
              with_commas(plan.tensor_bytes).c_str(), human_bytes(plan.tensor_bytes).c_str(),
              with_commas(writer.file_bytes()).c_str());
  if (a.dry_run) return 0;
  if (a.out.empty()) {
    std::fprintf(stderr, "dsv4 synth: error: -o FILE is required unless --dry-run\n");
    return 2;
  }
  Progress progress("synth " + preset->name, writer.file_bytes());
  auto st = writer.write_mapped(a.out, [&](uint64_t done, uint64_t) { progress.update(done); });
  progress.finish();
  if (!st) {
    std::fprintf(stderr, "dsv4 synth: error: %s\n", st.error().message.c_str());
    return 1;
  }
  double s = progress.elapsed_s();
  std::printf("wrote %s in %.1f s (%.2f GB/s), seed %llu\n", a.out.c_str(), s,
              s > 0 ? static_cast<double>(writer.file_bytes()) / s / 1e9 : 0.0,
              static_cast<unsigned long long>(a.seed));
  return 0;
}

}  // namespace

void register_synth(CLI::App& app) {
  auto args = std::make_shared<SynthArgs>();
  CLI::App* cmd = app.add_subcommand("synth", "Write a random-weight DeepSeek V4 model (any preset) as a GGUF file");
  std::string names;  // every preset, from the table (--list-presets describes them)
  for (const auto& p : synth_presets()) names += (names.empty() ? "" : " | ") + p.name;
  cmd->add_option("--preset", args->preset, names);
  cmd->add_option("-o,--output", args->out, "Output GGUF path (written as PATH.tmp, then renamed)");
  cmd->add_option("--seed", args->seed, "Random seed; the output is deterministic for a seed")->capture_default_str();
  cmd->add_option("--router-skew", args->router_skew,
                  "Skewed routing: each layer's router bias favours a random order of its experts (0: uniform; 1: "
                  "the most-used quarter takes about two thirds of the assignments; the --expert-stats option of run, "
                  "serve, bench and logits records a model's real routing)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("-t,--threads", args->threads, "Generator threads (0 = all cores)")->capture_default_str();
  cmd->add_flag("--dry-run", args->dry_run, "Print the tensor count and sizes without writing");
  cmd->add_flag("--mtp", args->mtp, "Write the preset's MTP block (for --mtp FILE) instead of the main model");
  cmd->add_flag("--dspark", args->dspark,
                "Write the preset's DSpark support file (for --dspark FILE: 3 drafter stages, Markov and confidence "
                "heads) instead of the main model");
  cmd->add_flag("--list-presets", args->list, "List the presets and exit");
  cmd->callback([args] { set_exit_code(run_synth(*args)); });
}

}  // namespace dsv4::tools
