// dsv4 tokenize: text to token ids with a model's vocabulary, one token per
// line (id and piece), then a summary line with the ids comma-separated (the
// form `dsv4 logits --tokens` takes).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.h"
#include "vocab.h"

namespace dsv4::tools {

namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool text_given = false;
  bool specials = false;
};

int run_tokenize(const TokenizeArgs& a) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "dsv4 tokenize: error: %s\n", m.c_str());
    return 1;
  };
  if (a.model.empty())
    return fail(
        "a model is needed for its vocabulary: dsv4 tokenize -m MODEL.gguf TEXT (any DeepSeek V4 GGUF, or a "
        "test model from `dsv4 synth --preset tiny -o tiny.gguf`)");
  if (!a.text_given && ::isatty(0) != 0) return fail("give the TEXT to tokenize (or pipe it on stdin)");
  std::string text = a.text;
  if (!a.text_given || text == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  }
  auto tok = load_vocabulary(a.model);
  if (!tok) return fail(tok.error().message);
  const std::vector<int32_t> ids = a.specials ? (*tok)->encode_with_specials(text) : (*tok)->encode(text);
  std::string list;
  for (int32_t id : ids) {
    std::printf("%8d  %s\n", id, display_piece((*tok)->token_bytes(id)).c_str());
    if (!list.empty()) list += ',';
    list += std::to_string(id);
  }
  std::printf("%zu tokens: %s\n", ids.size(), list.c_str());
  return 0;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Token ids and pieces of a text, with a model's vocabulary");
  cmd->add_option("-m,--model", a->model, "Model GGUF file (only its vocabulary is read)");
  cmd->add_option("text", a->text, "The text (default or -: stdin)")->each([a](const std::string&) {
    a->text_given = true;
  });
  cmd->add_flag("--specials", a->specials,
                "Recognise special tokens spelled in the text (<｜User｜>, <think>, ...) as single tokens");
  cmd->callback([a] { set_exit_code(run_tokenize(*a)); });
}

}  // namespace dsv4::tools
