// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition /
// presence / frequency penalties, deterministic for a seed; and stop-string
// matching across token boundaries.
//
// Order of operations (as in llama.cpp / vLLM): penalties on the raw logits,
// then temperature, then top-k, top-p and min-p on the softmax, then a draw.
// temperature <= 0 (or a greedy step) takes the argmax of the penalised
// logits, lowest id on ties.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsv4 {

struct SamplingParams {
  float temperature = 1.0f;
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off; > 1 discourages repeats (divides positive logits)
  float presence_penalty = 0.0f;    // subtracted once per token already seen
  float frequency_penalty = 0.0f;   // subtracted per occurrence
  int penalty_window = 256;         // last N generated tokens considered by the penalties (0 = all)
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
};

class Sampler {
 public:
  Sampler(SamplingParams params, uint32_t n_vocab);

  // Picks the next token. `history` = tokens generated so far (for penalties);
  // force_greedy takes the argmax regardless of temperature (DSML structure).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history, bool force_greedy = false);

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(std::span<const int32_t> history);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> idx_;
  std::vector<int32_t> counts_;
};

int32_t argmax(std::span<const float> logits);

// log-softmax of `logits` at `token`, and the k most likely tokens with their
// log-probabilities (highest first, lowest id on ties).
float token_logprob(std::span<const float> logits, int32_t token);
std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, int k);

// Finds stop strings in streamed text that arrives in pieces. Text is released
// only once it cannot be the start of a stop string; a matched stop string and
// everything after it are never released.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  struct Result {
    std::string emit;      // text safe to show now
    bool stopped = false;  // a stop string matched (emit holds the text before it)
    std::string stop;      // which one
  };
  Result push(std::string_view text);
  // End of generation: release what was held back.
  std::string flush();
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace dsv4
