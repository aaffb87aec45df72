// POST /v1/responses (OpenAI Responses API, as Codex CLI and the SDKs use it).
//
// Request fields: model, input (a string, or items), instructions (a leading
// system message), tools (function tools {type: "function", name,
// description, parameters}; other tool types are ignored), tool_choice
// ("auto" | "none" | "required" | {"type": "function", "name"}),
// parallel_tool_calls, stream, temperature, top_p, max_output_tokens,
// reasoning.effort (also reasoning_effort / thinking / think as in chat),
// text.format {"type": "text" | "json_object" | "json_schema"}. Nothing is
// stored: previous_response_id is refused (send the whole input); store,
// include, metadata, prompt_cache_key and user are accepted and ignored.
//
// Input items, in order:
//   message {role: user|assistant|system|developer, content: string or parts
//     (input_text / output_text / text; other parts are "[Unsupported <type>]")}
//     (developer is treated as system, as OpenAI defines it);
//   function_call {call_id, name, arguments}: a tool call of the assistant
//     turn in progress (the preceding assistant message, or a new one);
//   function_call_output {call_id, output}: a tool message;
//   reasoning {content: [reasoning_text], summary: [summary_text]}: the
//     reasoning of the next assistant turn (content preferred over summary).
//
// Reply: a "response" object, or the event stream (every event carries
// "type" and "sequence_number"):
//   response.created, response.in_progress
//   reasoning: response.output_item.added {type: reasoning}, response.content_part.added
//     {reasoning_text}, response.reasoning_text.delta..., response.reasoning_text.done,
//     response.content_part.done, response.output_item.done
//   text: response.output_item.added {type: message}, response.content_part.added
//     {output_text}, response.output_text.delta..., response.output_text.done,
//     response.content_part.done, response.output_item.done
//   calls: response.output_item.added {type: function_call}, response.function_call_arguments.delta...,
//     response.function_call_arguments.done, response.output_item.done
//   response.completed (status "incomplete" + response.incomplete for max_output_tokens)
//   errors after the stream started: response.failed {response: {status: "failed", error}}
// Reasoning is reported as reasoning_text content (DeepSeek's reasoning is the
// raw chain of thought, not a summary).
#pragma once

#include <nlohmann/json.hpp>

#include "server/reply_writer.h"

namespace dsv4::server {

expected<ChatRequest> parse_openai_responses(const nlohmann::ordered_json& body);
expected<PreparedRequest, ApiError> prepare_openai_responses(const nlohmann::ordered_json& body,
                                                             const ServeContext& ctx);

}  // namespace dsv4::server
