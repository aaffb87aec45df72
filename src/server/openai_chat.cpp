#include "server/openai_chat.h"

#include "chat/json_limits.h"
#include "server/json_util.h"
#include "server/openai_common.h"
#include "server/sse.h"

namespace dsv4::server {

expected<ToolChoice> parse_openai_tool_choice(const ordered_json* v, bool responses_shape) {
  ToolChoice c;
  if (!v) return c;
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    if (s == "auto")
      c.mode = ToolChoiceMode::AUTO;
    else if (s == "none")
      c.mode = ToolChoiceMode::NONE;
    else if (s == "required")
      c.mode = ToolChoiceMode::REQUIRED;
    else
      return make_error("'tool_choice' must be \"auto\", \"none\", \"required\" or a function, got \"%s\"", s.c_str());
    return c;
  }
  if (!v->is_object()) return make_error("'tool_choice' must be a string or an object, got %s", v->type_name());
  JsonFields f(*v, "tool_choice");
  DSV4_TRY_ASSIGN(auto type, f.string("type"));
  if (type != "function")
    return make_error("'tool_choice.type' must be \"function\" (got \"%s\")", type.value_or("").c_str());
  std::optional<std::string> name;
  if (responses_shape) {
    // Responses: {"type": "function", "name": "f"}
    DSV4_TRY_ASSIGN(name, f.string("name"));
  } else {
    // Chat: {"type": "function", "function": {"name": "f"}}
    DSV4_TRY_ASSIGN(const ordered_json* fn, f.object("function"));
    if (fn) {
      DSV4_TRY_ASSIGN(name, JsonFields(*fn, "tool_choice.function").string("name"));
    }
  }
  if (!name || name->empty()) return make_error("'tool_choice' names no function");
  c.mode = ToolChoiceMode::FUNCTION;
  c.name = *name;
  return c;
}

Status read_openai_thinking(const ordered_json& body, ThinkingControl& t) {
  JsonFields f(body);
  DSV4_TRY_ASSIGN(auto effort, f.string("reasoning_effort"));
  if (effort) {
    auto level = thinking_level_from_string(*effort);
    if (!level) return make_error("'reasoning_effort': %s", level.error().message.c_str());
    t.level = *level;
  }
  DSV4_TRY_ASSIGN(auto think, f.boolean("think"));
  if (think) t.enabled = *think;
  DSV4_TRY_ASSIGN(const ordered_json* thinking, f.object("thinking"));
  if (thinking) {
    DSV4_TRY_ASSIGN(auto type, JsonFields(*thinking, "thinking").string("type"));
    if (type == "enabled")
      t.enabled = true;
    else if (type == "disabled")
      t.enabled = false;
    else
      return make_error("'thinking.type' must be \"enabled\" or \"disabled\"");
  }
  return {};
}

namespace {

Status read_response_format(const ordered_json& body, ChatRequest& r) {
  DSV4_TRY_ASSIGN(const ordered_json* rf, JsonFields(body).object("response_format"));
  if (!rf) return {};
  JsonFields f(*rf, "response_format");
  DSV4_TRY_ASSIGN(auto type, f.string("type"));
  if (!type || *type == "text") return {};
  if (*type == "json_object") {
    r.response_format = ResponseFormat::JSON_OBJECT;
    return {};
  }
  if (*type == "json_schema") {
    DSV4_TRY_ASSIGN(const ordered_json* js, f.object("json_schema"));
    if (!js) return make_error("'response_format.json_schema' is required for type json_schema");
    DSV4_TRY_ASSIGN(const ordered_json* schema, JsonFields(*js, "response_format.json_schema").object("schema"));
    r.response_format = ResponseFormat::JSON_SCHEMA;
    r.json_schema = schema ? *schema : ordered_json::object();
    return {};
  }
  return make_error("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
}

}  // namespace

expected<ChatRequest> parse_openai_chat(const ordered_json& body) {
  // A body from parse_json_text is within the limit already; this guards one built otherwise, before anything
  // below copies or walks it (nlohmann's copy, == and dump() recurse once per level; json_limits.h).
  DSV4_TRY(check_json_depth(body));
  if (!body.is_object()) return make_error("the request body must be a JSON object");
  JsonFields f(body);
  ChatRequest r;
  DSV4_TRY_ASSIGN(auto model, f.string("model"));
  r.model = model.value_or("");
  DSV4_TRY_ASSIGN(const ordered_json* messages, f.array("messages"));
  if (!messages) return make_error("'messages' is required");
  DSV4_TRY_ASSIGN(r.messages, from_openai_json(*messages));
  DSV4_TRY_ASSIGN(const ordered_json* tools, f.array("tools"));
  if (tools) {
    DSV4_TRY_ASSIGN(r.tools, tools_from_openai_json(*tools));
  }
  DSV4_TRY_ASSIGN(r.tool_choice, parse_openai_tool_choice(f.get("tool_choice"), false));
  DSV4_TRY_ASSIGN(auto parallel, f.boolean("parallel_tool_calls"));
  r.parallel_tool_calls = parallel.value_or(true);
  DSV4_TRY_ASSIGN(auto stream, f.boolean("stream"));
  r.stream = stream.value_or(false);
  DSV4_TRY_ASSIGN(const ordered_json* so, f.object("stream_options"));
  if (so) {
    DSV4_TRY_ASSIGN(auto iu, JsonFields(*so, "stream_options").boolean("include_usage"));
    r.include_usage = iu.value_or(false);
  }
  DSV4_TRY(read_openai_sampling(body, r));
  DSV4_TRY_ASSIGN(auto logprobs, f.boolean("logprobs"));
  DSV4_TRY_ASSIGN(auto top_logprobs, f.integer("top_logprobs", 0, 20));
  if (top_logprobs && !logprobs.value_or(false)) return make_error("'top_logprobs' requires 'logprobs': true");
  if (logprobs.value_or(false)) r.logprobs = static_cast<int>(top_logprobs.value_or(0));
  DSV4_TRY(read_openai_thinking(body, r.thinking));
  DSV4_TRY(read_response_format(body, r));
  DSV4_TRY_ASSIGN(const ordered_json* bias, f.object("logit_bias"));
  if (bias && !bias->empty()) return make_error("'logit_bias' is not supported");
  return r;
}

namespace {

class OpenAIChatWriter final : public ReplyWriter {
 public:
  OpenAIChatWriter(std::string model, bool include_usage, bool logprobs, const Tokenizer& tok)
      : id_("chatcmpl-" + random_hex(12)),
        created_(unix_time()),
        model_(std::move(model)),
        include_usage_(include_usage),
        logprobs_(logprobs),
        tok_(tok) {}

  std::string stream_begin() override {
    return sse_data(chunk(ordered_json{{"role", "assistant"}, {"content", ""}}, nullptr));
  }

  std::string stream_events(const std::vector<OutEvent>& events) override {
    std::string out;
    // Consecutive deltas of one kind (and call) go out as one chunk.
    for (size_t i = 0; i < events.size();) {
      const OutEvent& e = events[i];
      size_t j = i + 1;
      std::string text = e.text;
      if (e.kind == OutKind::CONTENT || e.kind == OutKind::REASONING || e.kind == OutKind::CALL_ARGS) {
        while (j < events.size() && events[j].kind == e.kind && events[j].index == e.index) text += events[j++].text;
      }
      switch (e.kind) {
        case OutKind::CONTENT: out += sse_data(chunk(ordered_json{{"content", text}}, nullptr)); break;
        case OutKind::REASONING: out += sse_data(chunk(ordered_json{{"reasoning_content", text}}, nullptr)); break;
        case OutKind::CALL_START: {
          ordered_json call{{"index", e.index},
                            {"id", e.id},
                            {"type", "function"},
                            {"function", ordered_json{{"name", e.text}, {"arguments", ""}}}};
          out += sse_data(chunk(ordered_json{{"tool_calls", ordered_json::array({call})}}, nullptr));
          break;
        }
        case OutKind::CALL_ARGS: {
          ordered_json call{{"index", e.index}, {"function", ordered_json{{"arguments", text}}}};
          out += sse_data(chunk(ordered_json{{"tool_calls", ordered_json::array({call})}}, nullptr));
          break;
        }
        case OutKind::CALL_END:
        case OutKind::CALLS_ABORTED: break;  // nothing to say in this dialect
      }
      i = j;
    }
    return out;
  }

  std::string stream_end(const FinalReply& r) override {
    ordered_json last = chunk(ordered_json::object(), openai_finish_reason(r.finish));
    if (logprobs_) last["choices"][0]["logprobs"] = openai_chat_logprobs_json(r.logprobs, tok_);
    std::string out = sse_data(last);
    if (include_usage_) {
      ordered_json u = base("chat.completion.chunk");
      u["choices"] = ordered_json::array();
      u["usage"] = openai_usage_json(r);
      out += sse_data(u);
    }
    return out + sse_done();
  }

  std::string stream_error(const ApiError& e) override {
    return sse_data(error_json(e, ErrorShape::OPENAI)) + sse_done();
  }
  std::string stream_keepalive() override { return sse_comment("keepalive"); }

  ordered_json body(const FinalReply& r) override {
    ordered_json msg = ordered_json::object();
    msg["role"] = "assistant";
    msg["content"] = r.content.empty() && !r.calls.empty() ? ordered_json(nullptr) : ordered_json(r.content);
    if (!r.reasoning.empty()) msg["reasoning_content"] = r.reasoning;
    if (!r.calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (const auto& c : r.calls)
        calls.push_back(ordered_json{{"id", c.id},
                                     {"type", "function"},
                                     {"function", ordered_json{{"name", c.name}, {"arguments", c.arguments}}}});
      msg["tool_calls"] = std::move(calls);
    }
    ordered_json choice = ordered_json::object();
    choice["index"] = 0;
    choice["message"] = std::move(msg);
    choice["logprobs"] = logprobs_ ? openai_chat_logprobs_json(r.logprobs, tok_) : ordered_json(nullptr);
    choice["finish_reason"] = openai_finish_reason(r.finish);
    ordered_json j = base("chat.completion");
    j["choices"] = ordered_json::array({std::move(choice)});
    j["usage"] = openai_usage_json(r);
    return j;
  }

 private:
  ordered_json base(const char* object) const {
    ordered_json j = ordered_json::object();
    j["id"] = id_;
    j["object"] = object;
    j["created"] = created_;
    j["model"] = model_;
    j["system_fingerprint"] = "dsv4";
    return j;
  }

  ordered_json chunk(ordered_json delta, const char* finish) const {
    ordered_json choice = ordered_json::object();
    choice["index"] = 0;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = nullptr;
    choice["finish_reason"] = finish ? ordered_json(finish) : ordered_json(nullptr);
    ordered_json j = base("chat.completion.chunk");
    j["choices"] = ordered_json::array({std::move(choice)});
    if (include_usage_) j["usage"] = nullptr;
    return j;
  }

  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const bool include_usage_;
  const bool logprobs_;
  const Tokenizer& tok_;
};

}  // namespace

expected<PreparedRequest, ApiError> prepare_openai_chat(const ordered_json& body, const ServeContext& ctx) {
  auto req = parse_openai_chat(body);
  if (!req) return unexpected(invalid_request(req.error()));
  const std::string model = req->model.empty() ? ctx.models.served_id : req->model;
  const bool stream = req->stream, include_usage = req->include_usage, logprobs = req->logprobs >= 0;
  const int n = req->n;
  auto chat = prepare_chat(std::move(*req), ctx);
  if (!chat) return unexpected(chat.error());
  PreparedRequest p;
  p.job = std::move(chat->job);
  p.stream = stream;
  p.n = n;
  p.policy = ReplyAssembler::Policy{"call_", chat->allow_tool_calls, chat->parallel_tool_calls};
  p.response_format = chat->response_format;
  p.prompt_tokens = chat->prompt_tokens;
  p.writer = std::make_unique<OpenAIChatWriter>(model, include_usage, logprobs, ctx.tok);
  return p;
}

}  // namespace dsv4::server
