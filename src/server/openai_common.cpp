#include "server/openai_common.h"

#include <cmath>

#include "server/json_util.h"
#include "tokenizer/stream_decoder.h"

namespace dsv4::server {

const char* openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::STOP: return "stop";
    case FinishReason::LENGTH: return "length";
    case FinishReason::TOOL_CALLS: return "tool_calls";
    case FinishReason::CANCELLED: return "stop";
  }
  DSV4_UNREACHABLE();
}

ordered_json openai_usage_json(const FinalReply& r) {
  ordered_json u = ordered_json::object();
  u["prompt_tokens"] = r.prompt_tokens;
  u["completion_tokens"] = r.completion_tokens;
  u["total_tokens"] = r.prompt_tokens + r.completion_tokens;
  u["prompt_tokens_details"] = ordered_json{{"cached_tokens", r.cached_tokens}};
  u["completion_tokens_details"] = ordered_json{{"reasoning_tokens", r.reasoning_tokens}};
  u["prompt_cache_hit_tokens"] = r.cached_tokens;
  u["prompt_cache_miss_tokens"] = r.prompt_tokens - std::min(r.prompt_tokens, r.cached_tokens);
  return u;
}

namespace {

ordered_json token_entry(std::string_view bytes, float logprob) {
  ordered_json e = ordered_json::object();
  e["token"] = utf8_lossy(bytes);
  // OpenAI reports impossible tokens as -9999.0.
  e["logprob"] = std::isfinite(logprob) ? static_cast<double>(logprob) : -9999.0;
  ordered_json b = ordered_json::array();
  for (char c : bytes) b.push_back(static_cast<unsigned>(static_cast<unsigned char>(c)));
  e["bytes"] = std::move(b);
  return e;
}

}  // namespace

ordered_json openai_chat_logprobs_json(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  ordered_json content = ordered_json::array();
  for (const auto& lp : lps) {
    ordered_json e = token_entry(lp.text, lp.logprob);
    ordered_json top = ordered_json::array();
    for (const auto& [id, l] : lp.top) top.push_back(token_entry(tok.token_bytes(id), l));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return ordered_json{{"content", std::move(content)}, {"refusal", nullptr}};
}

Status read_openai_sampling(const ordered_json& body, ChatRequest& r) {
  JsonFields f(body);
  DSV4_TRY_ASSIGN(auto temperature, f.number("temperature", 0, 2));
  DSV4_TRY_ASSIGN(auto top_p, f.number("top_p", 0, 1));
  DSV4_TRY_ASSIGN(auto top_k, f.integer("top_k", 0, 1 << 30));
  DSV4_TRY_ASSIGN(auto min_p, f.number("min_p", 0, 1));
  DSV4_TRY_ASSIGN(auto seed, f.integer("seed", INT64_MIN, INT64_MAX));
  DSV4_TRY_ASSIGN(auto presence, f.number("presence_penalty", -2, 2));
  DSV4_TRY_ASSIGN(auto frequency, f.number("frequency_penalty", -2, 2));
  DSV4_TRY_ASSIGN(auto repetition, f.number("repetition_penalty", 0.01, 10));
  DSV4_TRY_ASSIGN(auto max_tokens, f.integer("max_tokens", 1, INT32_MAX));
  DSV4_TRY_ASSIGN(auto max_completion, f.integer("max_completion_tokens", 1, INT32_MAX));
  DSV4_TRY_ASSIGN(r.stop, f.string_list("stop", 16));
  DSV4_TRY_ASSIGN(auto n, f.integer("n", 1, INT32_MAX));
  if (n && *n > k_max_choices) return make_error("'n' is at most %d choices per request", k_max_choices);
  r.n = static_cast<int>(n.value_or(1));
  DSV4_TRY_ASSIGN(auto ignore_eos, f.boolean("ignore_eos"));  // extension
  r.ignore_eos = ignore_eos.value_or(false);
  if (temperature) r.temperature = static_cast<float>(*temperature);
  if (top_p) r.top_p = static_cast<float>(*top_p);
  if (top_k) r.top_k = static_cast<int>(*top_k);
  if (min_p) r.min_p = static_cast<float>(*min_p);
  if (seed) r.seed = static_cast<uint64_t>(*seed);
  if (presence) r.presence_penalty = static_cast<float>(*presence);
  if (frequency) r.frequency_penalty = static_cast<float>(*frequency);
  if (repetition) r.repetition_penalty = static_cast<float>(*repetition);
  if (max_completion)
    r.max_tokens = static_cast<int>(*max_completion);
  else if (max_tokens)
    r.max_tokens = static_cast<int>(*max_tokens);
  return {};
}

}  // namespace dsv4::server
