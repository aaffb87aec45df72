// POST /v1/chat/completions (OpenAI Chat Completions).
//
// Request fields: model, messages (system|user|assistant|tool|developer,
// content string/null/parts, assistant reasoning_content and tool_calls,
// tool_call_id), tools (function tools), tool_choice ("auto" | "none" |
// "required" | {"type": "function", "function": {"name"}}),
// parallel_tool_calls, stream, stream_options.include_usage, temperature,
// top_p, top_k, min_p, seed, max_tokens / max_completion_tokens, stop, ignore_eos,
// presence_penalty, frequency_penalty, repetition_penalty, logprobs +
// top_logprobs (0..20), reasoning_effort, thinking {"type":
// "enabled"|"disabled"} (DeepSeek), think (bool, ds4), response_format
// {"type": "text"|"json_object"|"json_schema"}, n (1..16 choices, not
// streamed: n jobs on the same prompt, seeds seed, seed + 1, ..., generating
// side by side with --parallel). Other fields are ignored; a non-empty
// logit_bias is refused.
//
// Reply: a chat.completion object, or chat.completion.chunk frames
//   data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}], ...}
//   data: {... "delta":{"reasoning_content":"..."}}          reasoning (DeepSeek's field)
//   data: {... "delta":{"content":"..."}}
//   data: {... "delta":{"tool_calls":[{"index":0,"id":"call_…","type":"function",
//                                      "function":{"name":"f","arguments":""}}]}}
//   data: {... "delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\": "}}]}}
//   data: {... "delta":{},"finish_reason":"tool_calls","logprobs":...}
//   data: {"choices":[],"usage":{...}}                        with include_usage
//   data: [DONE]
// With include_usage every other chunk carries "usage": null. Logprobs of a
// streamed reply arrive with the finishing chunk.
//
// response_format json_object / json_schema: the schema is shown to the model
// the way the official encoder shows a response format; the reply is then
// validated (a JSON object / any JSON value; the schema itself is not
// enforced). An invalid reply is answered with 422 invalid_json_output
// (streaming: an error frame instead of the finishing chunk). There is no
// grammar-constrained decoding.
#pragma once

#include <nlohmann/json.hpp>

#include "server/reply_writer.h"

namespace dsv4::server {

expected<ChatRequest> parse_openai_chat(const nlohmann::ordered_json& body);
expected<PreparedRequest, ApiError> prepare_openai_chat(const nlohmann::ordered_json& body, const ServeContext& ctx);

// Shared with the Responses adapter: tool_choice and response_format values.
expected<ToolChoice> parse_openai_tool_choice(const nlohmann::ordered_json* v, bool responses_shape);
// Thinking controls common to OpenAI-style requests: reasoning_effort (a
// string), thinking {"type"}, think (bool).
Status read_openai_thinking(const nlohmann::ordered_json& body, ThinkingControl& t);

}  // namespace dsv4::server
