// OpenAI `n` > 1 (chat completions, completions): one job per choice on the
// same prompt, with seeds seed, seed + 1, ... (so sampled choices differ and
// a seeded request is reproducible), submitted together so that with
// `--parallel` they generate side by side in batched steps. The prompt is
// prefilled once: the first job publishes its session's state after the
// prompt and the others load a copy (runtime/prompt_share.h). The reply is one
// body: the dialect's body of choice 0 with choices[i] taken from choice i's
// body (index i), and usage counting the prompt once and every choice's
// completion tokens. Streaming n > 1 is refused by the caller.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/runtime.h"
#include "server/api_error.h"
#include "server/reply_writer.h"

namespace dsv4::server {

struct ChoicesReply {
  std::optional<ApiError> error;  // a job failed, or the queue refused one (nothing else is meaningful)
  bool client_gone = false;       // the client hung up: every job was cancelled
  bool cancelled = false;         // a job was cancelled by the server (shutdown)
  bool bad_format = false;        // a choice is not the JSON its response_format asks for
  FinalReply usage;               // the prompt once, the completion tokens of all choices
  nlohmann::ordered_json body;
};

// Runs p.n jobs; `client_gone` is polled while they run.
ChoicesReply run_choices(runtime::Runtime& rt, PreparedRequest& p, const std::function<bool()>& client_gone);

}  // namespace dsv4::server
