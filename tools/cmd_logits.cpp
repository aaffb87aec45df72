// dsv4 logits: raw next-token logits at every position of a token sequence
// (or at chosen positions), for comparisons with other implementations and
// between backends; optionally a greedy continuation (--greedy N), whose
// tokens --tokens-out writes after the given ones, so that other numerics or
// backends can be compared on the same tokens (scripts/gpu/numerics.sh).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "engine_flags.h"
#include "core/progress.h"
#include "dsv4/engine.h"

namespace dsv4::tools {

namespace {

struct LogitsArgs : LoadArgs {
  std::string tokens, out, positions;
  std::vector<std::string> tokens_files, tokens_out;  // one per sequence
  int greedy = 0;
  uint32_t ctx = 0;
};

// The integers of a comma- or whitespace-separated list in order, each through fn(value, its text), which
// returns an error to stop; what is not an integer in [-2^31 + 1, 2^31 - 1] is refused as a bad `what`.
template <class Fn>
Status for_each_integer(const std::string& text, const char* what, Fn&& fn) {
  std::string tok;
  std::stringstream ss(text);
  while (ss >> tok) {
    std::stringstream parts(tok);
    std::string p;
    while (std::getline(parts, p, ',')) {
      if (p.empty()) continue;
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(p.c_str(), &end, 10);
      if (errno || *end || v < -0x7fffffffLL || v > 0x7fffffffLL) return make_error("bad %s \"%s\"", what, p.c_str());
      DSV4_TRY(fn(v, p));
    }
  }
  return {};
}

expected<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  DSV4_TRY(for_each_integer(text, "token id", [&](long long v, const std::string& p) -> Status {
    if (v < 0) return make_error("bad token id \"%s\"", p.c_str());
    ids.push_back(static_cast<int32_t>(v));
    return {};
  }));
  if (ids.empty()) return make_error("no token ids given");
  return ids;
}

// --positions: 0-based indices into a sequence of n tokens, strictly ascending once a negative one is
// counted from the end (-1: the last token), so the same list fits sequences of different lengths.
expected<std::vector<int64_t>> parse_positions(const std::string& text, size_t n) {
  std::vector<int64_t> pos;
  DSV4_TRY(for_each_integer(text, "position", [&](long long v, const std::string&) -> Status {
    const long long r = v < 0 ? static_cast<long long>(n) + v : v;
    if (r < 0) return make_error("position %lld is before the first token (%zu tokens)", v, n);
    if (r >= static_cast<long long>(n)) return make_error("position %lld is past the last token (%zu tokens)", v, n);
    if (!pos.empty() && r <= pos.back())
      return make_error("positions must be strictly ascending (%lld after %lld)", r,
                        static_cast<long long>(pos.back()));
    pos.push_back(r);
    return {};
  }));
  if (pos.empty()) return make_error("no positions given");
  return pos;
}

// One sequence's rows: the logits after each chosen position (all positions when there are none), then
// `greedy` greedy tokens' (appended to ids).
expected<std::vector<float>> sequence_rows(Engine& engine, std::vector<int32_t>& ids,
                                           const std::vector<int64_t>& positions, int greedy) {
  DSV4_TRY_ASSIGN(auto session, engine.new_session());
  std::vector<float> rows;
  if (positions.empty()) {
    DSV4_TRY_ASSIGN(rows, session->prefill_all_logits(ids));
  } else {
    // Prefill up to each chosen position in turn and keep the last logits: only
    // those positions run the output head (chunked == whole prefill, bitwise).
    Progress bar("prefill", static_cast<uint64_t>(positions.back() + 1), "tok");
    int64_t done = 0;
    for (int64_t p : positions) {
      DSV4_TRY(session->prefill(std::span<const int32_t>(ids.data() + done, static_cast<size_t>(p + 1 - done))));
      done = p + 1;
      bar.update(static_cast<uint64_t>(done));
      const auto& l = session->logits();
      rows.insert(rows.end(), l.begin(), l.end());
    }
    bar.finish();
  }
  if (greedy > 0) {
    // The rest of the sequence first (with --positions it may stop short), then each greedy token: the
    // argmax of the logits before it (ties to the lower id), its own logits appended as a row.
    const size_t have = session->n_tokens();
    if (have < ids.size()) DSV4_TRY(session->prefill(std::span<const int32_t>(ids.data() + have, ids.size() - have)));
    for (int i = 0; i < greedy; ++i) {
      const auto& l = session->logits();
      const int32_t next = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
      ids.push_back(next);
      DSV4_TRY(session->prefill(std::span<const int32_t>(&ids.back(), 1)));
      const auto& after = session->logits();
      rows.insert(rows.end(), after.begin(), after.end());
    }
  }
  return rows;
}

int run_logits(const LogitsArgs& a) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "dsv4 logits: error: %s\n", m.c_str());
    return 1;
  };
  if (a.model.empty() == a.synthetic.empty()) return fail("give either -m FILE or --synthetic PRESET");
  if (a.tokens.empty() == a.tokens_files.empty()) return fail("give --tokens or --tokens-file (not both)");
  if (!a.tokens_out.empty() && a.tokens_out.size() != std::max<size_t>(a.tokens_files.size(), 1))
    return fail(strfmt("--tokens-out: give one per sequence (%zu sequences, %zu files)",
                       std::max<size_t>(a.tokens_files.size(), 1), a.tokens_out.size()));
  if (a.greedy < 0) return fail("--greedy: want a count >= 0");
  // The sequences: --tokens, or each --tokens-file; their positions (negative ones count from the end).
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::vector<int64_t>> positions;
  const size_t n_seqs = std::max<size_t>(a.tokens_files.size(), 1);
  for (size_t i = 0; i < n_seqs; ++i) {
    std::string text = a.tokens;
    if (!a.tokens_files.empty()) {
      std::ifstream in(a.tokens_files[i]);
      if (!in) return fail("cannot read " + a.tokens_files[i]);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    auto ids = parse_ids(text);
    if (!ids) return fail((a.tokens_files.empty() ? "" : a.tokens_files[i] + ": ") + ids.error().message);
    std::vector<int64_t> pos;
    if (!a.positions.empty()) {
      auto p = parse_positions(a.positions, ids->size());
      if (!p)
        return fail("--positions" + (a.tokens_files.empty() ? "" : " in " + a.tokens_files[i]) + ": " +
                    p.error().message);
      pos = std::move(*p);
    }
    seqs.push_back(std::move(*ids));
    positions.push_back(std::move(pos));
  }
  EngineOptions o;
  a.apply(o);
  size_t longest = 1;
  for (const auto& ids : seqs) longest = std::max(longest, ids.size() + static_cast<size_t>(a.greedy));
  o.ctx = a.ctx ? a.ctx : static_cast<uint32_t>(longest);
  auto engine = Engine::load(o);
  if (!engine) return fail(engine.error().message);
  const uint32_t V = (*engine)->info().n_vocab;
  std::vector<float> rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto r = sequence_rows(**engine, seqs[i], positions[i], a.greedy);
    if (!r) return fail((seqs.size() > 1 ? a.tokens_files[i] + ": " : "") + r.error().message);
    rows.insert(rows.end(), r->begin(), r->end());
    if (a.tokens_out.empty()) continue;
    const std::string& out = a.tokens_out[i];
    std::FILE* t = std::fopen(out.c_str(), "w");
    if (!t) return fail(strfmt("cannot create %s: %s", out.c_str(), std::strerror(errno)));
    bool ok = true;
    for (size_t j = 0; j < seqs[i].size(); ++j) ok = std::fprintf(t, j ? ",%d" : "%d", seqs[i][j]) > 0 && ok;
    ok = std::fprintf(t, "\n") > 0 && ok;
    if (std::fclose(t) != 0 || !ok) return fail("writing " + out + " failed (disk full?)");
  }
  std::FILE* f = std::fopen(a.out.c_str(), "wb");
  if (!f) return fail(strfmt("cannot create %s: %s", a.out.c_str(), std::strerror(errno)));
  size_t wrote = std::fwrite(rows.data(), 4, rows.size(), f);
  if (std::fclose(f) != 0 || wrote != rows.size()) return fail("writing " + a.out + " failed (disk full?)");
  std::fprintf(stderr, "wrote %zu x %u float32 logits of %zu sequence%s to %s (%s numerics, %s)\n", rows.size() / V, V,
               seqs.size(), seqs.size() == 1 ? "" : "s", a.out.c_str(), numerics_name((*engine)->info().numerics),
               (*engine)->info().backend.c_str());
  return 0;
}

}  // namespace

void register_logits(CLI::App& app) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* cmd = app.add_subcommand("logits",
                                     "Write float32 logits [n_tokens][n_vocab] for every position of a token sequence "
                                     "(or [k][n_vocab] for --positions)");
  cmd->add_option("-m,--model", a->model, "Model GGUF");
  add_synthetic_flags(cmd, &a->synthetic, &a->seed);
  cmd->add_option("--tokens", a->tokens, "Token ids, comma or space separated");
  cmd->add_option("--tokens-file", a->tokens_files,
                  "File of token ids (comma or whitespace separated); repeat it for several sequences, each in its "
                  "own session of the one loaded model, their rows written one sequence after another");
  cmd->add_option("-o,--output", a->out, "Output file (little-endian float32)")->required();
  add_backend_flags(cmd, &a->backend, &a->numerics);
  add_fast_skip_flag(cmd, &a->fast_skip);
  cmd->add_option("-t,--threads", a->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->add_option("--batch", a->batch, "Tokens per forward batch; 0 = the backend's default (CUDA 4096, CPU 512)")
      ->capture_default_str();
  cmd->add_option("--ctx", a->ctx, "Session context (default: the number of tokens)");
  cmd->add_option("--positions", a->positions,
                  "Only these positions (0-based, ascending, comma separated; negative ones count from the end, -1 "
                  "the last token): the logits after token p, one row each; only they run the output head");
  cmd->add_option("--greedy", a->greedy,
                  "Then decode N greedy tokens (each the argmax of the logits before it); the logits after each are "
                  "appended as rows")
      ->capture_default_str();
  cmd->add_option("--tokens-out", a->tokens_out,
                  "Write the whole sequence (the given tokens and the greedy ones) to this file, comma separated: "
                  "the --tokens-file of a run that compares other numerics or backends on the same tokens; one per "
                  "sequence");
  add_expert_stats_flag(cmd, &a->expert_stats);
  add_cuda_flags(cmd, &a->cuda);
  cmd->callback([a] { set_exit_code(run_logits(*a)); });
}

}  // namespace dsv4::tools
