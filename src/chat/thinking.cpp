#include "chat/thinking.h"

namespace dsv4 {

const char* thinking_level_name(ThinkingLevel level) {
  switch (level) {
    case ThinkingLevel::NONE: return "none";
    case ThinkingLevel::HIGH: return "high";
    case ThinkingLevel::MAX: return "max";
  }
  DSV4_UNREACHABLE();
}

const char* thinking_level_flag(ThinkingLevel level) {
  switch (level) {
    case ThinkingLevel::NONE: return "--nothink";
    case ThinkingLevel::HIGH: return "--think";
    case ThinkingLevel::MAX: return "--think-max";
  }
  DSV4_UNREACHABLE();
}

expected<ThinkingLevel> thinking_level_from_string(std::string_view s) {
  if (s == "none") return ThinkingLevel::NONE;
  if (s == "max") return ThinkingLevel::MAX;
  if (s == "high" || s == "xhigh" || s == "medium" || s == "low" || s == "minimal") return ThinkingLevel::HIGH;
  return make_error(
      "unknown thinking level '%.*s' (expected none, high or max; xhigh, medium, low and minimal mean high)",
      static_cast<int>(s.size()), s.data());
}

ThinkingLevel thinking_level_for_ctx(ThinkingLevel level, uint32_t ctx) {
  if (level == ThinkingLevel::MAX && ctx < k_think_max_min_ctx) return ThinkingLevel::HIGH;
  return level;
}

RenderOptions render_options_for(ThinkingLevel level) {
  RenderOptions o;
  switch (level) {
    case ThinkingLevel::NONE:
      o.thinking_mode = ThinkingMode::CHAT;
      o.reasoning_effort = ReasoningEffort::NONE;
      break;
    case ThinkingLevel::HIGH:
      o.thinking_mode = ThinkingMode::THINKING;
      o.reasoning_effort = ReasoningEffort::HIGH;
      break;
    case ThinkingLevel::MAX:
      o.thinking_mode = ThinkingMode::THINKING;
      o.reasoning_effort = ReasoningEffort::MAX;
      break;
  }
  o.drop_thinking = true;
  return o;
}

ThinkingMode parse_mode_for(ThinkingLevel level) {
  return level == ThinkingLevel::NONE ? ThinkingMode::CHAT : ThinkingMode::THINKING;
}

SamplingParams recommended_sampling(ThinkingLevel) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  p.top_k = 0;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.0f;
  p.seed = 0;
  return p;
}

}  // namespace dsv4
