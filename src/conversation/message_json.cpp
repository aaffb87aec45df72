#include "conversation/message_json.h"

namespace dsv4 {

using ordered_json = nlohmann::ordered_json;

const char* chat_task_name(ChatTask task) {
  switch (task) {
    case ChatTask::NONE: return "";
    case ChatTask::ACTION: return "action";
    case ChatTask::QUERY: return "query";
    case ChatTask::AUTHORITY: return "authority";
    case ChatTask::DOMAIN: return "domain";
    case ChatTask::TITLE: return "title";
    case ChatTask::READ_URL: return "read_url";
  }
  DSV4_UNREACHABLE();
}

namespace {

ordered_json content_to_json(const ChatContent& c) {
  if (!c.is_list) return c.text;
  ordered_json parts = ordered_json::array();
  for (const auto& p : c.parts) {
    ordered_json part = ordered_json::object();
    part["type"] = p.type;
    // from_openai_json reads "text" only for text parts; other parts carry just their type.
    if (p.type == "text") part["text"] = p.text;
    parts.push_back(std::move(part));
  }
  return parts;
}

}  // namespace

// Tool schemas and response formats are copied here, and the result is dumped
// (both recurse once per level); they come from from_openai_json, whose input
// nests at most k_max_json_depth levels (chat_message.h), which bounds both.
ordered_json message_to_openai_json(const ChatMessage& m) {
  ordered_json j = ordered_json::object();
  j["role"] = chat_role_name(m.role);
  j["content"] = content_to_json(m.content);
  if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
  if (!m.tool_calls.empty()) {
    ordered_json calls = ordered_json::array();
    for (const auto& tc : m.tool_calls) {
      ordered_json call = ordered_json::object();
      if (!tc.id.empty()) call["id"] = tc.id;
      call["type"] = "function";
      call["function"] = ordered_json{{"name", tc.name}, {"arguments", tc.arguments}};
      calls.push_back(std::move(call));
    }
    j["tool_calls"] = std::move(calls);
  }
  if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
  if (!m.tools.empty()) {
    ordered_json tools = ordered_json::array();
    for (const auto& t : m.tools) tools.push_back(ordered_json{{"type", "function"}, {"function", t.function}});
    j["tools"] = std::move(tools);
  }
  if (m.response_format) j["response_format"] = *m.response_format;
  if (m.task != ChatTask::NONE) j["task"] = chat_task_name(m.task);
  if (m.wo_eos) j["wo_eos"] = true;
  return j;
}

ordered_json messages_to_openai_json(const std::vector<ChatMessage>& messages) {
  ordered_json a = ordered_json::array();
  for (const auto& m : messages) a.push_back(message_to_openai_json(m));
  return a;
}

ChatMessage assistant_message_from(const ParsedMessage& parsed) {
  ChatMessage m;
  m.role = ChatRole::ASSISTANT;
  m.content = ChatContent::from_text(parsed.content);
  if (!parsed.reasoning_content.empty()) m.reasoning_content = parsed.reasoning_content;
  m.tool_calls = parsed.tool_calls;
  return m;
}

}  // namespace dsv4
