// The generation loop shared by `dsv4 run` and `dsv4 serve`: bring a session to
// a prompt (reusing the longest common token prefix), then sample tokens one by
// one, decode them UTF-8-safely, cut at stop strings, parse the completion
// (reasoning / content / DSML tool calls) and report deltas as they become
// certain.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "chat/dsml_parser.h"
#include "core/error.h"
#include "dsv4/engine.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

struct GenerateOptions {
  SamplingParams sampling;
  int max_tokens = 512;           // generated tokens at most (<= 0: until EOS or the context is full)
  std::vector<std::string> stop;  // stop strings (matched on the decoded completion text)
  bool parse_chat = true;         // run the DSML/thinking parser (chat); false: plain text (raw completions)
  ThinkingMode thinking = ThinkingMode::CHAT;
  bool stop_at_tool_calls = true;  // end generation when a tool-calls block closes
  int logprobs = -1;               // -1: off; k >= 0: record the chosen token's logprob and k alternatives
  bool ignore_eos = false;         // keep generating past EOS, which adds no text (benchmarks; the server's ignore_eos)
  // Speculative decoding (docs/SPECULATIVE.md): up to `draft` proposed tokens checked per forward
  // pass (Session::verify), from `drafter` (none set: the session's MTP block, Session::mtp_draft).
  // 0: off. Only where the feed can verify (SessionFeed::can_verify). Every token is still sampled
  // from the model's own logits, in order, with the same sampler calls, so the output is the one
  // plain decoding gives (same seed, bitwise on the CPU backend); proposals only save passes.
  int draft = 0;
  float draft_margin = 0;  // the MTP drafter's min_margin (Session::mtp_draft)
  // Proposals for the tokens after `next` (the last sampled token, not yet fed); `generated`: every
  // sampled token so far, `next` last. At most k; fewer (or none) is fine.
  std::function<expected<std::vector<int32_t>>(Session& session, std::span<const int32_t> generated, int32_t next,
                                               int k)>
      drafter;
};

// Speculation counters of one generate() call.
struct SpecStats {
  uint64_t passes = 0;    // verify passes
  uint64_t proposed = 0;  // tokens proposed
  uint64_t accepted = 0;  // proposals the model agreed with (each one a forward pass saved)
};

enum class FinishReason { STOP, LENGTH, TOOL_CALLS, CANCELLED };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "tool_calls", "cancelled"

struct TokenLogprob {
  int32_t token = 0;
  std::string text;  // the token's bytes (may be a partial UTF-8 sequence)
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

struct GenerateResult {
  FinishReason finish = FinishReason::STOP;
  std::string stop_string;      // the stop string that matched, if any
  ParsedMessage message;        // content / reasoning / tool calls (parse_chat); content only otherwise
  std::string text;             // the decoded completion as generated (before stop trimming)
  std::vector<int32_t> tokens;  // sampled tokens (EOS included when sampled)
  std::vector<TokenLogprob> logprobs;
  size_t prompt_tokens = 0;
  size_t cached_tokens = 0;  // prompt tokens reused from the session
  double prefill_seconds = 0;
  double decode_seconds = 0;
  SpecStats spec;
};

struct GenerateCallbacks {
  std::function<void(const DsmlEvent&)> on_event;                          // content / reasoning / tool-call deltas
  std::function<void(uint64_t done, uint64_t total)> on_prefill_progress;  // prompt tokens processed
  std::function<bool()> cancelled;                                         // polled before each token / batch
  std::function<void()> on_token;                                          // after each sampled token (latency metrics)
};

// How generate() runs the model on its session. The default calls the
// session itself; the serving runtime's step batcher (runtime/step_batcher.h)
// instead joins the rows of every session generating at that moment into one
// forward (Engine::step), with the same results.
class SessionFeed {
 public:
  virtual ~SessionFeed() = default;
  // Session::prefill / decode / rewind semantics.
  virtual Status prefill(Session& session, std::span<const int32_t> tokens, const RunHooks& hooks) = 0;
  virtual Status decode(Session& session, int32_t token) = 0;
  virtual Status rewind(Session& session, size_t n_tokens) = 0;
  // Session::verify, where this feed runs it (the direct feed and the step batcher do). The step
  // batcher calls `keep` on its step thread, with the engine held: generate()'s keep samples and
  // reports tokens (sampler, reply parser, the event and token callbacks, none of which touch the engine).
  virtual bool can_verify() const { return false; }
  // Runs a drafter (it computes on the engine: MTP or DSpark passes) where no other forward pass runs
  // meanwhile (the step batcher: under its engine lock).
  using Proposals = expected<std::vector<int32_t>>;
  virtual Proposals propose(const std::function<Proposals()>& drafter) { return drafter(); }
  virtual expected<size_t> verify(Session& session, std::span<const int32_t> tokens, const Session::KeepFn& keep) {
    (void)session;
    (void)tokens;
    (void)keep;
    return make_error("this feed does not verify proposals");
  }
};

// The session alone (one sequence at a time).
SessionFeed& direct_feed();

// Reuses the session's longest common prefix with `prompt`, prefills the rest, generates.
expected<GenerateResult> generate(Session& session, const Tokenizer& tok, std::span<const int32_t> prompt,
                                  const GenerateOptions& options, const GenerateCallbacks& callbacks = {},
                                  SessionFeed& feed = direct_feed());

// How many leading tokens `a` and `b` share.
size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b);

// Brings the session to exactly `prompt` (rewinding past any divergence);
// returns the number of prompt tokens that were reused.
expected<size_t> sync_session(Session& session, std::span<const int32_t> prompt, const RunHooks& hooks = {},
                              SessionFeed& feed = direct_feed());

}  // namespace dsv4
