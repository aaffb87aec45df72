// One generation request as it travels from a client thread (an HTTP
// handler, `dsv4 run`'s prompt loop) to the engine worker and back: typed
// input (tokens and options, never JSON), a cancellation flag, a predicate
// that says the client is gone, and a channel of events.
//
// Protocol: the client thread creates the Job and submits it to the
// scheduler (runtime.h), then waits on it. The worker pushes DsmlEvents as generation produces them
// and calls finish() exactly once (also for jobs cancelled while queued).
// Either side may drop its reference at any time; the Job lives while one of
// them holds it. Setting `cancel` stops the work before the next token or
// prefill batch.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/text_piece.h"
#include "generate/generate.h"
#include "runtime/prompt_share.h"
#include "runtime/runtime_error.h"

namespace dsv4::runtime {

// tool_choice "required" / a named function: the DSML opener (and the
// function name) are forced after the reasoning, so the reply is a call.
enum class ForcedTool { NONE, ANY, NAMED };

struct JobInput {
  std::vector<int32_t> prompt;  // canonical prompt tokens
  RenderedPrompt rendered;      // chat prompts: for text-level session reuse (empty: raw completion)
  GenerateOptions options;      // options.thinking: how the completion is parsed
  ForcedTool forced_tool = ForcedTool::NONE;
  std::string forced_name;  // NAMED: the function
  // Thinking mode: reasoning tokens after which </think> is forced (Anthropic
  // budget_tokens); -1: no budget.
  int thinking_budget = -1;
  // Thinking mode without tools: when the conversation comes back, the
  // renderer drops this turn's reasoning, so the backend keys the session by
  // the client-visible transcript (prompt_reuse.h, visible_transcript).
  bool hidden_reasoning = false;
  // Jobs of one request with the same prompt (OpenAI n > 1): the prompt is
  // prefilled once and copied (prompt_share.h). nullptr: alone.
  std::shared_ptr<PromptShare> share;
};

// What the worker reports at the end.
struct JobOutcome {
  std::optional<RuntimeError> error;             // set: the job failed (nothing else is meaningful)
  GenerateResult result;                         // over all phases; result.message is the parsed reply
  size_t reasoning_tokens = 0;                   // completion tokens up to and including </think>
  std::chrono::steady_clock::duration queued{};  // time spent waiting for the worker
  // Latency: from the job's creation to its first sampled token (< 0: none
  // was sampled), and the gaps between consecutive sampled tokens (seconds).
  double first_token_seconds = -1;
  std::vector<float> token_gaps;
};

class Job {
 public:
  explicit Job(JobInput input) : input_(std::move(input)), created_(std::chrono::steady_clock::now()) {}

  const JobInput& input() const { return input_; }
  std::chrono::steady_clock::time_point created() const { return created_; }

  std::atomic<bool> cancel{false};

  // Whether the client went away (a closed socket, Ctrl-C), polled by the
  // worker between two tokens (or prefill batches) so it stops without
  // waiting for the client thread's next wait(). Set before submitting; the
  // client thread clears it before whatever the predicate reads goes away,
  // so the predicate is never called after that.
  void set_client_check(std::function<bool()> gone);
  void clear_client_check();
  bool client_gone();  // the predicate said so (false when none is set)

  // Prefill progress (prompt tokens done of total), for clients that show it:
  // after want_prefill_progress() (before submitting), every report is kept
  // in order for wait(); otherwise reports are dropped.
  struct PrefillStep {
    uint64_t done = 0, total = 0;
  };
  void want_prefill_progress() { want_progress_ = true; }
  void report_prefill_progress(uint64_t done, uint64_t total);

  // Worker side.
  void push(const DsmlEvent& e);
  void token_sampled();  // after each sampled token (latency)
  void fill_latency(JobOutcome& outcome);
  void finish(JobOutcome outcome);

  // Client side: waits up to `timeout` for events (or progress) or the end;
  // appends the pending events to `out` and the progress reports to
  // `*progress` (reports precede the events of the prefill they belong to). Returns true once finished and every event
  // has been handed out.
  bool wait(std::vector<DsmlEvent>& out, std::chrono::milliseconds timeout,
            std::vector<PrefillStep>* progress = nullptr);
  // Valid after wait() returned true.
  const JobOutcome& outcome() const { return outcome_; }

 private:
  const JobInput input_;
  const std::chrono::steady_clock::time_point created_;
  std::mutex client_mu_;
  std::function<bool()> client_gone_;
  bool want_progress_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DsmlEvent> events_;
  std::deque<PrefillStep> progress_;
  bool finished_ = false;
  JobOutcome outcome_;
  // Worker side only.
  std::chrono::steady_clock::time_point last_token_{};
  double first_token_seconds_ = -1;
  std::vector<float> token_gaps_;
};

}  // namespace dsv4::runtime
