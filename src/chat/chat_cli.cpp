#include "chat/chat_cli.h"

namespace dsv4 {

expected<RenderInput> render_input_from_json_text(std::string_view text) {
  DSV4_TRY_ASSIGN(const auto doc, parse_json_text(text));
  RenderInput in;
  const nlohmann::ordered_json* messages = &doc;
  if (doc.is_object()) {
    auto it = doc.find("messages");
    if (it == doc.end()) return make_error("the JSON object has no \"messages\" array");
    messages = &*it;
    if (auto t = doc.find("tools"); t != doc.end() && !t->is_null()) {
      DSV4_TRY_ASSIGN(in.tools, tools_from_openai_json(*t));
    }
  }
  DSV4_TRY_ASSIGN(in.messages, from_openai_json(*messages));
  return in;
}

expected<std::vector<ChatTool>> tools_from_json_text(std::string_view text) {
  DSV4_TRY_ASSIGN(const auto doc, parse_json_text(text));
  if (doc.is_object()) {
    auto it = doc.find("tools");
    if (it == doc.end()) return make_error("the JSON object has no \"tools\" array");
    return tools_from_openai_json(*it);
  }
  return tools_from_openai_json(doc);
}

nlohmann::ordered_json parsed_message_to_json(const ParsedMessage& m) {
  nlohmann::ordered_json j;
  j["role"] = "assistant";
  j["content"] = m.content;
  j["reasoning_content"] = m.reasoning_content;
  j["tool_calls"] = nlohmann::ordered_json::array();
  for (const auto& tc : m.tool_calls) {
    nlohmann::ordered_json call;
    call["type"] = "function";
    call["function"]["name"] = tc.name;
    call["function"]["arguments"] = tc.arguments;
    j["tool_calls"].push_back(std::move(call));
  }
  return j;
}

}  // namespace dsv4
