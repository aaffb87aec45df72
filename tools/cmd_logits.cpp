// dsv4 logits: raw next-token logits at every position of a token sequence,
// for comparisons with other implementations.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "dsv4/engine.h"

namespace dsv4::tools {

namespace {

struct LogitsArgs {
  std::string model, tokens, tokens_file, out, numerics = "reference", backend = "auto";
  int threads = 0, batch = 512;
  uint32_t ctx = 0;
};

expected<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string tok;
  std::stringstream ss(text);
  while (ss >> tok) {
    std::stringstream parts(tok);
    std::string p;
    while (std::getline(parts, p, ',')) {
      if (p.empty()) continue;
      char* end = nullptr;
      errno = 0;
      long v = std::strtol(p.c_str(), &end, 10);
      if (errno || *end || v < 0 || v > 0x7fffffff) return make_error("bad token id \"%s\"", p.c_str());
      ids.push_back(static_cast<int32_t>(v));
    }
  }
  if (ids.empty()) return make_error("no token ids given");
  return ids;
}

int run_logits(const LogitsArgs& a) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "dsv4 logits: error: %s\n", m.c_str());
    return 1;
  };
  if (a.tokens.empty() == a.tokens_file.empty()) return fail("give exactly one of --tokens or --tokens-file");
  std::string text = a.tokens;
  if (!a.tokens_file.empty()) {
    std::ifstream in(a.tokens_file);
    if (!in) return fail("cannot read " + a.tokens_file);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  auto ids = parse_ids(text);
  if (!ids) return fail(ids.error().message);
  EngineOptions o;
  o.model_path = a.model;
  o.backend = a.backend;
  o.numerics = a.numerics;
  o.threads = a.threads;
  o.prefill_batch = a.batch;
  o.ctx = a.ctx ? a.ctx : static_cast<uint32_t>(std::max<size_t>(ids->size(), 1));
  auto engine = Engine::load(o);
  if (!engine) return fail(engine.error().message);
  auto session = (*engine)->new_session();
  if (!session) return fail(session.error().message);
  auto logits = (*session)->prefill_all_logits(*ids);
  if (!logits) return fail(logits.error().message);
  std::FILE* f = std::fopen(a.out.c_str(), "wb");
  if (!f) return fail(strfmt("cannot create %s: %s", a.out.c_str(), std::strerror(errno)));
  size_t wrote = std::fwrite(logits->data(), 4, logits->size(), f);
  if (std::fclose(f) != 0 || wrote != logits->size()) return fail("writing " + a.out + " failed (disk full?)");
  std::fprintf(stderr, "wrote %zu x %u float32 logits to %s (%s numerics, %s)\n", ids->size(), (*engine)->info().n_vocab,
               a.out.c_str(), (*engine)->info().numerics.c_str(), (*engine)->info().backend.c_str());
  return 0;
}

}  // namespace

void register_logits(CLI::App& app) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* cmd = app.add_subcommand("logits", "Write float32 logits [n_tokens][n_vocab] for every position of a token sequence");
  cmd->add_option("-m,--model", a->model, "Model GGUF")->required();
  cmd->add_option("--tokens", a->tokens, "Token ids, comma or space separated");
  cmd->add_option("--tokens-file", a->tokens_file, "File of token ids (comma or whitespace separated)");
  cmd->add_option("-o,--output", a->out, "Output file (little-endian float32)")->required();
  cmd->add_option("--numerics", a->numerics, "reference | plain")->capture_default_str();
  cmd->add_option("--backend", a->backend, "auto | cpu | cuda")->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->add_option("--batch", a->batch, "Tokens per forward batch")->capture_default_str();
  cmd->add_option("--ctx", a->ctx, "Session context (default: the number of tokens)");
  cmd->callback([a] { set_exit_code(run_logits(*a)); });
}

}  // namespace dsv4::tools
