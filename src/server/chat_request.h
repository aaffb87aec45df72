// The one internal request model every chat dialect (OpenAI chat, Responses,
// Anthropic messages) maps to, and its preparation into a Job: model and
// thinking resolution (formats.md §4.7), exact replay of remembered tool
// calls, the official rendering, tokenization, limits, sampling.
//
// Thinking (formats.md §4.7):
//   * on (HIGH) by default;
//   * off when the client says so: thinking {"type": "disabled"}, think:
//     false, reasoning_effort "none"; the alias deepseek-chat means off and
//     deepseek-reasoner means on, unless an explicit control is given;
//   * effort "max" selects MAX; "xhigh", "high", "medium", "low", "minimal"
//     select HIGH; MAX needs a context of at least 393216 tokens and is run
//     as HIGH below that (ds4's rule; stated at startup);
//   * in thinking modes sampling is fixed (temperature 1, top_p 1, top_k off,
//     min_p 0.05, no penalties) and the client's sampling knobs are ignored;
//     without thinking the same values are the defaults and the client's
//     knobs apply. A request without a seed gets a random one.
//
// Tools: offered to the model (rendered) unless tool_choice is "none".
// "required" and a named function force the call (job_runner.h).
// parallel_tool_calls=false keeps only the first call of a reply.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_message.h"
#include "chat/thinking.h"
#include "server/api_error.h"
#include "runtime/job.h"
#include "runtime/tool_memory.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server {

inline constexpr std::string_view k_alias_flash = "deepseek-v4-flash";
inline constexpr std::string_view k_alias_chat = "deepseek-chat";          // thinking off
inline constexpr std::string_view k_alias_reasoner = "deepseek-reasoner";  // thinking on

// The model ids the server answers to.
struct ModelCatalog {
  std::string served_id;             // the model's own id (--model-id)
  std::vector<std::string> aliases;  // extra names (--alias), same behaviour as served_id

  enum class Alias { SERVED, CHAT, REASONER };
  std::optional<Alias> resolve(std::string_view name) const;  // nullopt: unknown
  std::vector<std::string> ids() const;                       // every accepted id, served id first
};

// What the request handlers need besides the request (all thread-safe).
struct ServeContext {
  const Tokenizer& tok;
  uint32_t ctx;  // tokens of the live session
  ModelCatalog models;
  runtime::ToolMemory& tool_memory;
  // Tool-call ids -> sampled DSML from the disk cache (Backend::find_tool_calls);
  // empty: none. Unknown ids of a request are looked up before rendering.
  runtime::ToolCallFinder find_tool_calls = {};
};

enum class ToolChoiceMode { AUTO, NONE, REQUIRED, FUNCTION };
struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::AUTO;
  std::string name;  // FUNCTION
};

struct ThinkingControl {
  std::optional<bool> enabled;         // explicit on/off
  std::optional<ThinkingLevel> level;  // explicit effort (NONE means off)
  int budget_tokens = -1;              // Anthropic budget_tokens (-1: none)
};

enum class ResponseFormat { TEXT, JSON_OBJECT, JSON_SCHEMA };

// OpenAI `n`: choices one request may ask for.
inline constexpr int k_max_choices = 16;

struct ChatRequest {
  std::string model;  // empty: the served model
  std::vector<ChatMessage> messages;
  std::vector<ChatTool> tools;
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;
  ThinkingControl thinking;
  // Sampling knobs as given by the client (unset: the default).
  std::optional<float> temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::optional<int> max_tokens;
  bool ignore_eos = false;  // extension (as vLLM's): generate past EOS up to max_tokens (benchmarks, tests)
  std::vector<std::string> stop;
  int logprobs = -1;  // -1: off; k >= 0: chosen token + k alternatives
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
  int n = 1;                   // OpenAI n: choices (1..k_max_choices; not with stream)
  ResponseFormat response_format = ResponseFormat::TEXT;
  nlohmann::ordered_json json_schema;  // JSON_SCHEMA: the schema shown to the model
};

struct PreparedChat {
  runtime::JobInput job;
  ThinkingLevel level = ThinkingLevel::HIGH;
  bool allow_tool_calls = false;  // tools offered and tool_choice != none
  bool parallel_tool_calls = true;
  ResponseFormat response_format = ResponseFormat::TEXT;
  size_t prompt_tokens = 0;
  size_t replayed_messages = 0;  // assistant turns rendered from the tool-call memory
};

ThinkingLevel resolve_thinking(const ThinkingControl& t, ModelCatalog::Alias alias, uint32_t ctx);
SamplingParams resolve_sampling(const ChatRequest& r, ThinkingLevel level);

// The 400 for a prompt that does not fit the context: `tokens` is its exact
// length, or 0 when tokenising stopped past the context ("more than ctx").
ApiError context_length_error(uint32_t ctx, const std::string& field, size_t tokens);

// Validates and prepares; `check_context` false only counts (count_tokens).
expected<PreparedChat, ApiError> prepare_chat(ChatRequest req, const ServeContext& ctx, bool check_context = true);

// The model field: "" or a known id; otherwise 404 naming the served ids.
expected<ModelCatalog::Alias, ApiError> resolve_model(const ModelCatalog& models, const std::string& model);

// Whether `content` is the JSON the response format asks for (an object for
// json_object, any JSON value for json_schema; the schema itself is not
// checked), nesting at most k_max_json_depth levels.
bool satisfies_response_format(std::string_view content, ResponseFormat f);

}  // namespace dsv4::server
