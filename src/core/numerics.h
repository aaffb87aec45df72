// Numerics of the forward pass (docs/design.md §4):
//  REFERENCE: DeepSeek's own inference graph — FP8 round trip of window and
//    compressed KV rows, Hadamard + FP4 round trip of indexer q and K, bf16
//    storage of KV, of the mHC state and of pooled compressor rows.
//  PLAIN: no simulated rounding at all (what transformers computes).
// A user-facing choice (--numerics), and part of what a session snapshot or
// KV-cache file is bound to.
#pragma once

#include <string_view>

#include "core/error.h"

namespace dsv4 {

enum class Numerics { REFERENCE, PLAIN };

const char* numerics_name(Numerics n);  // "reference", "plain"
expected<Numerics> numerics_from_name(std::string_view s);

}  // namespace dsv4
