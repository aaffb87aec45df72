// Routing statistics (`--expert-stats FILE`): how many token assignments each
// routed expert of each layer received. Any run counts them (Model, with
// ModelOptions::count_routing) and merges them into the file when it ends; a
// load reads the file to put the most-used experts on the GPU first when not
// all of them fit (Model placement, ModelOptions::expert_priority).
//
// The file is text, one layer per line:
//
//   dsv4-expert-stats 1
//   layers 43 experts 256
//   0 c_0 c_1 ... c_255        (layer index, then n_expert counts)
//   ...
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace dsv4 {

struct ExpertStats {
  uint32_t n_layer = 0, n_expert = 0;
  std::vector<uint64_t> counts;  // [n_layer][n_expert]

  static ExpertStats zeros(uint32_t n_layer, uint32_t n_expert);
  bool empty() const { return counts.empty(); }
  uint64_t& at(uint32_t layer, uint32_t expert) { return counts[static_cast<size_t>(layer) * n_expert + expert]; }
  uint64_t at(uint32_t layer, uint32_t expert) const { return counts[static_cast<size_t>(layer) * n_expert + expert]; }
  uint64_t total() const;
  // Adds `o`'s counts (the same shape, else an error naming both).
  Status merge(const ExpertStats& o);
  // The share of all assignments that went to the `fraction` most-used experts
  // of each layer (0.25: the top quarter), over all layers: 0.25 when routing
  // is uniform, near 1 when a few experts take everything.
  double top_share(double fraction) const;
};

std::string expert_stats_encode(const ExpertStats& s);
// Strict: a wrong header, a short or long line, or a count that is not a number is an error naming the line.
expected<ExpertStats> expert_stats_decode(std::string_view text);

// Whole-file read and write (write: a temporary file, fsync, rename: never a half-written file).
expected<ExpertStats> expert_stats_load(const std::string& path);
Status expert_stats_save(const std::string& path, const ExpertStats& s);

}  // namespace dsv4
