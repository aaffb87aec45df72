// POST /v1/completions (OpenAI legacy Completions): raw text completion of
// the prompt exactly as given, with no chat template. Special tokens spelled
// in the prompt (e.g. "<｜begin▁of▁sentence｜>") are recognised as such; no BOS
// is added. The completion is plain text (no reasoning or tool parsing).
//
// Request fields: model, prompt (a string, an array holding one string, or
// token ids as an array of integers), max_tokens (default 16, as OpenAI),
// temperature, top_p, top_k, min_p, seed, stop, ignore_eos, presence_penalty,
// frequency_penalty, repetition_penalty, logprobs (0..5), echo, stream,
// stream_options.include_usage, n (1..16, not streamed; as chat
// completions), best_of (1 only). suffix is refused.
//
// Reply: a text_completion object, or chunks "data: {text_completion with
// choices[0].text = delta}" ... a finishing chunk, an optional usage chunk,
// "data: [DONE]". Logprobs use the legacy shape {tokens, token_logprobs,
// top_logprobs: [{token: logprob}], text_offset}.
#pragma once

#include <nlohmann/json.hpp>

#include "server/reply_writer.h"

namespace dsv4::server {

expected<PreparedRequest, ApiError> prepare_openai_completions(const nlohmann::ordered_json& body,
                                                               const ServeContext& ctx);

}  // namespace dsv4::server
