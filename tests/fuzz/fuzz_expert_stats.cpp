// Fuzz target: the --expert-stats file parser (model/expert_stats.h) must
// accept or reject any text without crashing or allocating beyond what the
// input can hold. An accepted file re-encodes to a text that parses to the
// same counts.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "model/expert_stats.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto s = dsv4::expert_stats_decode(text);
  if (!s) return 0;
  auto again = dsv4::expert_stats_decode(dsv4::expert_stats_encode(*s));
  if (!again || again->counts != s->counts || again->n_layer != s->n_layer || again->n_expert != s->n_expert)
    std::abort();
  (void)s->top_share(0.25);
  return 0;
}
