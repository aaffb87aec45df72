// What the scheduler's worker thread drives: a model with its live
// session(s). The real implementation wraps Engine + resident sessions +
// the on-disk KV cache + generate() (engine_backend.h); ScriptedBackend
// (scripted_backend.h) replays scripted completions through the same event
// types, for tests and client integration work without a model.
//
// A job on the worker thread:
//   begin_job()   pick the session and bring in what can be reused (resident
//                 sessions, disk cache); returns the prompt tokens to use
//   generate()    one or more times (job_runner.h phases), on that session
//   end_job()     bookkeeping once the outcome is known
//
// Threading: tokenizer(), context_size(), describe(), find_tool_calls(),
// cache_report() and step_report() may be called from any thread (the
// tokenizer is immutable). begin_job(), generate() and end_job() are called
// by the scheduler's workers: parallel() of them at once, each with its own
// JobSlot (a backend with parallel() > 1 is thread-safe for them; others see
// one worker). session_tokens() only between jobs; shutdown() once, after
// the workers have stopped.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "generate/generate.h"
#include "kv/kv_file.h"
#include "runtime/job.h"
#include "runtime/cache_report.h"
#include "runtime/prompt_reuse.h"
#include "runtime/step_batcher.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::runtime {

class ToolMemory;

// What a backend keeps about one running job from begin_job() to end_job().
struct JobSlot {
  size_t session = 0;        // the session (pool slot) the job runs on
  bool leased = false;       // the session is the job's until end_job()
  size_t prompt_tokens = 0;  // the job's prompt; beyond it: generated (or forced) tokens
  size_t cold_save = 0;      // the cold save length of the prompt (0: none)
  bool first_call = false;   // the next generate() is the job's first
  bool hidden_reasoning = false;
  bool batch_active = false;           // StepBatcher::arrive() called (begin_job .. end_job)
  std::shared_ptr<PromptShare> share;  // JobInput::share, until the first generate() uses it
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const Tokenizer& tokenizer() const = 0;
  // Tokens a session holds at most (prompt + completion).
  virtual uint32_t context_size() const = 0;
  // One line for the start banner and /health.
  virtual std::string describe() const = 0;

  // Jobs that may run at once (the scheduler starts this many workers).
  virtual size_t parallel() const { return 1; }

  // The current session's tokens (what the next prompt can reuse).
  virtual const std::vector<int32_t>& session_tokens() const = 0;

  // Chooses the session for a job and the prompt tokens to generate from;
  // may wait until a session is free (parallel jobs). Default (one live
  // session, nothing on disk): the reuse rules of prompt_reuse.h against
  // session_tokens().
  virtual expected<PromptChoice> begin_job(const JobInput& in, JobSlot& job) {
    (void)job;
    return choose_prompt_tokens(tokenizer(), session_tokens(), in.prompt, in.rendered);
  }
  // generate() semantics (generate/generate.h): reuse the longest common
  // prefix of the session, prefill the rest, sample; the session ends at
  // prompt + completion. GenerateResult::cached_tokens counts the prompt
  // tokens the session held when the call began.
  virtual expected<GenerateResult> generate(JobSlot& job, std::span<const int32_t> prompt,
                                            const GenerateOptions& options, const GenerateCallbacks& callbacks) = 0;
  // After the job's last generate() (also for failed or cancelled jobs, and
  // after a begin_job() that failed).
  virtual void end_job(JobSlot& job, const JobInput& in, const JobOutcome& outcome) {
    (void)job;
    (void)in;
    (void)outcome;
  }

  // The server's tool-call memory (tool_memory.h), whose calls a saved cache
  // file carries; set before the worker starts, cleared (nullptr) before the
  // memory goes away.
  virtual void set_tool_memory(ToolMemory* memory) { (void)memory; }
  // Tool-call id -> the sampled DSML block, for ids that cache files know
  // (exact replay after a restart). Any thread.
  virtual ToolDsmlMap find_tool_calls(const std::vector<std::string>& ids) {
    (void)ids;
    return {};
  }
  // Sessions and disk cache, for /metrics. Any thread.
  virtual CacheReport cache_report() const { return {}; }
  // Batched steps (parallel() > 1), for /metrics. Any thread.
  virtual StepReport step_report() const { return {}; }
  // Jobs waiting for a free session (KV admission). Any thread.
  virtual size_t admission_waiting() const { return 0; }
  // After the worker stopped: save the live sessions (when `save_sessions`,
  // i.e. a clean shutdown) and wait for every pending cache write.
  virtual void shutdown(bool save_sessions) { (void)save_sessions; }
};

}  // namespace dsv4::runtime
