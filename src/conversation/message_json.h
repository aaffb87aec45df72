// Typed chat messages back to OpenAI-style JSON (the inverse of
// from_openai_json in chat/chat_message.h), and the history entry of a
// generated reply. Used to store conversations (conversation_file.h) and by
// anything that echoes messages to clients.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_message.h"
#include "chat/dsml_parser.h"

namespace dsv4 {

// One message as a JSON object with only the fields that carry information:
// role, content (string, or an array of {"type", "text"} parts), and when set
// reasoning_content, tool_calls ([{"id", "type": "function", "function":
// {"name", "arguments"}}], arguments as the stored text), tool_call_id, tools
// ([{"type": "function", "function": ...}]), response_format, task, wo_eos.
// from_openai_json(messages_to_openai_json(m)) == m for every message.
nlohmann::ordered_json message_to_openai_json(const ChatMessage& m);
nlohmann::ordered_json messages_to_openai_json(const std::vector<ChatMessage>& messages);

// "action", "query", ... ("" for NONE): the official `task` strings.
const char* chat_task_name(ChatTask task);

// The assistant message a parsed completion becomes in the history: content,
// reasoning (only when there was any) and tool calls.
ChatMessage assistant_message_from(const ParsedMessage& parsed);

}  // namespace dsv4
