// Thinking levels (formats.md §4.7) and what each one means for the chat
// renderer, the completion parser and sampling. Shared by `dsv4 run`
// (--nothink / --think / --think-max) and the server (thinking /
// reasoning_effort request fields).
//
//   level  assistant prefix  Think-Max prefix  renderer                      parser
//   NONE   A </think>        no                chat mode                     chat (all text is content)
//   HIGH   A <think>         no                thinking mode                 thinking (reasoning, then content)
//   MAX    A <think>         after BOS         thinking mode, effort "max"   thinking
#pragma once

#include <cstdint>
#include <string_view>

#include "chat/chat_message.h"
#include "chat/render_official.h"
#include "core/error.h"
#include "sampling/sampler.h"

namespace dsv4 {

enum class ThinkingLevel { NONE, HIGH, MAX };

// "none", "high", "max".
const char* thinking_level_name(ThinkingLevel level);
// The `dsv4 run` flag that selects the level: "--nothink", "--think", "--think-max".
const char* thinking_level_flag(ThinkingLevel level);

// "none" | "high" | "max", plus the API's reasoning_effort spellings
// (formats.md §4.7): "xhigh", "medium", "low" and "minimal" select HIGH.
expected<ThinkingLevel> thinking_level_from_string(std::string_view s);

// The model card asks for a context of at least 384K tokens for Think-Max;
// ds4 runs MAX as HIGH below this many tokens (formats.md §4.7).
inline constexpr uint32_t k_think_max_min_ctx = 393216;

// ds4's rule: MAX with a context shorter than k_think_max_min_ctx becomes
// HIGH; other levels are unchanged. (The CLI keeps an explicit --think-max and
// only warns; the server follows ds4.)
ThinkingLevel thinking_level_for_ctx(ThinkingLevel level, uint32_t ctx);

// Render options for the level (drop_thinking stays on, as in the official API).
RenderOptions render_options_for(ThinkingLevel level);
// How the completion is parsed: CHAT for NONE, THINKING otherwise.
ThinkingMode parse_mode_for(ThinkingLevel level);

// The recommended sampling for DeepSeek V4 at every level: temperature 1,
// top_p 1 (DeepSeek's recommendation for local deployment and the fixed API
// setting in thinking modes), top_k off, min_p 0.05 (what ds4's server uses),
// no penalties. The seed is left at 0.
SamplingParams recommended_sampling(ThinkingLevel level);

}  // namespace dsv4
