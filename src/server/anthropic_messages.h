// POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages).
//
// Request fields: model, max_tokens (required, >= 1; not for count_tokens),
// messages (user/assistant; content a string or blocks: text, image and
// document (shown to the model as "[Unsupported <type>]"), tool_use,
// tool_result, thinking, redacted_thinking (dropped)), system (string or
// text blocks, joined with "\n\n"), tools (custom tools {name, description,
// input_schema}; server tools are ignored), tool_choice {"type": "auto" |
// "any" | "tool" (+ name) | "none", disable_parallel_tool_use},
// stop_sequences, stream, temperature, top_p, top_k, thinking {"type":
// "enabled" (+ budget_tokens) | "adaptive" | "disabled"}, output_config.effort,
// and (extensions) seed and ignore_eos.
//
// Mapping to the chat model: a user message's tool_result blocks become tool
// messages and its other blocks a user message, in block order; an
// assistant's thinking blocks become its reasoning, text blocks its content,
// tool_use blocks its tool calls (input as JSON text). Tools are rendered as
// OpenAI-style function schemas {name, description, parameters}.
// budget_tokens is enforced: after that many reasoning tokens </think> is
// forced (job_runner.h).
//
// Reply: a "message" object, or the event stream
//   event: message_start        {"message": {..., "content": [], "usage": {...}}}
//   event: ping
//   event: content_block_start  {"index": i, "content_block": {"type": "thinking"|"text"|"tool_use", ...}}
//   event: content_block_delta  thinking_delta | signature_delta | text_delta | input_json_delta
//   event: content_block_stop
//   event: message_delta        {"delta": {"stop_reason", "stop_sequence"}, "usage": {...}}
//   event: message_stop
// stop_reason: end_turn, stop_sequence, max_tokens, tool_use. Usage follows
// Anthropic's split: input_tokens are the prompt tokens that were prefilled,
// cache_read_input_tokens those reused from the live session. A thinking
// block's signature is "dsv4-" + SHA-256 of its text (not verified on input).
#pragma once

#include <nlohmann/json.hpp>

#include "server/reply_writer.h"

namespace dsv4::server {

// `count_only`: /count_tokens (max_tokens not required).
expected<ChatRequest> parse_anthropic_messages(const nlohmann::ordered_json& body, bool count_only);
expected<PreparedRequest, ApiError> prepare_anthropic_messages(const nlohmann::ordered_json& body,
                                                               const ServeContext& ctx);
// {"input_tokens": N}
expected<nlohmann::ordered_json, ApiError> anthropic_count_tokens(const nlohmann::ordered_json& body,
                                                                  const ServeContext& ctx);

}  // namespace dsv4::server
