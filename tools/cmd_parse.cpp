// dsv4 parse: a model completion (stdin) parsed into the assistant message:
// reasoning, content and DSML tool calls, printed as JSON.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "chat/chat_cli.h"
#include "chat/dsml_parser.h"
#include "commands.h"

namespace dsv4::tools {

namespace {

struct ParseArgs {
  std::string thinking_mode = "chat";
};

int run_parse(const ParseArgs& a) {
  auto mode = thinking_mode_from_string(a.thinking_mode);
  if (!mode) {
    std::fprintf(stderr, "dsv4 parse: error: %s\n", mode.error().message.c_str());
    return 1;
  }
  std::stringstream ss;
  ss << std::cin.rdbuf();
  if (std::cin.bad()) {
    std::fprintf(stderr, "dsv4 parse: error: cannot read stdin\n");
    return 1;
  }
  const ParsedMessage m = parse_completion(ss.str(), *mode);
  for (const auto& w : m.warnings) std::fprintf(stderr, "dsv4 parse: warning: %s\n", w.c_str());
  // Invalid UTF-8 in the completion is replaced rather than thrown on.
  const std::string out =
      parsed_message_to_json(m).dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace

void register_parse(CLI::App& app) {
  auto args = std::make_shared<ParseArgs>();
  CLI::App* cmd = app.add_subcommand("parse", "Parse a completion (stdin) into an assistant message (JSON)");
  cmd->add_option("--thinking-mode", args->thinking_mode,
                  "chat, or thinking (the completion starts with reasoning ended by </think>)")
      ->capture_default_str();
  cmd->callback([args] { set_exit_code(run_parse(*args)); });
}

}  // namespace dsv4::tools
