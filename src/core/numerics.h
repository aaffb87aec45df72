// Numerics of the forward pass (docs/design.md §4):
//  REFERENCE: DeepSeek's own inference graph's storage roundings — FP8 round
//    trip of window and compressed KV rows, Hadamard + FP4 round trip of
//    indexer q and K, bf16 storage of KV, of the mHC state and of pooled
//    compressor rows — with every product of f32 activations computed to f32.
//  PLAIN: no simulated rounding at all (what transformers computes).
//  FAST: REFERENCE plus activation quantisation: the input of every linear
//    layer DeepSeek's code runs in FP8 (and the routed experts' mid vector)
//    quantised to int8 blocks of 32 with scales of three mantissa bits
//    (ActQuant::INT8_32, core/act_quant.h) — measured more accurate than the
//    official FP8 blocks of 128 and as cheap for the kernels
//    (docs/design-notes/fast-numerics.md); kernels may then use fewer,
//    cheaper products. Held to tolerances against REFERENCE, not bitwise.
// A user-facing choice (--numerics), and part of what a session snapshot or
// KV-cache file is bound to (the stored values are the enum's).
#pragma once

#include <string_view>

#include "core/act_quant.h"
#include "core/error.h"

namespace dsv4 {

enum class Numerics { REFERENCE = 0, PLAIN = 1, FAST = 2 };

const char* numerics_name(Numerics n);  // "reference", "plain", "fast"
expected<Numerics> numerics_from_name(std::string_view s);

// Whether the storage roundings of REFERENCE apply (KV, indexer, mHC state, pooled rows).
inline bool simulates_storage(Numerics n) { return n != Numerics::PLAIN; }

}  // namespace dsv4
