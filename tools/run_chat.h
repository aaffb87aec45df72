// A `dsv4 run` conversation: the typed run settings, the chat history and the
// serving runtime it runs on (runtime/runtime.h, the same path as `dsv4
// serve`). Every turn renders the whole history (Runtime::prepare) and runs
// it as a job: the runtime's session reuse keeps earlier turns (also the
// reasoning the renderer drops), its disk cache (--kv-disk-dir) keeps them
// across runs, and a thinking budget ends the reasoning after N tokens.
// Ctrl-C is the job's client_gone(). Used by the one-shot mode and the
// interactive chat alike.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/chat_message.h"
#include "chat/thinking.h"
#include "dsv4/engine.h"
#include "generate/generate.h"
#include "run_output.h"
#include "runtime/cache_options.h"
#include "runtime/engine_backend.h"
#include "runtime/runtime.h"

namespace dsv4::tools {

// Everything `dsv4 run` was asked to do, after validation; printed at start.
struct RunSettings {
  EngineOptions engine;
  ThinkingLevel thinking = ThinkingLevel::HIGH;
  std::string system;             // system prompt ("" = none)
  bool raw_prompt = false;        // the prompt is the text itself (no chat template): the model continues it
  SamplingParams sampling;        // seed already resolved
  int max_tokens = 0;             // per reply; 0 = until EOS or the context is full
  int thinking_budget = -1;       // reasoning tokens after which </think> is forced (-1: none)
  runtime::KvCacheOptions cache;  // --kv-disk-dir and friends (one resident session)
  int draft = 0;                  // proposed tokens per pass (--mtp/--draft; 0: plain decoding)
  float draft_margin = 0;         // --draft-margin
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string dump_logprobs;  // --dump-logprobs FILE ("" = off)
  int logprobs_top_k = 5;
  Colors colors;

  // "thinking=high (--think) temp=1 top_p=1 ..." (the engine options are
  // printed by EngineOptions::describe()).
  std::string describe() const;
};

// What /load restored.
struct LoadReport {
  size_t messages = 0;
  bool state_restored = false;  // the session snapshot was loaded (no prefill needed)
  std::string state_note;       // why it was not, when it was not
};

class ChatSession {
 public:
  ChatSession(runtime::Runtime& runtime, runtime::EngineBackend& backend, const RunSettings& settings);

  ThinkingLevel thinking() const { return thinking_; }
  void set_thinking(ThinkingLevel level) { thinking_ = level; }
  const std::vector<ChatMessage>& messages() const { return messages_; }
  const Engine& engine() const { return backend_->engine(); }
  uint32_t context_size() const { return runtime_->context_size(); }
  // Tokens the session holds (prompt + replies so far).
  size_t session_tokens();

  // Sends one user message: renders the history plus `user_text`, generates
  // the reply while streaming it to `printer` (Ctrl-C stops it), and keeps
  // the exchange in the history unless generation failed or was interrupted.
  expected<GenerateResult> reply(const std::string& user_text, ReplyPrinter& printer);

  // Forgets the conversation (the system prompt stays) and empties the session.
  void reset();
  // /save and /load: history, thinking level and the session state
  // (conversation/conversation_file.h). A snapshot that does not fit this
  // engine (another model, a smaller context) is skipped: the history is still
  // loaded and gets prefilled on the next turn.
  Status save(const std::string& path);
  expected<LoadReport> load(const std::string& path);

 private:
  runtime::Runtime* runtime_;
  runtime::EngineBackend* backend_;
  const RunSettings* settings_;
  ThinkingLevel thinking_;
  std::vector<ChatMessage> messages_;  // the system message (if any) first
  uint64_t turns_ = 0;                 // replies generated (varies the seed per turn)
};

}  // namespace dsv4::tools
