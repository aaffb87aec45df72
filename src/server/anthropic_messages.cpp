#include "server/anthropic_messages.h"

#include "chat/json_limits.h"
#include "core/hash.h"
#include "server/json_util.h"
#include "server/sse.h"

namespace dsv4::server {

namespace {

// Text of a string-or-blocks value; non-text blocks become unsupported parts.
expected<ChatContent> blocks_content(const ordered_json& v, const std::string& where) {
  if (v.is_string()) return ChatContent::from_text(v.get<std::string>());
  if (!v.is_array()) return make_error("'%s' must be a string or an array of content blocks", where.c_str());
  ChatContent c;
  c.is_list = true;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    if (!v[i].is_object()) return make_error("'%s' must be an object", w.c_str());
    JsonFields f(v[i], w);
    DSV4_TRY_ASSIGN(auto type, f.string("type"));
    if (!type) return make_error("'%s.type' is required", w.c_str());
    if (*type == "text") {
      DSV4_TRY_ASSIGN(auto text, f.string("text"));
      c.parts.push_back(ChatContentPart{"text", text.value_or("")});
    } else {
      c.parts.push_back(ChatContentPart{*type, ""});
    }
  }
  return c;
}

expected<ChatTool> tool_from_anthropic(const ordered_json& t, const std::string& where, bool& skip) {
  skip = false;
  if (!t.is_object()) return make_error("'%s' must be an object", where.c_str());
  JsonFields f(t, where);
  DSV4_TRY_ASSIGN(auto type, f.string("type"));
  if (type && *type != "custom") {
    skip = true;  // a server tool (web_search_..., bash_..., ...): nothing the model can call here
    return ChatTool{};
  }
  DSV4_TRY_ASSIGN(auto name, f.string("name"));
  if (!name || name->empty()) return make_error("'%s.name' is required", where.c_str());
  DSV4_TRY_ASSIGN(auto description, f.string("description"));
  DSV4_TRY_ASSIGN(const ordered_json* schema, f.object("input_schema"));
  ChatTool tool;
  tool.name = *name;
  tool.function = ordered_json::object();
  tool.function["name"] = *name;
  if (description) tool.function["description"] = *description;
  tool.function["parameters"] = schema ? *schema : ordered_json{{"type", "object"}};
  return tool;
}

Status messages_from_anthropic(const ordered_json& msgs, std::vector<ChatMessage>& out) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const ordered_json& m = msgs[i];
    if (!m.is_object()) return make_error("'%s' must be an object", where.c_str());
    JsonFields f(m, where);
    DSV4_TRY_ASSIGN(auto role, f.string("role"));
    if (role != "user" && role != "assistant")
      return make_error("'%s.role' must be \"user\" or \"assistant\"", where.c_str());
    const ordered_json* content = f.get("content");
    if (!content) return make_error("'%s.content' is required", where.c_str());
    const bool user = *role == "user";
    if (content->is_string()) {
      ChatMessage cm;
      cm.role = user ? ChatRole::USER : ChatRole::ASSISTANT;
      cm.content = ChatContent::from_text(content->get<std::string>());
      out.push_back(std::move(cm));
      continue;
    }
    if (!content->is_array()) return make_error("'%s.content' must be a string or an array of blocks", where.c_str());
    if (user) {
      ChatMessage pending;
      pending.role = ChatRole::USER;
      pending.content.is_list = true;
      auto flush = [&] {
        if (!pending.content.parts.empty()) out.push_back(pending);
        pending.content.parts.clear();
      };
      for (size_t b = 0; b < content->size(); ++b) {
        const std::string w = where + ".content[" + std::to_string(b) + "]";
        const ordered_json& blk = (*content)[b];
        if (!blk.is_object()) return make_error("'%s' must be an object", w.c_str());
        JsonFields bf(blk, w);
        DSV4_TRY_ASSIGN(auto type, bf.string("type"));
        if (!type) return make_error("'%s.type' is required", w.c_str());
        if (*type == "text") {
          DSV4_TRY_ASSIGN(auto text, bf.string("text"));
          pending.content.parts.push_back(ChatContentPart{"text", text.value_or("")});
        } else if (*type == "tool_result") {
          flush();
          ChatMessage tool;
          tool.role = ChatRole::TOOL;
          DSV4_TRY_ASSIGN(auto id, bf.string("tool_use_id"));
          if (!id) return make_error("'%s.tool_use_id' is required", w.c_str());
          tool.tool_call_id = *id;
          if (const ordered_json* c = bf.get("content")) {
            DSV4_TRY_ASSIGN(tool.content, blocks_content(*c, w + ".content"));
          }
          out.push_back(std::move(tool));
        } else {
          pending.content.parts.push_back(ChatContentPart{*type, ""});  // image, document, ...
        }
      }
      flush();
      continue;
    }
    ChatMessage a;
    a.role = ChatRole::ASSISTANT;
    std::string text, reasoning;
    for (size_t b = 0; b < content->size(); ++b) {
      const std::string w = where + ".content[" + std::to_string(b) + "]";
      const ordered_json& blk = (*content)[b];
      if (!blk.is_object()) return make_error("'%s' must be an object", w.c_str());
      JsonFields bf(blk, w);
      DSV4_TRY_ASSIGN(auto type, bf.string("type"));
      if (!type) return make_error("'%s.type' is required", w.c_str());
      if (*type == "text") {
        DSV4_TRY_ASSIGN(auto t, bf.string("text"));
        text += t.value_or("");
      } else if (*type == "thinking") {
        DSV4_TRY_ASSIGN(auto t, bf.string("thinking"));
        reasoning += t.value_or("");
      } else if (*type == "tool_use") {
        DSV4_TRY_ASSIGN(auto id, bf.string("id"));
        DSV4_TRY_ASSIGN(auto name, bf.string("name"));
        if (!id || !name) return make_error("'%s' needs string 'id' and 'name'", w.c_str());
        const ordered_json* input = bf.get("input");
        a.tool_calls.push_back(ChatToolCall{*id, *name, input ? json_dump(*input) : "{}"});
      } else if (*type == "redacted_thinking") {
        // Opaque to us; nothing to render.
      } else {
        return make_error("'%s.type' \"%s\" is not supported in assistant messages", w.c_str(), type->c_str());
      }
    }
    a.content = ChatContent::from_text(text);
    if (!reasoning.empty()) a.reasoning_content = reasoning;
    out.push_back(std::move(a));
  }
  return {};
}

Status read_tool_choice(const JsonFields& f, ChatRequest& r) {
  DSV4_TRY_ASSIGN(const ordered_json* tc, f.object("tool_choice"));
  if (!tc) return {};
  JsonFields t(*tc, "tool_choice");
  DSV4_TRY_ASSIGN(auto type, t.string("type"));
  DSV4_TRY_ASSIGN(auto no_parallel, t.boolean("disable_parallel_tool_use"));
  if (no_parallel) r.parallel_tool_calls = !*no_parallel;
  if (type == "auto") {
    r.tool_choice.mode = ToolChoiceMode::AUTO;
  } else if (type == "any") {
    r.tool_choice.mode = ToolChoiceMode::REQUIRED;
  } else if (type == "none") {
    r.tool_choice.mode = ToolChoiceMode::NONE;
  } else if (type == "tool") {
    DSV4_TRY_ASSIGN(auto name, t.string("name"));
    if (!name || name->empty()) return make_error("'tool_choice.name' is required for type \"tool\"");
    r.tool_choice.mode = ToolChoiceMode::FUNCTION;
    r.tool_choice.name = *name;
  } else {
    return make_error("'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"");
  }
  return {};
}

Status read_thinking(const JsonFields& f, ChatRequest& r) {
  DSV4_TRY_ASSIGN(const ordered_json* th, f.object("thinking"));
  if (th) {
    JsonFields t(*th, "thinking");
    DSV4_TRY_ASSIGN(auto type, t.string("type"));
    if (type == "enabled") {
      DSV4_TRY_ASSIGN(auto budget, t.integer("budget_tokens", 1, INT32_MAX));
      r.thinking.enabled = true;
      if (budget) r.thinking.budget_tokens = static_cast<int>(*budget);
    } else if (type == "adaptive") {
      r.thinking.enabled = true;
    } else if (type == "disabled") {
      r.thinking.enabled = false;
    } else {
      return make_error("'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\"");
    }
  }
  DSV4_TRY_ASSIGN(const ordered_json* oc, f.object("output_config"));
  if (oc) {
    DSV4_TRY_ASSIGN(auto effort, JsonFields(*oc, "output_config").string("effort"));
    if (effort) {
      auto level = thinking_level_from_string(*effort);
      if (!level) return make_error("'output_config.effort': %s", level.error().message.c_str());
      r.thinking.level = *level;
    }
  }
  return {};
}

}  // namespace

expected<ChatRequest> parse_anthropic_messages(const ordered_json& body, bool count_only) {
  // A body from parse_json_text is within the limit already; this guards one built otherwise, before anything
  // below copies or walks it (nlohmann's copy, == and dump() recurse once per level; json_limits.h).
  DSV4_TRY(check_json_depth(body));
  if (!body.is_object()) return make_error("the request body must be a JSON object");
  JsonFields f(body);
  ChatRequest r;
  DSV4_TRY_ASSIGN(auto model, f.string("model"));
  r.model = model.value_or("");
  DSV4_TRY_ASSIGN(auto max_tokens, f.integer("max_tokens", 1, INT32_MAX));
  if (!count_only && !max_tokens) return make_error("'max_tokens' is required");
  if (max_tokens) r.max_tokens = static_cast<int>(*max_tokens);
  if (const ordered_json* sys = f.get("system")) {
    DSV4_TRY_ASSIGN(ChatContent c, blocks_content(*sys, "system"));
    ChatMessage m;
    m.role = ChatRole::SYSTEM;
    m.content = ChatContent::from_text(c.flattened());
    r.messages.push_back(std::move(m));
  }
  DSV4_TRY_ASSIGN(const ordered_json* messages, f.array("messages"));
  if (!messages) return make_error("'messages' is required");
  if (messages->empty()) return make_error("'messages' must not be empty");
  DSV4_TRY(messages_from_anthropic(*messages, r.messages));
  DSV4_TRY_ASSIGN(const ordered_json* tools, f.array("tools"));
  if (tools) {
    for (size_t i = 0; i < tools->size(); ++i) {
      bool skip = false;
      DSV4_TRY_ASSIGN(ChatTool t, tool_from_anthropic((*tools)[i], "tools[" + std::to_string(i) + "]", skip));
      if (!skip) r.tools.push_back(std::move(t));
    }
  }
  DSV4_TRY(read_tool_choice(f, r));
  DSV4_TRY_ASSIGN(r.stop, f.string_list("stop_sequences", 16));
  DSV4_TRY_ASSIGN(auto stream, f.boolean("stream"));
  r.stream = stream.value_or(false);
  DSV4_TRY_ASSIGN(auto temperature, f.number("temperature", 0, 2));
  DSV4_TRY_ASSIGN(auto top_p, f.number("top_p", 0, 1));
  DSV4_TRY_ASSIGN(auto top_k, f.integer("top_k", 0, 1 << 30));
  if (temperature) r.temperature = static_cast<float>(*temperature);
  if (top_p) r.top_p = static_cast<float>(*top_p);
  if (top_k) r.top_k = static_cast<int>(*top_k);
  DSV4_TRY_ASSIGN(auto seed, f.integer("seed", INT64_MIN, INT64_MAX));  // extension: reproducible sampling
  if (seed) r.seed = static_cast<uint64_t>(*seed);
  DSV4_TRY_ASSIGN(auto ignore_eos, f.boolean("ignore_eos"));  // extension: generate past EOS
  r.ignore_eos = ignore_eos.value_or(false);
  DSV4_TRY(read_thinking(f, r));
  return r;
}

namespace {

const char* stop_reason(const FinalReply& r) {
  switch (r.finish) {
    case FinishReason::STOP: return r.stop_string.empty() ? "end_turn" : "stop_sequence";
    case FinishReason::LENGTH: return "max_tokens";
    case FinishReason::TOOL_CALLS: return "tool_use";
    case FinishReason::CANCELLED: return "end_turn";
  }
  DSV4_UNREACHABLE();
}

ordered_json usage_json(const FinalReply& r) {
  return ordered_json{{"input_tokens", r.prompt_tokens - std::min(r.prompt_tokens, r.cached_tokens)},
                      {"cache_creation_input_tokens", 0},
                      {"cache_read_input_tokens", r.cached_tokens},
                      {"output_tokens", r.completion_tokens}};
}

std::string signature_of(const std::string& thinking) { return "dsv4-" + sha256_hex(thinking.data(), thinking.size()); }

// A call's input object. The arguments are the parser's (dsml_parser.h: valid
// JSON within k_max_json_depth); anything else is kept whole as a string.
ordered_json tool_input(const std::string& arguments) {
  auto j = parse_json_text(arguments);
  if (!j) return ordered_json{{"arguments", arguments}};
  if (!j->is_object()) return ordered_json{{"arguments", std::move(*j)}};
  return std::move(*j);
}

class AnthropicWriter final : public ReplyWriter {
 public:
  AnthropicWriter(std::string model, size_t prompt_tokens)
      : id_("msg_" + random_hex(12)), model_(std::move(model)), prompt_tokens_(prompt_tokens) {}

  std::string stream_begin() override {
    ordered_json msg = ordered_json::object();
    msg["id"] = id_;
    msg["type"] = "message";
    msg["role"] = "assistant";
    msg["model"] = model_;
    msg["content"] = ordered_json::array();
    msg["stop_reason"] = nullptr;
    msg["stop_sequence"] = nullptr;
    // The cached share is known only once the job runs; message_delta corrects it.
    msg["usage"] = ordered_json{{"input_tokens", prompt_tokens_},
                                {"cache_creation_input_tokens", 0},
                                {"cache_read_input_tokens", 0},
                                {"output_tokens", 0}};
    return sse_event("message_start", ordered_json{{"type", "message_start"}, {"message", std::move(msg)}}) +
           stream_keepalive();
  }

  std::string stream_events(const std::vector<OutEvent>& events) override {
    std::string out;
    for (const auto& e : events) {
      switch (e.kind) {
        case OutKind::REASONING:
          if (e.text.empty()) break;
          if (open_ != Block::THINKING) {
            out += close();
            out += start(Block::THINKING, ordered_json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
          }
          thinking_ += e.text;
          out += delta(ordered_json{{"type", "thinking_delta"}, {"thinking", e.text}});
          break;
        case OutKind::CONTENT:
          if (e.text.empty()) break;
          if (open_ != Block::TEXT) {
            out += close();
            out += start(Block::TEXT, ordered_json{{"type", "text"}, {"text", ""}});
          }
          out += delta(ordered_json{{"type", "text_delta"}, {"text", e.text}});
          break;
        case OutKind::CALL_START:
          out += close();
          out += start(
              Block::TOOL,
              ordered_json{{"type", "tool_use"}, {"id", e.id}, {"name", e.text}, {"input", ordered_json::object()}});
          break;
        case OutKind::CALL_ARGS:
          if (open_ == Block::TOOL && !e.text.empty())
            out += delta(ordered_json{{"type", "input_json_delta"}, {"partial_json", e.text}});
          break;
        case OutKind::CALL_END:
        case OutKind::CALLS_ABORTED: out += close(); break;
      }
    }
    return out;
  }

  std::string stream_end(const FinalReply& r) override {
    std::string out = close();
    ordered_json d{{"stop_reason", stop_reason(r)},
                   {"stop_sequence", r.stop_string.empty() ? ordered_json(nullptr) : ordered_json(r.stop_string)}};
    out += sse_event("message_delta",
                     ordered_json{{"type", "message_delta"}, {"delta", std::move(d)}, {"usage", usage_json(r)}});
    out += sse_event("message_stop", ordered_json{{"type", "message_stop"}});
    return out;
  }

  std::string stream_error(const ApiError& e) override {
    return sse_event("error", error_json(e, ErrorShape::ANTHROPIC));
  }
  std::string stream_keepalive() override { return sse_event("ping", ordered_json{{"type", "ping"}}); }

  ordered_json body(const FinalReply& r) override {
    ordered_json content = ordered_json::array();
    if (!r.reasoning.empty())
      content.push_back(
          ordered_json{{"type", "thinking"}, {"thinking", r.reasoning}, {"signature", signature_of(r.reasoning)}});
    if (!r.content.empty() || r.calls.empty()) content.push_back(ordered_json{{"type", "text"}, {"text", r.content}});
    for (const auto& c : r.calls)
      content.push_back(
          ordered_json{{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c.arguments)}});
    ordered_json j = ordered_json::object();
    j["id"] = id_;
    j["type"] = "message";
    j["role"] = "assistant";
    j["model"] = model_;
    j["content"] = std::move(content);
    j["stop_reason"] = stop_reason(r);
    j["stop_sequence"] = r.stop_string.empty() ? ordered_json(nullptr) : ordered_json(r.stop_string);
    j["usage"] = usage_json(r);
    return j;
  }

 private:
  enum class Block { NONE, THINKING, TEXT, TOOL };

  std::string start(Block kind, ordered_json block) {
    open_ = kind;
    index_ = next_index_++;
    if (kind == Block::THINKING) thinking_.clear();
    return sse_event(
        "content_block_start",
        ordered_json{{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }

  std::string delta(ordered_json d) const {
    return sse_event("content_block_delta",
                     ordered_json{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(d)}});
  }

  std::string close() {
    std::string out;
    switch (open_) {
      case Block::NONE: return out;
      case Block::THINKING:
        out += delta(ordered_json{{"type", "signature_delta"}, {"signature", signature_of(thinking_)}});
        break;
      case Block::TEXT:
      case Block::TOOL: break;
    }
    out += sse_event("content_block_stop", ordered_json{{"type", "content_block_stop"}, {"index", index_}});
    open_ = Block::NONE;
    return out;
  }

  const std::string id_;
  const std::string model_;
  const size_t prompt_tokens_;
  Block open_ = Block::NONE;
  size_t index_ = 0, next_index_ = 0;
  std::string thinking_;
};

}  // namespace

expected<PreparedRequest, ApiError> prepare_anthropic_messages(const ordered_json& body, const ServeContext& ctx) {
  auto req = parse_anthropic_messages(body, false);
  if (!req) return unexpected(invalid_request(req.error()));
  const std::string model = req->model.empty() ? ctx.models.served_id : req->model;
  const bool stream = req->stream;
  auto chat = prepare_chat(std::move(*req), ctx);
  if (!chat) return unexpected(chat.error());
  PreparedRequest p;
  p.job = std::move(chat->job);
  p.stream = stream;
  p.policy = ReplyAssembler::Policy{"toolu_", chat->allow_tool_calls, chat->parallel_tool_calls};
  p.prompt_tokens = chat->prompt_tokens;
  p.writer = std::make_unique<AnthropicWriter>(model, chat->prompt_tokens);
  return p;
}

expected<ordered_json, ApiError> anthropic_count_tokens(const ordered_json& body, const ServeContext& ctx) {
  auto req = parse_anthropic_messages(body, true);
  if (!req) return unexpected(invalid_request(req.error()));
  auto chat = prepare_chat(std::move(*req), ctx, /*check_context=*/false);
  if (!chat) return unexpected(chat.error());
  return ordered_json{{"input_tokens", chat->prompt_tokens}};
}

}  // namespace dsv4::server
