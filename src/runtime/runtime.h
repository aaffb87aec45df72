// The serving runtime: what turns a request into a stream of events and an
// outcome, between the generation loop (generate/) and the front ends
// (server/ speaks HTTP, `dsv4 run` a terminal). It owns
//
//   * the scheduler: a bounded FIFO queue of Jobs and the worker threads that
//     run them, one per job the backend runs at once (scheduler.h, job.h;
//     with --parallel N the backend batches their forward passes:
//     step_batcher.h);
//   * the tool-call memory, so tool calls the model made are rendered back
//     exactly as it sampled them (tool_memory.h);
//
// and drives a Backend: EngineBackend (a model, its resident sessions, prompt
// reuse, the on-disk KV cache) or ScriptedBackend (scripted replies for tests
// and client integration work).
//
// A request's life:
//   prepare()   messages -> prompt tokens (chat_prompt.h); any thread
//   submit()    a Job (prompt + options) into the queue; any thread
//   worker      runs it (job_runner.h: session choice, phases for thinking
//               budgets and forced tool calls), pushes events into the Job
//   client      Job::wait() for events until the outcome; sets Job::cancel,
//               or a client_gone() predicate, to stop it
//
// Threading: every method may be called from any thread; shutdown() once.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/cache_report.h"
#include "runtime/chat_prompt.h"
#include "runtime/job.h"
#include "runtime/scheduler.h"
#include "runtime/tool_memory.h"

namespace dsv4::runtime {

class Runtime {
 public:
  // Starts the worker. `on_done` sees every finished job's outcome (metrics).
  Runtime(Backend& backend, size_t max_queue, JobObserver on_done = {});
  // Stops the worker (cancelling what is left) without the shutdown saves.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Tokenizer& tokenizer() const { return backend_.tokenizer(); }
  uint32_t context_size() const { return backend_.context_size(); }
  std::string describe() const { return backend_.describe(); }
  ToolMemory& tool_memory() { return tool_memory_; }
  CacheReport cache_report() const { return backend_.cache_report(); }

  // Chat messages -> a prompt (chat_prompt.h), with this runtime's tool-call
  // memory and the backend's disk cache for tool calls made before a restart.
  // `check_context` false: count only (no context limit).
  expected<ChatPrompt, RuntimeError> prepare(std::vector<ChatMessage> messages, RenderOptions render,
                                             bool check_context = true);

  using Admit = Scheduler::Admit;
  Admit submit(std::shared_ptr<Job> job) { return scheduler_.submit(std::move(job)); }
  void withdraw(const std::shared_ptr<Job>& job) { scheduler_.withdraw(job); }
  // Submits and waits: events (and, with `on_progress`, prefill progress)
  // go to the callbacks on the calling thread as they come; returns the
  // outcome (an error when the queue refused the job).
  JobOutcome run(const std::shared_ptr<Job>& job, const std::function<void(const DsmlEvent&)>& on_event,
                 const std::function<void(uint64_t done, uint64_t total)>& on_progress = {});

  // Graceful shutdown: drain() refuses new jobs and lets the queued ones run;
  // wait_idle() waits for them; cancel_all() cancels what is queued or running.
  void drain() { scheduler_.drain(); }
  bool wait_idle(std::chrono::milliseconds timeout) { return scheduler_.wait_idle(timeout); }
  void cancel_all() { scheduler_.cancel_all(); }
  // Stops the worker, then lets the backend save its live sessions (when
  // `save_sessions`) and finish its disk writes (Backend::shutdown).
  void shutdown(bool save_sessions);

  // The backend to the calling thread while no job runs (Scheduler::with_backend).
  void with_backend(const std::function<void(Backend&)>& fn) { scheduler_.with_backend(fn); }

  size_t queue_depth() const { return scheduler_.queue_depth(); }
  bool busy() const { return scheduler_.busy(); }
  size_t running() const { return scheduler_.running(); }
  size_t parallel() const { return scheduler_.workers(); }
  size_t waiting_for_session() const { return backend_.admission_waiting(); }
  StepReport step_report() const { return backend_.step_report(); }
  size_t max_queue() const { return scheduler_.max_queue(); }

 private:
  Backend& backend_;
  ToolMemory tool_memory_;
  Scheduler scheduler_;
  bool shut_down_ = false;
};

}  // namespace dsv4::runtime
