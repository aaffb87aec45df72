// The official DSV4 chat encoding (DeepSeek's `encode_messages`,
// formats.md §4.2 - §4.4), producing a RenderedPrompt whose control pieces are
// exactly the special-token strings the renderer inserts. Text that came from
// clients (message content, tool names, argument values, tool results, tool
// schemas) is always a non-control piece, even when it contains a marker
// string, so a prompt cannot forge `<｜Assistant｜>` or DSML (formats.md §3.5).
// Adjacent non-control text is merged into one piece, so tokenizing piece by
// piece equals tokenizing the official prompt string with specials split out.
//
// Deviations from the official Python, all for inputs it rejects or crashes on:
//   * list-valued content of system/assistant/developer/latest_reminder
//     messages is flattened (text parts joined with "\n\n", other parts as
//     "[Unsupported <type>]"); a list-valued user content contributes one
//     content block per part, which renders the same way;
//   * tool-call arguments that parse as JSON but not as an object are emitted
//     like unparseable ones: one string parameter `arguments` holding the text
//     (ds4's rule);
//   * JSON numbers are read by nlohmann: integers beyond 64 bits become floats,
//     and NaN/Infinity literals are not accepted (Python accepts both).
//
// Extension (not in the official encoder): an assistant message carrying
// `raw_dsml` (exact replay, chat_message.h) renders that block verbatim in
// place of the canonical DSML of its tool calls.
#pragma once

#include <vector>

#include "chat/chat_message.h"
#include "core/error.h"
#include "core/text_piece.h"

namespace dsv4 {

struct RenderOptions {
  ThinkingMode thinking_mode = ThinkingMode::CHAT;
  ReasoningEffort reasoning_effort = ReasoningEffort::NONE;
  // Official `drop_thinking`: drop reasoning (and developer messages) before
  // the last user turn in thinking mode. Forced off when any tools are present.
  bool drop_thinking = true;
  // Request-level tools (an API request's top-level `tools`): they are added to
  // the first message's tools if it is a system message; otherwise an empty
  // system message carrying them is put in front.
  std::vector<ChatTool> tools;
};

// Renders the whole conversation: BOS, then every message, then the
// transition into the next assistant turn when the last message is a user or
// developer message. Fails only on messages the official encoder rejects
// (a developer message with empty content).
expected<RenderedPrompt> render_official(const std::vector<ChatMessage>& messages, const RenderOptions& options);

}  // namespace dsv4
