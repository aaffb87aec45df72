// Typed chat messages: what the HTTP layer and the CLI hand to the renderer
// after parsing JSON at the edge (design.md §2). The fields mirror the
// OpenAI-style message objects DeepSeek's official encoder consumes
// (formats.md §4.2); `from_openai_json` converts such a JSON array, returning
// an Error for malformed input instead of throwing.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/json_limits.h"  // parse_json_text, k_max_json_depth
#include "core/error.h"

namespace dsv4 {

enum class ChatRole {
  SYSTEM,
  USER,
  ASSISTANT,
  TOOL,             // a tool result; merged into a user turn when rendered
  DEVELOPER,        // DeepSeek-internal: rendered as a user turn with tools
  LATEST_REMINDER,  // DeepSeek-internal: <｜latest_reminder｜> + content
};

// Quick-instruction task of a message (official encoder; DeepSeek-internal).
enum class ChatTask { NONE, ACTION, QUERY, AUTHORITY, DOMAIN, TITLE, READ_URL };

enum class ThinkingMode { CHAT, THINKING };

// `reasoning_effort`: NONE and HIGH render identically; MAX adds the
// Think-Max prefix in thinking mode (formats.md §4.3).
enum class ReasoningEffort { NONE, HIGH, MAX };

const char* chat_role_name(ChatRole role);
const char* thinking_mode_name(ThinkingMode mode);
expected<ChatRole> chat_role_from_string(std::string_view s);
expected<ThinkingMode> thinking_mode_from_string(std::string_view s);        // "chat" | "thinking"
expected<ReasoningEffort> reasoning_effort_from_string(std::string_view s);  // "none" | "high" | "max"

// One part of a list-valued content. Only "text" parts carry text; any other
// type renders as "[Unsupported <type>]" (the official rule for tool results).
struct ChatContentPart {
  std::string type = "text";
  std::string text;
};

// Message content: plain text (a JSON string; null or absent is ""), or a list
// of parts. A list renders as its parts joined with "\n\n".
struct ChatContent {
  bool is_list = false;
  std::string text;                    // when !is_list
  std::vector<ChatContentPart> parts;  // when is_list

  static ChatContent from_text(std::string t) { return ChatContent{false, std::move(t), {}}; }
  // The content flattened to text: the text, or the parts joined with "\n\n".
  std::string flattened() const;
};

struct ChatToolCall {
  std::string id;         // client-chosen call id ("" if absent)
  std::string name;       // function name
  std::string arguments;  // the arguments JSON text exactly as the client gave it
};

// A tool offered to the model: the OpenAI `function` object (name,
// description, parameters, ...) kept as ordered JSON so it re-serialises in the
// client's key order.
struct ChatTool {
  std::string name;
  nlohmann::ordered_json function;
};

struct ChatMessage {
  ChatRole role = ChatRole::USER;
  ChatContent content;
  std::optional<std::string> reasoning_content;           // assistant
  std::vector<ChatToolCall> tool_calls;                   // assistant
  std::string tool_call_id;                               // tool
  std::vector<ChatTool> tools;                            // system / developer
  std::optional<nlohmann::ordered_json> response_format;  // system / developer
  ChatTask task = ChatTask::NONE;
  bool wo_eos = false;  // assistant: omit the closing EOS (official `wo_eos`)
  // Assistant, exact replay (formats.md §4.6): the DSML block exactly as the
  // model sampled it, from the whitespace before its opener to the end of its
  // closing tag (ParsedMessage::raw_dsml). When set it is rendered verbatim in
  // place of the canonical DSML of `tool_calls`, so a conversation sent back
  // renders to the bytes the model produced. Only a server's own tool-call
  // memory sets it; it is never read from client JSON, because its DSML
  // markers become control pieces.
  std::optional<std::string> raw_dsml;
};

// Converts an OpenAI-style JSON array of message objects. Accepted fields:
// role (system|user|assistant|tool|developer|latest_reminder), content
// (string | null | array of {"type":..., "text":...}), reasoning_content
// (string | null), tool_calls ([{"id", "type":"function", "function":{"name",
// "arguments"}}], assistant only; arguments given as a JSON object instead of
// a string are kept as their Python-json text; arguments given as a string
// must not nest deeper than k_max_json_depth, whether or not they parse),
// tool_call_id (string), tools (system/developer only), response_format,
// task, wo_eos. Unknown fields are ignored. Errors name the offending message
// index and field.
//
// Precondition of both converters: the value nests at most k_max_json_depth
// levels (it came from parse_json_text, or check_json_depth passed): tool
// schemas and response formats are copied, and nlohmann copies recursively.
expected<std::vector<ChatMessage>> from_openai_json(const nlohmann::ordered_json& messages);

// Converts an OpenAI `tools` array ([{"type":"function","function":{...}}]).
expected<std::vector<ChatTool>> tools_from_openai_json(const nlohmann::ordered_json& tools);

}  // namespace dsv4
