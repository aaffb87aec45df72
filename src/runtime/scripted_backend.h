// A Backend that replays scripted completions instead of running a model:
// the scheduler, the dialect adapters, SSE framing, tool-call streaming and
// exact replay all run for real, only sampling is replaced. Used by the unit
// tests (a "fake engine") and by `dsv4 serve --script FILE`, which lets
// client integrations be tested without a GPU or weights.
//
// A reply's text is what the model would generate after the prompt, with
// special tokens spelled out ("reasoning</think>answer", a DSML block, ...).
// It is tokenized with the model's tokenizer (special tokens recognised) and
// emitted token by token through the same steps as generate(): UTF-8-safe
// decoding, stop strings, the DSML/thinking parser, max_tokens, the context
// limit and cancellation (polled before every token and during the simulated
// prefill). When the script runs out the end-of-sentence token follows.
//
// Choosing a reply: the first reply whose `match` occurs in the prompt's last
// user turn (the text after its last <｜User｜> marker; the whole prompt if
// there is none); a reply with an empty `match` matches everything. No match
// is an error. When the same reply is chosen for a prompt that extends the
// whole live session and the reply had stopped before its end (a stop
// string, max_tokens, cancellation), it continues where it stopped, as a
// model continues its own output.
//
// Script file (JSON):
//   {"replies": [{"match": "weather", "text": "...", "token_delay_ms": 0, "prefill_delay_ms": 0}, ...]}
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/backend.h"

namespace dsv4::runtime {

struct ScriptedReply {
  std::string match;         // substring of the last user turn ("" = any prompt)
  std::string text;          // the completion, special tokens spelled out
  int token_delay_ms = 0;    // pause before each token
  int prefill_delay_ms = 0;  // pause before the first token (a long prefill)
};

expected<std::vector<ScriptedReply>> scripted_replies_from_json(const nlohmann::ordered_json& script);

class ScriptedBackend final : public Backend {
 public:
  ScriptedBackend(std::unique_ptr<Tokenizer> tokenizer, uint32_t ctx, std::vector<ScriptedReply> replies);

  const Tokenizer& tokenizer() const override { return *tok_; }
  uint32_t context_size() const override { return ctx_; }
  std::string describe() const override;
  const std::vector<int32_t>& session_tokens() const override { return session_; }
  expected<GenerateResult> generate(JobSlot& job, std::span<const int32_t> prompt, const GenerateOptions& options,
                                    const GenerateCallbacks& callbacks) override;

  // Every prompt received so far, as token ids (thread-safe; for tests).
  std::vector<std::vector<int32_t>> prompts() const;

 private:
  const ScriptedReply* pick(std::span<const int32_t> prompt) const;

  std::unique_ptr<Tokenizer> tok_;
  uint32_t ctx_;
  std::vector<ScriptedReply> replies_;
  std::vector<int32_t> session_;               // the simulated live session
  const ScriptedReply* last_reply_ = nullptr;  // the reply of the last call,
  size_t last_pos_ = 0;                        // how many of its script tokens were emitted,
  bool last_done_ = true;                      // and whether it reached its end
  mutable std::mutex mu_;
  std::vector<std::vector<int32_t>> prompts_;
};

}  // namespace dsv4::runtime
