#include "server/chat_request.h"

#include <algorithm>

#include "chat/json_limits.h"
#include "chat/render_official.h"
#include "runtime/chat_prompt.h"
#include "server/json_util.h"

namespace dsv4::server {

using ordered_json = nlohmann::ordered_json;

std::optional<ModelCatalog::Alias> ModelCatalog::resolve(std::string_view name) const {
  if (name == served_id || name == k_alias_flash) return Alias::SERVED;
  if (name == k_alias_chat) return Alias::CHAT;
  if (name == k_alias_reasoner) return Alias::REASONER;
  for (const auto& a : aliases)
    if (name == a) return Alias::SERVED;
  return std::nullopt;
}

std::vector<std::string> ModelCatalog::ids() const {
  std::vector<std::string> out{served_id};
  for (std::string_view a : {k_alias_flash, k_alias_chat, k_alias_reasoner})
    if (std::find(out.begin(), out.end(), a) == out.end()) out.emplace_back(a);
  for (const auto& a : aliases)
    if (std::find(out.begin(), out.end(), a) == out.end()) out.push_back(a);
  return out;
}

expected<ModelCatalog::Alias, ApiError> resolve_model(const ModelCatalog& models, const std::string& model) {
  if (model.empty()) return ModelCatalog::Alias::SERVED;
  if (auto a = models.resolve(model)) return *a;
  std::string known;
  for (const auto& id : models.ids()) known += (known.empty() ? "" : ", ") + id;
  return unexpected(ApiError{ApiErrorKind::NOT_FOUND,
                             "The model '" + model + "' does not exist on this server; it serves: " + known, "model",
                             "model_not_found"});
}

ThinkingLevel resolve_thinking(const ThinkingControl& t, ModelCatalog::Alias alias, uint32_t ctx) {
  ThinkingLevel level = ThinkingLevel::HIGH;
  const bool explicit_control = t.enabled.has_value() || t.level.has_value();
  if (!explicit_control) {
    switch (alias) {
      case ModelCatalog::Alias::SERVED: break;
      case ModelCatalog::Alias::CHAT: level = ThinkingLevel::NONE; break;
      case ModelCatalog::Alias::REASONER: level = ThinkingLevel::HIGH; break;
    }
  }
  if (t.level) level = *t.level;
  if (t.enabled && !*t.enabled) level = ThinkingLevel::NONE;
  return thinking_level_for_ctx(level, ctx);
}

SamplingParams resolve_sampling(const ChatRequest& r, ThinkingLevel level) {
  SamplingParams p = recommended_sampling(level);
  if (level == ThinkingLevel::NONE) {
    if (r.temperature) p.temperature = *r.temperature;
    if (r.top_p) p.top_p = *r.top_p;
    if (r.top_k) p.top_k = *r.top_k;
    if (r.min_p) p.min_p = *r.min_p;
    if (r.presence_penalty) p.presence_penalty = *r.presence_penalty;
    if (r.frequency_penalty) p.frequency_penalty = *r.frequency_penalty;
    if (r.repetition_penalty) p.repetition_penalty = *r.repetition_penalty;
  }
  p.seed = r.seed ? *r.seed : random_u64();
  return p;
}

bool satisfies_response_format(std::string_view content, ResponseFormat f) {
  // nlohmann's lexer ends the input at a NUL byte ("{}\0junk" would parse); JSON never holds a raw NUL.
  if (f != ResponseFormat::TEXT && content.find('\0') != std::string_view::npos) return false;
  // The parse any JSON text the server reads gets (parse_json_text): a reply nesting deeper than
  // k_max_json_depth is not JSON this server would accept back from the client.
  switch (f) {
    case ResponseFormat::TEXT: return true;
    case ResponseFormat::JSON_OBJECT: {
      const auto j = parse_json_text(content);
      return j && j->is_object();
    }
    case ResponseFormat::JSON_SCHEMA: return parse_json_text(content).has_value();
  }
  DSV4_UNREACHABLE();
}

namespace {

// The response format as the official encoder shows it: a "## Response
// Format" section with a JSON schema, on the first (system) message.
void attach_response_format(std::vector<ChatMessage>& messages, const ordered_json& schema) {
  if (messages.empty() || messages.front().role != ChatRole::SYSTEM) {
    ChatMessage sys;
    sys.role = ChatRole::SYSTEM;
    messages.insert(messages.begin(), std::move(sys));
  }
  if (!messages.front().response_format) messages.front().response_format = schema;
}

}  // namespace

ApiError context_length_error(uint32_t ctx, const std::string& field, size_t tokens) {
  return api_error(runtime::context_length_error(ctx, field, tokens));
}

expected<PreparedChat, ApiError> prepare_chat(ChatRequest req, const ServeContext& ctx, bool check_context) {
  auto alias = resolve_model(ctx.models, req.model);
  if (!alias) return unexpected(alias.error());
  if (req.messages.empty()) return unexpected(invalid_request("messages must not be empty", "messages"));

  PreparedChat p;
  const bool has_tools = !req.tools.empty();
  switch (req.tool_choice.mode) {
    case ToolChoiceMode::AUTO:
    case ToolChoiceMode::NONE: break;
    case ToolChoiceMode::REQUIRED:
      if (!has_tools)
        return unexpected(invalid_request("tool_choice requires a tool call but no tools were given", "tool_choice"));
      p.job.forced_tool = runtime::ForcedTool::ANY;
      break;
    case ToolChoiceMode::FUNCTION: {
      auto it = std::find_if(req.tools.begin(), req.tools.end(),
                             [&](const ChatTool& t) { return t.name == req.tool_choice.name; });
      if (it == req.tools.end())
        return unexpected(invalid_request(
            "tool_choice names the function '" + req.tool_choice.name + "', which is not among the tools",
            "tool_choice"));
      p.job.forced_tool = runtime::ForcedTool::NAMED;
      p.job.forced_name = req.tool_choice.name;
      break;
    }
  }
  p.allow_tool_calls = has_tools && req.tool_choice.mode != ToolChoiceMode::NONE;
  p.parallel_tool_calls = req.parallel_tool_calls;
  p.response_format = req.response_format;
  p.level = resolve_thinking(req.thinking, *alias, ctx.ctx);

  switch (req.response_format) {
    case ResponseFormat::TEXT: break;
    case ResponseFormat::JSON_OBJECT: attach_response_format(req.messages, ordered_json{{"type", "object"}}); break;
    case ResponseFormat::JSON_SCHEMA: attach_response_format(req.messages, req.json_schema); break;
  }
  runtime::ChatPromptInput in;
  in.messages = std::move(req.messages);
  in.render = render_options_for(p.level);
  if (p.allow_tool_calls) in.render.tools = req.tools;
  in.ctx = check_context ? ctx.ctx : 0;
  in.tool_memory = &ctx.tool_memory;
  in.find_tool_calls = ctx.find_tool_calls;
  auto prompt = runtime::prepare_chat_prompt(std::move(in), ctx.tok);
  if (!prompt) return unexpected(api_error(prompt.error()));
  p.prompt_tokens = prompt->tokens.size();
  p.replayed_messages = prompt->replayed_messages;
  p.job.hidden_reasoning = prompt->hidden_reasoning;

  GenerateOptions& o = p.job.options;
  o.sampling = resolve_sampling(req, p.level);
  o.max_tokens = req.max_tokens.value_or(0);  // 0: until EOS or the context is full
  o.ignore_eos = req.ignore_eos;
  o.stop = req.stop;
  o.parse_chat = true;
  o.thinking = parse_mode_for(p.level);
  o.stop_at_tool_calls = true;
  o.logprobs = req.logprobs;
  if (p.level != ThinkingLevel::NONE) p.job.thinking_budget = req.thinking.budget_tokens;
  p.job.prompt = std::move(prompt->tokens);
  p.job.rendered = std::move(prompt->rendered);
  return p;
}

}  // namespace dsv4::server
