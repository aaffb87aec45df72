#include "server/openai_responses.h"

#include "chat/json_limits.h"
#include "server/json_util.h"
#include "server/openai_chat.h"
#include "server/sse.h"

namespace dsv4::server {

namespace {

// Text of a message's content (string or parts).
expected<ChatContent> item_content(const ordered_json& v, const std::string& where) {
  if (v.is_string()) return ChatContent::from_text(v.get<std::string>());
  if (!v.is_array()) return make_error("'%s' must be a string or an array of content parts", where.c_str());
  ChatContent c;
  c.is_list = true;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) return make_error("'%s' must be an object", w.c_str());
    JsonFields f(v[i], w);
    DSV4_TRY_ASSIGN(auto type, f.string("type"));
    if (!type) return make_error("'%s.type' is required", w.c_str());
    if (*type == "input_text" || *type == "output_text" || *type == "text") {
      DSV4_TRY_ASSIGN(auto text, f.string("text"));
      c.parts.push_back(ChatContentPart{"text", text.value_or("")});
    } else if (*type == "refusal") {
      DSV4_TRY_ASSIGN(auto text, f.string("refusal"));
      c.parts.push_back(ChatContentPart{"text", text.value_or("")});
    } else {
      c.parts.push_back(ChatContentPart{*type, ""});
    }
  }
  return c;
}

expected<std::string> reasoning_text(const ordered_json& item, const std::string& where) {
  JsonFields f(item, where);
  std::string out;
  DSV4_TRY_ASSIGN(const ordered_json* content, f.array("content"));
  DSV4_TRY_ASSIGN(const ordered_json* summary, f.array("summary"));
  for (const ordered_json* list : {content, summary}) {
    if (!list || list->empty()) continue;
    for (const auto& part : *list)
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
    if (!out.empty()) break;
  }
  return out;
}

Status messages_from_input(const ordered_json& input, std::vector<ChatMessage>& out) {
  if (input.is_string()) {
    ChatMessage m;
    m.role = ChatRole::USER;
    m.content = ChatContent::from_text(input.get<std::string>());
    out.push_back(std::move(m));
    return {};
  }
  if (!input.is_array()) return make_error("'input' must be a string or an array of items");
  std::string pending_reasoning;
  bool assistant_open = false;  // the last message is an assistant turn that calls may join
  auto open_assistant = [&]() -> ChatMessage& {
    if (!assistant_open) {
      ChatMessage a;
      a.role = ChatRole::ASSISTANT;
      out.push_back(std::move(a));
      assistant_open = true;
    }
    ChatMessage& a = out.back();
    if (!pending_reasoning.empty()) {
      a.reasoning_content = a.reasoning_content.value_or("") + pending_reasoning;
      pending_reasoning.clear();
    }
    return a;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string where = "input[" + std::to_string(i) + "]";
    const ordered_json& item = input[i];
    if (!item.is_object()) return make_error("'%s' must be an object", where.c_str());
    JsonFields f(item, where);
    DSV4_TRY_ASSIGN(auto type, f.string("type"));
    DSV4_TRY_ASSIGN(auto role, f.string("role"));
    const std::string t = type.value_or(role ? "message" : "");
    if (t == "message") {
      if (!role) return make_error("'%s.role' is required", where.c_str());
      const ordered_json* content = f.get("content");
      ChatContent c;
      if (content) {
        DSV4_TRY_ASSIGN(c, item_content(*content, where + ".content"));
      }
      if (*role == "assistant") {
        assistant_open = false;  // a new assistant message starts a new turn
        ChatMessage& a = open_assistant();
        a.content = ChatContent::from_text(c.flattened());
        continue;
      }
      ChatMessage m;
      if (*role == "user")
        m.role = ChatRole::USER;
      else if (*role == "system" || *role == "developer")
        m.role = ChatRole::SYSTEM;
      else
        return make_error("'%s.role' must be user, assistant, system or developer", where.c_str());
      m.content = m.role == ChatRole::SYSTEM ? ChatContent::from_text(c.flattened()) : std::move(c);
      out.push_back(std::move(m));
      assistant_open = false;
    } else if (t == "function_call") {
      DSV4_TRY_ASSIGN(auto call_id, f.string("call_id"));
      DSV4_TRY_ASSIGN(auto name, f.string("name"));
      DSV4_TRY_ASSIGN(auto arguments, f.string("arguments"));
      if (!call_id || !name) return make_error("'%s' needs string 'call_id' and 'name'", where.c_str());
      // Kept as text, but rendering parses it (render_official): it obeys the limit of any JSON text read here.
      if (arguments) {
        if (auto depth = check_json_text_depth(*arguments); !depth)
          return make_error("'%s.arguments': %s", where.c_str(), depth.error().message.c_str());
      }
      open_assistant().tool_calls.push_back(ChatToolCall{*call_id, *name, arguments.value_or("{}")});
    } else if (t == "function_call_output") {
      DSV4_TRY_ASSIGN(auto call_id, f.string("call_id"));
      if (!call_id) return make_error("'%s.call_id' is required", where.c_str());
      ChatMessage m;
      m.role = ChatRole::TOOL;
      m.tool_call_id = *call_id;
      if (const ordered_json* output = f.get("output")) {
        DSV4_TRY_ASSIGN(m.content, item_content(*output, where + ".output"));
      }
      out.push_back(std::move(m));
      assistant_open = false;
    } else if (t == "reasoning") {
      DSV4_TRY_ASSIGN(std::string text, reasoning_text(item, where));
      pending_reasoning += text;
    } else {
      return make_error(
          "'%s.type' \"%s\" is not supported (message, function_call, function_call_output and "
          "reasoning items are)",
          where.c_str(), t.c_str());
    }
  }
  return {};
}

Status read_tools(const JsonFields& f, ChatRequest& r) {
  DSV4_TRY_ASSIGN(const ordered_json* tools, f.array("tools"));
  if (!tools) return {};
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const ordered_json& t = (*tools)[i];
    if (!t.is_object()) return make_error("'%s' must be an object", where.c_str());
    JsonFields tf(t, where);
    DSV4_TRY_ASSIGN(auto type, tf.string("type"));
    if (type != "function") continue;  // web_search, file_search, custom, ...: not callable here
    DSV4_TRY_ASSIGN(auto name, tf.string("name"));
    if (!name || name->empty()) return make_error("'%s.name' is required", where.c_str());
    DSV4_TRY_ASSIGN(auto description, tf.string("description"));
    DSV4_TRY_ASSIGN(const ordered_json* params, tf.object("parameters"));
    ChatTool tool;
    tool.name = *name;
    tool.function = ordered_json::object();
    tool.function["name"] = *name;
    if (description) tool.function["description"] = *description;
    tool.function["parameters"] = params ? *params : ordered_json{{"type", "object"}};
    r.tools.push_back(std::move(tool));
  }
  return {};
}

Status read_text_format(const JsonFields& f, ChatRequest& r) {
  DSV4_TRY_ASSIGN(const ordered_json* text, f.object("text"));
  if (!text) return {};
  DSV4_TRY_ASSIGN(const ordered_json* format, JsonFields(*text, "text").object("format"));
  if (!format) return {};
  JsonFields ff(*format, "text.format");
  DSV4_TRY_ASSIGN(auto type, ff.string("type"));
  if (!type || *type == "text") return {};
  if (*type == "json_object") {
    r.response_format = ResponseFormat::JSON_OBJECT;
    return {};
  }
  if (*type == "json_schema") {
    DSV4_TRY_ASSIGN(const ordered_json* schema, ff.object("schema"));
    r.response_format = ResponseFormat::JSON_SCHEMA;
    r.json_schema = schema ? *schema : ordered_json::object();
    return {};
  }
  return make_error("'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"");
}

}  // namespace

expected<ChatRequest> parse_openai_responses(const ordered_json& body) {
  // A body from parse_json_text is within the limit already; this guards one built otherwise, before anything
  // below copies or walks it (nlohmann's copy, == and dump() recurse once per level; json_limits.h).
  DSV4_TRY(check_json_depth(body));
  if (!body.is_object()) return make_error("the request body must be a JSON object");
  JsonFields f(body);
  ChatRequest r;
  DSV4_TRY_ASSIGN(auto model, f.string("model"));
  r.model = model.value_or("");
  DSV4_TRY_ASSIGN(auto previous, f.string("previous_response_id"));
  if (previous)
    return make_error(
        "'previous_response_id' is not supported: this server stores no responses; send the whole "
        "conversation as input");
  DSV4_TRY_ASSIGN(auto instructions, f.string("instructions"));
  if (instructions && !instructions->empty()) {
    ChatMessage sys;
    sys.role = ChatRole::SYSTEM;
    sys.content = ChatContent::from_text(*instructions);
    r.messages.push_back(std::move(sys));
  }
  const ordered_json* input = f.get("input");
  if (!input) return make_error("'input' is required");
  DSV4_TRY(messages_from_input(*input, r.messages));
  if (input->is_array() && input->empty()) return make_error("'input' must not be empty");
  DSV4_TRY(read_tools(f, r));
  DSV4_TRY_ASSIGN(r.tool_choice, parse_openai_tool_choice(f.get("tool_choice"), true));
  DSV4_TRY_ASSIGN(auto parallel, f.boolean("parallel_tool_calls"));
  r.parallel_tool_calls = parallel.value_or(true);
  DSV4_TRY_ASSIGN(auto stream, f.boolean("stream"));
  r.stream = stream.value_or(false);
  DSV4_TRY_ASSIGN(auto temperature, f.number("temperature", 0, 2));
  DSV4_TRY_ASSIGN(auto top_p, f.number("top_p", 0, 1));
  DSV4_TRY_ASSIGN(auto max_output, f.integer("max_output_tokens", 1, INT32_MAX));
  if (temperature) r.temperature = static_cast<float>(*temperature);
  if (top_p) r.top_p = static_cast<float>(*top_p);
  if (max_output) r.max_tokens = static_cast<int>(*max_output);
  DSV4_TRY(read_openai_thinking(body, r.thinking));
  DSV4_TRY_ASSIGN(const ordered_json* reasoning, f.object("reasoning"));
  if (reasoning) {
    DSV4_TRY_ASSIGN(auto effort, JsonFields(*reasoning, "reasoning").string("effort"));
    if (effort) {
      auto level = thinking_level_from_string(*effort);
      if (!level) return make_error("'reasoning.effort': %s", level.error().message.c_str());
      r.thinking.level = *level;
    }
  }
  DSV4_TRY(read_text_format(f, r));
  return r;
}

namespace {

class ResponsesWriter final : public ReplyWriter {
 public:
  ResponsesWriter(std::string model, ordered_json echo)
      : id_("resp_" + random_hex(12)), created_(unix_time()), model_(std::move(model)), echo_(std::move(echo)) {}

  std::string stream_begin() override {
    ordered_json r = response("in_progress", ordered_json::array(), nullptr);
    std::string out = event("response.created", ordered_json{{"response", r}});  // numbered first
    out += event("response.in_progress", ordered_json{{"response", r}});
    return out;
  }

  std::string stream_events(const std::vector<OutEvent>& events) override {
    std::string out;
    for (const auto& e : events) {
      switch (e.kind) {
        case OutKind::REASONING:
          if (e.text.empty()) break;
          if (open_ != Item::REASONING) {
            out += close();
            out += open(Item::REASONING, "rs_", "", "");
          }
          text_ += e.text;
          out += event(
              "response.reasoning_text.delta",
              ordered_json{
                  {"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"delta", e.text}});
          break;
        case OutKind::CONTENT:
          if (e.text.empty()) break;
          if (open_ != Item::MESSAGE) {
            out += close();
            out += open(Item::MESSAGE, "msg_", "", "");
          }
          text_ += e.text;
          out += event("response.output_text.delta", ordered_json{{"item_id", item_id_},
                                                                  {"output_index", output_index_},
                                                                  {"content_index", 0},
                                                                  {"delta", e.text},
                                                                  {"logprobs", ordered_json::array()}});
          break;
        case OutKind::CALL_START:
          out += close();
          out += open(Item::CALL, "fc_", e.id, e.text);
          break;
        case OutKind::CALL_ARGS:
          if (open_ != Item::CALL || e.text.empty()) break;
          text_ += e.text;
          out += event("response.function_call_arguments.delta",
                       ordered_json{{"item_id", item_id_}, {"output_index", output_index_}, {"delta", e.text}});
          break;
        case OutKind::CALL_END:
        case OutKind::CALLS_ABORTED: out += close(); break;
      }
    }
    return out;
  }

  std::string stream_end(const FinalReply& r) override {
    std::string out = close();
    const bool incomplete = r.finish == FinishReason::LENGTH;
    ordered_json resp = response(incomplete ? "incomplete" : "completed", items_, &r);
    out +=
        event(incomplete ? "response.incomplete" : "response.completed", ordered_json{{"response", std::move(resp)}});
    return out;
  }

  std::string stream_error(const ApiError& e) override {
    std::string out = close();
    ordered_json resp = response("failed", items_, nullptr);
    const ordered_json err = error_json(e, ErrorShape::OPENAI)["error"];
    resp["error"] =
        ordered_json{{"code", err["code"].is_null() ? ordered_json(err["type"]) : err["code"]}, {"message", e.message}};
    out += event("response.failed", ordered_json{{"response", std::move(resp)}});
    return out;
  }

  std::string stream_keepalive() override { return sse_comment("keepalive"); }

  ordered_json body(const FinalReply& r) override {
    ordered_json items = ordered_json::array();
    if (!r.reasoning.empty()) items.push_back(reasoning_item("rs_" + random_hex(12), r.reasoning));
    if (!r.content.empty() || r.calls.empty()) items.push_back(message_item("msg_" + random_hex(12), r.content));
    for (const auto& c : r.calls)
      items.push_back(call_item("fc_" + random_hex(12), c.id, c.name, c.arguments, "completed"));
    return response(r.finish == FinishReason::LENGTH ? "incomplete" : "completed", std::move(items), &r);
  }

 private:
  enum class Item { NONE, REASONING, MESSAGE, CALL };

  static ordered_json reasoning_item(const std::string& id, const std::string& text) {
    return ordered_json{{"id", id},
                        {"type", "reasoning"},
                        {"summary", ordered_json::array()},
                        {"content", ordered_json::array({ordered_json{{"type", "reasoning_text"}, {"text", text}}})}};
  }
  static ordered_json output_text(const std::string& text) {
    return ordered_json{{"type", "output_text"},
                        {"text", text},
                        {"annotations", ordered_json::array()},
                        {"logprobs", ordered_json::array()}};
  }
  static ordered_json message_item(const std::string& id, const std::string& text) {
    return ordered_json{{"id", id},
                        {"type", "message"},
                        {"status", "completed"},
                        {"role", "assistant"},
                        {"content", ordered_json::array({output_text(text)})}};
  }
  static ordered_json call_item(const std::string& id, const std::string& call_id, const std::string& name,
                                const std::string& arguments, const char* status) {
    return ordered_json{{"id", id},     {"type", "function_call"}, {"status", status}, {"call_id", call_id},
                        {"name", name}, {"arguments", arguments}};
  }

  std::string event(const char* type, ordered_json payload) {
    ordered_json j = ordered_json::object();
    j["type"] = type;
    j["sequence_number"] = seq_++;
    for (auto& [k, v] : payload.items()) j[k] = std::move(v);
    return sse_event(type, j);
  }

  std::string open(Item kind, const char* id_prefix, const std::string& call_id, const std::string& name) {
    open_ = kind;
    item_id_ = id_prefix + random_hex(12);
    text_.clear();
    call_id_ = call_id;
    name_ = name;
    std::string out;
    switch (kind) {
      case Item::NONE: break;
      case Item::REASONING: {
        ordered_json item = reasoning_item(item_id_, "");
        item["content"] = ordered_json::array();
        out += event("response.output_item.added",
                     ordered_json{{"output_index", output_index_}, {"item", std::move(item)}});
        out += event("response.content_part.added",
                     ordered_json{{"item_id", item_id_},
                                  {"output_index", output_index_},
                                  {"content_index", 0},
                                  {"part", ordered_json{{"type", "reasoning_text"}, {"text", ""}}}});
        break;
      }
      case Item::MESSAGE: {
        ordered_json item = message_item(item_id_, "");
        item["status"] = "in_progress";
        item["content"] = ordered_json::array();
        out += event("response.output_item.added",
                     ordered_json{{"output_index", output_index_}, {"item", std::move(item)}});
        out += event("response.content_part.added", ordered_json{{"item_id", item_id_},
                                                                 {"output_index", output_index_},
                                                                 {"content_index", 0},
                                                                 {"part", output_text("")}});
        break;
      }
      case Item::CALL:
        out += event("response.output_item.added",
                     ordered_json{{"output_index", output_index_},
                                  {"item", call_item(item_id_, call_id_, name_, "", "in_progress")}});
        break;
    }
    return out;
  }

  std::string close() {
    std::string out;
    ordered_json item;
    switch (open_) {
      case Item::NONE: return out;
      case Item::REASONING:
        out +=
            event("response.reasoning_text.done",
                  ordered_json{
                      {"item_id", item_id_}, {"output_index", output_index_}, {"content_index", 0}, {"text", text_}});
        out += event("response.content_part.done",
                     ordered_json{{"item_id", item_id_},
                                  {"output_index", output_index_},
                                  {"content_index", 0},
                                  {"part", ordered_json{{"type", "reasoning_text"}, {"text", text_}}}});
        item = reasoning_item(item_id_, text_);
        break;
      case Item::MESSAGE:
        out += event("response.output_text.done", ordered_json{{"item_id", item_id_},
                                                               {"output_index", output_index_},
                                                               {"content_index", 0},
                                                               {"text", text_},
                                                               {"logprobs", ordered_json::array()}});
        out += event("response.content_part.done", ordered_json{{"item_id", item_id_},
                                                                {"output_index", output_index_},
                                                                {"content_index", 0},
                                                                {"part", output_text(text_)}});
        item = message_item(item_id_, text_);
        break;
      case Item::CALL:
        out +=
            event("response.function_call_arguments.done",
                  ordered_json{
                      {"item_id", item_id_}, {"output_index", output_index_}, {"name", name_}, {"arguments", text_}});
        item = call_item(item_id_, call_id_, name_, text_, "completed");
        break;
    }
    out += event("response.output_item.done", ordered_json{{"output_index", output_index_}, {"item", item}});
    items_.push_back(std::move(item));
    ++output_index_;
    open_ = Item::NONE;
    return out;
  }

  ordered_json response(const char* status, ordered_json output, const FinalReply* r) const {
    ordered_json j = ordered_json::object();
    j["id"] = id_;
    j["object"] = "response";
    j["created_at"] = created_;
    j["status"] = status;
    j["error"] = nullptr;
    j["incomplete_details"] = std::string_view(status) == "incomplete" ? ordered_json{{"reason", "max_output_tokens"}}
                                                                       : ordered_json(nullptr);
    j["model"] = model_;
    j["output"] = std::move(output);
    for (const auto& [k, v] : echo_.items()) j[k] = v;
    if (r) {
      j["usage"] = ordered_json{{"input_tokens", r->prompt_tokens},
                                {"input_tokens_details", ordered_json{{"cached_tokens", r->cached_tokens}}},
                                {"output_tokens", r->completion_tokens},
                                {"output_tokens_details", ordered_json{{"reasoning_tokens", r->reasoning_tokens}}},
                                {"total_tokens", r->prompt_tokens + r->completion_tokens}};
    } else {
      j["usage"] = nullptr;
    }
    return j;
  }

  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const ordered_json echo_;  // request settings echoed in every response object
  uint64_t seq_ = 0;
  Item open_ = Item::NONE;
  size_t output_index_ = 0;
  std::string item_id_, text_, call_id_, name_;
  ordered_json items_ = ordered_json::array();
};

// The request settings a response object repeats.
ordered_json echo_settings(const ordered_json& body) {
  ordered_json e = ordered_json::object();
  auto copy = [&](const char* key, ordered_json fallback) {
    auto it = body.find(key);
    e[key] = it != body.end() && !it->is_null() ? *it : std::move(fallback);
  };
  copy("instructions", nullptr);
  copy("max_output_tokens", nullptr);
  copy("parallel_tool_calls", true);
  e["previous_response_id"] = nullptr;
  copy("reasoning", ordered_json{{"effort", nullptr}, {"summary", nullptr}});
  e["store"] = false;
  copy("temperature", 1.0);
  copy("text", ordered_json{{"format", ordered_json{{"type", "text"}}}});
  copy("tool_choice", "auto");
  copy("tools", ordered_json::array());
  copy("top_p", 1.0);
  e["truncation"] = "disabled";
  copy("metadata", ordered_json::object());
  return e;
}

}  // namespace

expected<PreparedRequest, ApiError> prepare_openai_responses(const ordered_json& body, const ServeContext& ctx) {
  auto req = parse_openai_responses(body);
  if (!req) return unexpected(invalid_request(req.error()));
  const std::string model = req->model.empty() ? ctx.models.served_id : req->model;
  const bool stream = req->stream;
  auto chat = prepare_chat(std::move(*req), ctx);
  if (!chat) return unexpected(chat.error());
  PreparedRequest p;
  p.job = std::move(chat->job);
  p.stream = stream;
  p.policy = ReplyAssembler::Policy{"call_", chat->allow_tool_calls, chat->parallel_tool_calls};
  p.response_format = chat->response_format;
  p.prompt_tokens = chat->prompt_tokens;
  p.writer = std::make_unique<ResponsesWriter>(model, echo_settings(body));
  return p;
}

}  // namespace dsv4::server
