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

#include <string>
#include <string_view>

#include "core/act_quant.h"
#include "core/error.h"

namespace dsv4 {

enum class Numerics { REFERENCE = 0, PLAIN = 1, FAST = 2 };

const char* numerics_name(Numerics n);  // "reference", "plain", "fast"
expected<Numerics> numerics_from_name(std::string_view s);

// The inputs FAST may quantise (model-spec.md §9.1), as bits of a set; a set without some of them computes
// those layers as REFERENCE does (the accuracy / speed trade of docs/design-notes/fast-numerics.md, chosen
// with `dsv4 logits|bench --fast-skip`). FAST_DEFAULT_SITES: every one but the attention's input.
enum FastSite : unsigned {
  FAST_ATTN_IN = 1u << 0,    // wq_a and wkv (the attention norm's output)
  FAST_Q = 1u << 1,          // wq_b and the indexer's wq_b (the q norm's output)
  FAST_WO_B = 1u << 2,       // wo_b (wo_a's output)
  FAST_FFN_IN = 1u << 3,     // the routed and shared experts' gate and up (the FFN norm's output)
  FAST_SHEXP_MID = 1u << 4,  // the shared expert's down (its SwiGLU)
  FAST_EXP_MID = 1u << 5,    // the routed experts' down (their mid vector)
  FAST_MTP = 1u << 6,        // the MTP block's e and h projections
  FAST_ALL_SITES = (1u << 7) - 1,
  // The default: wq_a and wkv read the attention norm unquantised. Measured on the full-size file (H200,
  // eight prompts per length): mean |d logprob| against reference +3.9% / +0.2% above plain's at 122 / 3,000
  // tokens instead of +6.0% / +1.0%, and decode 1-2% faster (one quantiser launch a layer less; their
  // decode matvec is the float one either way); prefill the same within a run's noise.
  FAST_DEFAULT_SKIP = FAST_ATTN_IN,
  FAST_DEFAULT_SITES = FAST_ALL_SITES & ~FAST_DEFAULT_SKIP,
};
// "attn-in,q,..." (names as above, lower case with dashes; "none" the empty set) <-> a set of FastSite bits.
std::string fast_sites_name(unsigned sites);
expected<unsigned> fast_sites_from_names(std::string_view list);

// Whether the storage roundings of REFERENCE apply (KV, indexer, mHC state, pooled rows).
inline bool simulates_storage(Numerics n) { return n != Numerics::PLAIN; }

}  // namespace dsv4
