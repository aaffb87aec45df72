// dsv4 render: a conversation (OpenAI-style JSON) rendered with the official
// DSV4 chat encoding, printed exactly as the model would see it.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "chat/chat_cli.h"
#include "chat/render_official.h"
#include "commands.h"
#include "vocab.h"

namespace dsv4::tools {

namespace {

struct RenderArgs {
  std::string messages_path;
  std::string tools_path;
  std::string thinking_mode = "chat";
  std::string reasoning_effort = "none";
  bool keep_thinking = false;
  bool tokens = false;  // print token ids instead of text (needs model)
  std::string model;
};

// How an input path is named in errors.
std::string input_name(const std::string& path) { return path == "-" ? "stdin" : path; }

// The whole file, or stdin for "-".
expected<std::string> read_input(const std::string& path) {
  std::stringstream ss;
  if (path == "-") {
    ss << std::cin.rdbuf();
    return ss.str();
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot open %s", path.c_str());
  ss << in.rdbuf();
  if (in.bad()) return make_error("cannot read %s", path.c_str());
  return ss.str();
}

expected<RenderedPrompt> render(const RenderArgs& a) {
  RenderOptions o;
  DSV4_TRY_ASSIGN(o.thinking_mode, thinking_mode_from_string(a.thinking_mode));
  DSV4_TRY_ASSIGN(o.reasoning_effort, reasoning_effort_from_string(a.reasoning_effort));
  o.drop_thinking = !a.keep_thinking;
  DSV4_TRY_ASSIGN(const std::string messages_text, read_input(a.messages_path));
  auto in = render_input_from_json_text(messages_text);
  if (!in) return in.error().with_context(input_name(a.messages_path));
  o.tools = std::move(in->tools);
  if (!a.tools_path.empty()) {
    DSV4_TRY_ASSIGN(const std::string tools_text, read_input(a.tools_path));
    auto tools = tools_from_json_text(tools_text);
    if (!tools) return tools.error().with_context(input_name(a.tools_path));
    o.tools.insert(o.tools.end(), tools->begin(), tools->end());
  }
  return render_official(in->messages, o);
}

int run_render(const RenderArgs& a) {
  if (a.tokens && a.model.empty()) {
    std::fprintf(stderr, "dsv4 render: error: --tokens needs -m MODEL.gguf for the vocabulary\n");
    return 1;
  }
  auto r = render(a);
  if (!r) {
    std::fprintf(stderr, "dsv4 render: error: %s\n", r.error().message.c_str());
    return 1;
  }
  if (a.tokens) {
    // Control pieces become single special tokens, text pieces plain BPE: the
    // ids the engine would prefill.
    auto tok = load_vocabulary(a.model);
    if (!tok) {
      std::fprintf(stderr, "dsv4 render: error: %s\n", tok.error().message.c_str());
      return 1;
    }
    auto ids = (*tok)->encode_prompt(*r);
    if (!ids) {
      std::fprintf(stderr, "dsv4 render: error: %s\n", ids.error().message.c_str());
      return 1;
    }
    std::string list;
    for (int32_t id : *ids) list += (list.empty() ? "" : ",") + std::to_string(id);
    std::printf("%s\n", list.c_str());
    std::fflush(stdout);
    return 0;
  }
  const std::string text = rendered_text(*r);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

void register_render(CLI::App& app) {
  auto args = std::make_shared<RenderArgs>();
  CLI::App* cmd = app.add_subcommand("render", "Render a conversation with the official DSV4 chat encoding");
  cmd->add_option("--messages", args->messages_path,
                  "JSON file (or - for stdin): an array of OpenAI-style messages, or an object with \"messages\" "
                  "and optional \"tools\"")
      ->required();
  cmd->add_option("--thinking-mode", args->thinking_mode, "chat or thinking")->capture_default_str();
  cmd->add_option("--reasoning-effort", args->reasoning_effort, "none, high or max (max adds the Think-Max prefix)")
      ->capture_default_str();
  cmd->add_option("--tools", args->tools_path,
                  "JSON file: request-level OpenAI tools (array, or object with \"tools\")");
  cmd->add_flag("--keep-thinking", args->keep_thinking,
                "Keep reasoning of earlier turns (official drop_thinking=false)");
  cmd->add_flag("--tokens", args->tokens,
                "Print the prompt's token ids (comma-separated) instead of its text; needs -m");
  cmd->add_option("-m,--model", args->model, "Model GGUF whose vocabulary --tokens uses (only the vocabulary is read)");
  cmd->callback([args] { set_exit_code(run_render(*args)); });
}

}  // namespace dsv4::tools
