// `dsv4 run --dump-logprobs FILE`: a continuation with the log-probability
// of every chosen token and its top-K alternatives, as JSON:
//
//   {"format": "dsv4-logprobs", "version": 1,
//    "model": "...", "prompt_tokens": N, "top_k": K, "finish": "length",
//    "text": "<the continuation as UTF-8>",
//    "steps": [{"token": 17, "text": "he", "logprob": -0.71,
//               "top": [{"token": 17, "text": "he", "logprob": -0.71}, ...]}, ...]}
//
// Token texts are the token's bytes made valid UTF-8: a token may end inside
// a multi-byte character (or hold bytes that never form one), so ill-formed
// parts become U+FFFD; when that changed anything the entry also carries
// "bytes": [the raw byte values], so nothing is lost. A logprob that is not
// finite (a -inf logit) is written as null.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/generate.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

struct LogprobDump {
  std::string model;  // model name (informational)
  size_t prompt_tokens = 0;
  int top_k = 0;
  std::string finish;  // finish_reason_name()
  std::vector<TokenLogprob> steps;
};

// One token as {"token", "text"[, "bytes"]} (plus nothing else).
nlohmann::ordered_json token_to_json(int32_t id, std::string_view bytes);
nlohmann::ordered_json logprobs_to_json(const LogprobDump& d, const Tokenizer& tok);

// Writes the JSON (indented, one step per few lines) to `path`.
Status logprobs_write_file(const std::string& path, const LogprobDump& d, const Tokenizer& tok);

}  // namespace dsv4
