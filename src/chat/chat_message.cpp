#include "chat/chat_message.h"

#include <string>

#include "chat/py_json.h"

namespace dsv4 {

using ordered_json = nlohmann::ordered_json;

const char* chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::SYSTEM: return "system";
    case ChatRole::USER: return "user";
    case ChatRole::ASSISTANT: return "assistant";
    case ChatRole::TOOL: return "tool";
    case ChatRole::DEVELOPER: return "developer";
    case ChatRole::LATEST_REMINDER: return "latest_reminder";
  }
  DSV4_UNREACHABLE();
}

const char* thinking_mode_name(ThinkingMode mode) {
  switch (mode) {
    case ThinkingMode::CHAT: return "chat";
    case ThinkingMode::THINKING: return "thinking";
  }
  DSV4_UNREACHABLE();
}

expected<ChatRole> chat_role_from_string(std::string_view s) {
  for (ChatRole r : {ChatRole::SYSTEM, ChatRole::USER, ChatRole::ASSISTANT, ChatRole::TOOL, ChatRole::DEVELOPER,
                     ChatRole::LATEST_REMINDER})
    if (s == chat_role_name(r)) return r;
  return make_error("unknown role '%.*s' (expected system, user, assistant, tool, developer or latest_reminder)",
                    static_cast<int>(s.size()), s.data());
}

expected<ThinkingMode> thinking_mode_from_string(std::string_view s) {
  if (s == "chat") return ThinkingMode::CHAT;
  if (s == "thinking") return ThinkingMode::THINKING;
  return make_error("unknown thinking mode '%.*s' (expected chat or thinking)", static_cast<int>(s.size()), s.data());
}

expected<ReasoningEffort> reasoning_effort_from_string(std::string_view s) {
  if (s == "none") return ReasoningEffort::NONE;
  if (s == "high") return ReasoningEffort::HIGH;
  if (s == "max") return ReasoningEffort::MAX;
  return make_error("unknown reasoning effort '%.*s' (expected none, high or max)", static_cast<int>(s.size()),
                    s.data());
}

std::string ChatContent::flattened() const {
  if (!is_list) return text;
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += "\n\n";
    if (parts[i].type == "text")
      out += parts[i].text;
    else
      out += "[Unsupported " + parts[i].type + "]";
  }
  return out;
}

namespace {

// Optional string field: absent or null -> `fallback`.
expected<std::string> get_string(const ordered_json& obj, const char* key, const std::string& where,
                                 std::string fallback = "") {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return make_error("%s: '%s' must be a string, got %s", where.c_str(), key, it->type_name());
  return it->get<std::string>();
}

expected<ChatContent> content_from_json(const ordered_json& v, const std::string& where) {
  if (v.is_null()) return ChatContent{};
  if (v.is_string()) return ChatContent::from_text(v.get<std::string>());
  if (!v.is_array())
    return make_error("%s: 'content' must be a string, null or an array of parts, got %s", where.c_str(),
                      v.type_name());
  ChatContent c;
  c.is_list = true;
  for (size_t i = 0; i < v.size(); ++i) {
    const auto& part = v[i];
    const std::string pw = where + ": content[" + std::to_string(i) + "]";
    if (part.is_string()) {  // a bare string part is a text part
      c.parts.push_back(ChatContentPart{"text", part.get<std::string>()});
      continue;
    }
    if (!part.is_object()) return make_error("%s must be an object, got %s", pw.c_str(), part.type_name());
    ChatContentPart p;
    DSV4_TRY_ASSIGN(p.type, get_string(part, "type", pw, "text"));
    if (p.type == "text") {
      auto it = part.find("text");
      if (it == part.end() || !it->is_string()) return make_error("%s: a text part needs a string 'text'", pw.c_str());
      p.text = it->get<std::string>();
    }
    c.parts.push_back(std::move(p));
  }
  return c;
}

expected<ChatToolCall> tool_call_from_json(const ordered_json& v, const std::string& where) {
  if (!v.is_object()) return make_error("%s must be an object, got %s", where.c_str(), v.type_name());
  ChatToolCall tc;
  DSV4_TRY_ASSIGN(tc.id, get_string(v, "id", where));
  DSV4_TRY_ASSIGN(const std::string type, get_string(v, "type", where, "function"));
  if (type != "function") return make_error("%s: unsupported tool call type '%s'", where.c_str(), type.c_str());
  auto fn = v.find("function");
  if (fn == v.end() || !fn->is_object()) return make_error("%s: missing object 'function'", where.c_str());
  const std::string fw = where + ".function";
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string()) return make_error("%s: missing string 'name'", fw.c_str());
  tc.name = name->get<std::string>();
  auto args = fn->find("arguments");
  if (args == fn->end() || args->is_null()) {
    tc.arguments = "{}";
  } else if (args->is_string()) {
    tc.arguments = args->get<std::string>();
    // Kept as text, but rendering parses it (render_official): it obeys the limit of any JSON text read here.
    if (auto depth = check_json_text_depth(tc.arguments); !depth)
      return make_error("%s: 'arguments': %s", fw.c_str(), depth.error().message.c_str());
  } else if (args->is_object()) {
    tc.arguments = py_json_dumps(*args);
  } else {
    return make_error("%s: 'arguments' must be a JSON string (or object), got %s", fw.c_str(), args->type_name());
  }
  return tc;
}

expected<ChatTool> tool_from_json(const ordered_json& v, const std::string& where) {
  if (!v.is_object()) return make_error("%s must be an object, got %s", where.c_str(), v.type_name());
  DSV4_TRY_ASSIGN(const std::string type, get_string(v, "type", where, "function"));
  if (type != "function") return make_error("%s: unsupported tool type '%s'", where.c_str(), type.c_str());
  auto fn = v.find("function");
  if (fn == v.end() || !fn->is_object()) return make_error("%s: missing object 'function'", where.c_str());
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string()) return make_error("%s.function: missing string 'name'", where.c_str());
  return ChatTool{name->get<std::string>(), *fn};
}

expected<ChatTask> task_from_string(std::string_view s, const std::string& where) {
  if (s == "action") return ChatTask::ACTION;
  if (s == "query") return ChatTask::QUERY;
  if (s == "authority") return ChatTask::AUTHORITY;
  if (s == "domain") return ChatTask::DOMAIN;
  if (s == "title") return ChatTask::TITLE;
  if (s == "read_url") return ChatTask::READ_URL;
  return make_error("%s: unknown task '%.*s'", where.c_str(), static_cast<int>(s.size()), s.data());
}

expected<ChatMessage> message_from_json(const ordered_json& v, const std::string& where) {
  if (!v.is_object()) return make_error("%s must be an object, got %s", where.c_str(), v.type_name());
  ChatMessage m;
  auto role = v.find("role");
  if (role == v.end() || !role->is_string()) return make_error("%s: missing string 'role'", where.c_str());
  auto r = chat_role_from_string(role->get_ref<const std::string&>());
  if (!r) return r.error().with_context(where);
  m.role = *r;

  if (auto it = v.find("content"); it != v.end()) {
    DSV4_TRY_ASSIGN(m.content, content_from_json(*it, where));
  }
  if (auto it = v.find("reasoning_content"); it != v.end() && !it->is_null()) {
    if (!it->is_string()) return make_error("%s: 'reasoning_content' must be a string", where.c_str());
    m.reasoning_content = it->get<std::string>();
  }
  if (auto it = v.find("tool_calls"); it != v.end() && !it->is_null()) {
    if (!it->is_array()) return make_error("%s: 'tool_calls' must be an array", where.c_str());
    if (!it->empty() && m.role != ChatRole::ASSISTANT)
      return make_error("%s: 'tool_calls' is only valid on assistant messages", where.c_str());
    for (size_t i = 0; i < it->size(); ++i) {
      DSV4_TRY_ASSIGN(auto tc, tool_call_from_json((*it)[i], where + ".tool_calls[" + std::to_string(i) + "]"));
      m.tool_calls.push_back(std::move(tc));
    }
  }
  DSV4_TRY_ASSIGN(m.tool_call_id, get_string(v, "tool_call_id", where));
  if (auto it = v.find("tools"); it != v.end() && !it->is_null()) {
    if (!it->is_array()) return make_error("%s: 'tools' must be an array", where.c_str());
    if (!it->empty() && m.role != ChatRole::SYSTEM && m.role != ChatRole::DEVELOPER)
      return make_error("%s: 'tools' is only valid on system and developer messages", where.c_str());
    for (size_t i = 0; i < it->size(); ++i) {
      DSV4_TRY_ASSIGN(auto t, tool_from_json((*it)[i], where + ".tools[" + std::to_string(i) + "]"));
      m.tools.push_back(std::move(t));
    }
  }
  if (auto it = v.find("response_format"); it != v.end() && !it->is_null()) {
    if (m.role != ChatRole::SYSTEM && m.role != ChatRole::DEVELOPER)
      return make_error("%s: 'response_format' is only valid on system and developer messages", where.c_str());
    m.response_format = *it;
  }
  if (auto it = v.find("task"); it != v.end() && !it->is_null()) {
    if (!it->is_string()) return make_error("%s: 'task' must be a string", where.c_str());
    DSV4_TRY_ASSIGN(m.task, task_from_string(it->get_ref<const std::string&>(), where));
  }
  if (auto it = v.find("wo_eos"); it != v.end() && !it->is_null()) {
    if (!it->is_boolean()) return make_error("%s: 'wo_eos' must be a boolean", where.c_str());
    m.wo_eos = it->get<bool>();
  }
  return m;
}

}  // namespace

expected<std::vector<ChatMessage>> from_openai_json(const ordered_json& messages) {
  if (!messages.is_array()) return make_error("messages must be a JSON array, got %s", messages.type_name());
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    DSV4_TRY_ASSIGN(auto m, message_from_json(messages[i], "messages[" + std::to_string(i) + "]"));
    out.push_back(std::move(m));
  }
  return out;
}

expected<std::vector<ChatTool>> tools_from_openai_json(const ordered_json& tools) {
  if (!tools.is_array()) return make_error("tools must be a JSON array, got %s", tools.type_name());
  std::vector<ChatTool> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    DSV4_TRY_ASSIGN(auto t, tool_from_json(tools[i], "tools[" + std::to_string(i) + "]"));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace dsv4
