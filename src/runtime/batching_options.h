// What `--parallel`, `--step-tokens` and `--prefill-chunk` ask of the serving runtime
// (step_batcher.h): how many requests generate at once, and how many tokens
// one batched step takes at most.
#pragma once

#include <cstddef>

namespace dsv4::runtime {

struct BatchingOptions {
  size_t parallel = 1;     // --parallel: requests generating at once (1: one at a time, no step batcher)
  size_t step_tokens = 0;  // --step-tokens: tokens per batched step (0: the engine's prefill batch)
  // --prefill-chunk: prompt tokens of a step that also decodes other requests
  // (0: a quarter of the step tokens).
  size_t prefill_chunk = 0;
  // --draft: proposed tokens checked per forward pass by speculative decoding (GenerateOptions::draft;
  // docs/SPECULATIVE.md); 0: off. With parallel > 1 each request's verify pass is an item of the
  // batched steps (StepBatcher::verify).
  int draft = 0;
  float draft_margin = 0;  // --draft-margin (GenerateOptions::draft_margin)
};

}  // namespace dsv4::runtime
