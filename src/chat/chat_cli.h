// Library side of `dsv4 render` and `dsv4 parse` (tools/cmd_render.cpp,
// tools/cmd_parse.cpp): JSON text in, typed chat values out, and the parsed
// assistant message back as JSON.
#pragma once

#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_message.h"
#include "chat/dsml_parser.h"
#include "core/error.h"

namespace dsv4 {

struct RenderInput {
  std::vector<ChatMessage> messages;
  std::vector<ChatTool> tools;  // request-level tools
};

// `--messages` file contents: a JSON array of messages, or an object with a
// "messages" array and optional request-level "tools" (an OpenAI request body
// or a render fixture).
expected<RenderInput> render_input_from_json_text(std::string_view text);

// `--tools` file contents: a JSON array of OpenAI tools, or an object with a
// "tools" array.
expected<std::vector<ChatTool>> tools_from_json_text(std::string_view text);

// The parsed message in the official parser's shape:
// {"role": "assistant", "content", "reasoning_content",
//  "tool_calls": [{"type": "function", "function": {"name", "arguments"}}]}.
nlohmann::ordered_json parsed_message_to_json(const ParsedMessage& m);

}  // namespace dsv4
