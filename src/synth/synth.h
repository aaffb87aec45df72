// `dsv4 synth`: random-weight models of any preset, written as GGUF files in
// the exact published tensor layout (or into memory), deterministic for a seed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "model/model_spec.h"
#include "model/tensor_table.h"

namespace dsv4 {

struct Preset {
  std::string name;  // "tiny", "flash-q2", ...
  std::string description;
  ModelSpec spec;
  QuantRecipe recipe;
};

std::vector<Preset> synth_presets();
expected<Preset> find_preset(const std::string& name);
ModelSpec tiny_spec();

// One tensor of a synthetic model: what to write and how to generate it.
struct SynthTensor {
  TensorSpec spec;
  GgmlType type;
  uint64_t n_bytes;
};

struct SynthPlan {
  Preset preset;
  uint64_t seed = 1;
  std::vector<SynthTensor> tensors;
  uint64_t tensor_bytes = 0;  // sum without alignment padding
  bool mtp = false;           // the MTP block file (formats.md §1.8) instead of the main model
  bool dspark = false;        // the DSpark support file (dspark_meta) instead of the main model
  DSparkMeta dspark_meta;
  // Skewed routing (0: uniform): each layer's router bias (exp_probs_b) gets -0.05 * skew * ln(1 + r) for the
  // expert of rank r in a per-layer random order, so low ranks win the top-k more often. The router's
  // sigmoid scores spread by ~0.2, so skew 1 gives the most-used quarter of the experts about two thirds of
  // the assignments (uniform: a quarter); measure it with --expert-stats.
  double router_skew = 0;
};

SynthPlan synth_plan(const Preset& preset, uint64_t seed);
// The MTP block of a preset (tensors prefixed "mtp.0."), written as its own GGUF.
SynthPlan synth_mtp_plan(const Preset& preset, uint64_t seed);
// The DSpark support file of a preset (ds4-variants-mtp-dspark.md §4.1): three stages, target layers
// the last three, block size 5, Markov rank 256 (32 below 4096 embedding dims), the noise token
// 128799 (the vocabulary's last ordinary token for smaller vocabularies); routed experts q2 as
// published (F16/F32 presets: their recipe).
SynthPlan synth_dspark_plan(const Preset& preset, uint64_t seed);

// Writes rows [row_begin, row_begin + n_rows) of tensor `t` (deterministic in
// (seed, tensor name, row/block index); thread-safe).
void synth_fill_rows(const SynthPlan& plan, const SynthTensor& t, uint64_t row_begin, uint64_t n_rows, uint8_t* dst);

// A writer holding the whole model (metadata, vocab, tensor generators);
// `pool` runs the generators and must outlive the writer.
GgufWriter synth_writer(const SynthPlan& plan, ThreadPool& pool);

// Writes the whole model to `path` (temp file, fsync, rename), every tensor
// generated in parallel straight into a mapping of the file.
// progress(bytes_done, bytes_total) is called after each tensor.
Status synth_write(const SynthPlan& plan, const std::string& path, int n_threads,
                   const std::function<void(uint64_t, uint64_t)>& progress = {});

// The same bytes in an anonymous in-memory file (memfd; `dsv4 bench
// --synthetic`): returns its descriptor, which the caller closes once it has
// opened "/proc/self/fd/<fd>" (the mapping keeps the memory). Needs RAM for the
// whole model.
expected<int> synth_memfd(const SynthPlan& plan, int n_threads,
                          const std::function<void(uint64_t, uint64_t)>& progress = {});

}  // namespace dsv4
