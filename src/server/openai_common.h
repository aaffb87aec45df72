// Pieces shared by the OpenAI dialects (chat completions, completions,
// responses): finish reasons, usage objects, logprobs, sampling fields.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_request.h"
#include "server/reply_assembler.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server {

// "stop" | "length" | "tool_calls" (a cancelled reply is never answered).
const char* openai_finish_reason(FinishReason r);

// Chat-completions usage: prompt/completion/total tokens, cached prompt tokens
// (prompt_tokens_details.cached_tokens, and DeepSeek's prompt_cache_hit_tokens /
// prompt_cache_miss_tokens), reasoning tokens.
nlohmann::ordered_json openai_usage_json(const FinalReply& r);

// Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}.
// Token strings are the token's bytes made valid UTF-8; "bytes" keeps the raw bytes.
nlohmann::ordered_json openai_chat_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok);

// Reads the sampling fields chat completions and completions share:
// temperature, top_p, top_k, min_p, seed, presence_penalty,
// frequency_penalty, repetition_penalty, stop, ignore_eos (an extension, as
// vLLM's), max_tokens / max_completion_tokens (the latter wins), and n
// (1..k_max_choices).
Status read_openai_sampling(const nlohmann::ordered_json& body, ChatRequest& r);

}  // namespace dsv4::server
