// The DSV4 special-token strings the chat renderer emits and the DSML parser
// recognises (formats.md §3.2, §4.1). Each is exactly one token of the
// vocabulary; the renderer emits them as control pieces (core/text_piece.h).
// U+FF5C is the fullwidth bar `｜`, U+2581 the `▁` in BOS/EOS.
#pragma once

#include <string_view>

namespace dsv4::chat_marker {

inline constexpr std::string_view BOS = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view EOS = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view USER = "<｜User｜>";
inline constexpr std::string_view ASSISTANT = "<｜Assistant｜>";
inline constexpr std::string_view THINK_START = "<think>";
inline constexpr std::string_view THINK_END = "</think>";
inline constexpr std::string_view DSML = "｜DSML｜";
inline constexpr std::string_view LATEST_REMINDER = "<｜latest_reminder｜>";

// Quick-instruction task tokens (formats.md §3.2), appended by the official
// encoder after a message that carries a `task`.
inline constexpr std::string_view TASK_ACTION = "<｜action｜>";
inline constexpr std::string_view TASK_QUERY = "<｜query｜>";
inline constexpr std::string_view TASK_AUTHORITY = "<｜authority｜>";
inline constexpr std::string_view TASK_DOMAIN = "<｜domain｜>";
inline constexpr std::string_view TASK_TITLE = "<｜title｜>";
inline constexpr std::string_view TASK_READ_URL = "<｜read_url｜>";

}  // namespace dsv4::chat_marker
