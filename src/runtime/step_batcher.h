// Continuous batching (`dsv4 serve --parallel N`): up to N jobs generate at
// once, each on its own worker thread with its own session, sampler and reply
// parser, and their forward passes meet here. One step thread runs the engine:
// each step is one Engine::step over the rows the jobs are waiting for — one
// token per decoding session plus chunks of prompts being prefilled, at most
// `step_tokens` tokens in all — so the dense weights and the union of the
// routed experts are read once per step for every row.
//
// A step, from the requests waiting (a session and the tokens it wants
// appended; each job has at most one):
//   1. every one-token request (decoding rows), in arrival order;
//   2. prefill chunks in arrival order, each as many tokens as the budget left
//      allows — at most `shared_prefill_tokens` in all while another job is
//      active (decoding, sampling, or arriving: choosing its session;
//      arrive()/depart()), so a long prompt does not hold the others' next
//      token, or a new request's first one, for a whole prefill batch; a
//      prompt alone gets the whole budget. A
//      prompt longer than its chunk is fed over several steps: after each
//      chunk its job reports progress, checks cancellation and asks again, so
//      it queues behind requests that arrived meanwhile (a new request's first
//      chunk waits one step, never the whole of a long prompt).
// When: as soon as every member (a job inside generate(); Member) has a
// request waiting, or `gather` after the later of the oldest request's
// arrival and the end of the previous step — a member still sampling, or busy
// with the engine lock, is not waited for longer. (Measured from the step's
// end, so rows that fell into two alternating groups merge again.)
//
// Results: after a step a session's logits are those prefill()/decode() alone
// give (Engine::step's contract), so each job samples exactly as it would
// alone. A step that fails is retried item by item, so one bad request (say
// a context overflow) fails alone and the others go on.
//
// Exclusive access: everything else that touches the engine or a session's
// state (rewind, save, load, new sessions, the disk cache) holds lock(),
// which a step also holds while it runs. A thread waiting in lock() goes
// before the next step (a new request's session choice waits for at most the
// step that is running, not for a queue of steps).
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <thread>

#include "core/error.h"
#include "dsv4/engine.h"
#include "generate/generate.h"

namespace dsv4::runtime {

// One step as it ran (StepBatcherOptions::on_step).
struct StepRecord {
  size_t rows = 0;            // sessions
  size_t decode_rows = 0;     // one-token rows
  size_t prefill_tokens = 0;  // tokens of prompt chunks
  double seconds = 0;
};

struct StepBatcherOptions {
  size_t step_tokens = 512;  // tokens per step at most: >= 1, <= the engine's prefill batch
  // Prompt tokens of a step that also has decode rows (or several prompts);
  // 0: step_tokens.
  size_t shared_prefill_tokens = 0;
  std::chrono::microseconds gather{3000};
  std::function<void(const StepRecord&)> on_step;  // optional: after each step, on the step thread
};

// Totals since start, for /metrics.
struct StepReport {
  // Steps by rows (sessions) in them: 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, more.
  static constexpr std::array<size_t, 7> k_row_bounds{1, 2, 4, 8, 16, 32, 64};
  std::array<uint64_t, k_row_bounds.size() + 1> steps_by_rows{};
  // Step wall time (seconds, engine lock held) in buckets with these upper bounds, then +Inf.
  static constexpr std::array<double, 9> k_second_bounds{0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2};
  std::array<uint64_t, k_second_bounds.size() + 1> steps_by_seconds{};
  uint64_t steps = 0;
  uint64_t rows = 0;            // sessions over all steps
  uint64_t decode_tokens = 0;   // one-token rows
  uint64_t prefill_tokens = 0;  // tokens of prefill chunks
  double seconds = 0;           // in steps
  size_t members = 0;           // jobs generating now
  size_t waiting = 0;           // requests waiting for the next step now
};

class StepBatcher final : public SessionFeed {
 public:
  StepBatcher(Engine& engine, StepBatcherOptions options);
  ~StepBatcher() override;
  StepBatcher(const StepBatcher&) = delete;
  StepBatcher& operator=(const StepBatcher&) = delete;

  // SessionFeed: prefill() and decode() wait for the step(s) that append the
  // tokens; rewind() runs alone under the engine lock. prefill() ends with a
  // rewind point at the prompt's end (Session::checkpoint), as prefill alone does.
  Status prefill(Session& session, std::span<const int32_t> tokens, const RunHooks& hooks) override;
  Status decode(Session& session, int32_t token) override;
  Status rewind(Session& session, size_t n_tokens) override;
  // Speculative verify passes join the steps like decode rows: taken whole, before prompt chunks.
  bool can_verify() const override { return true; }
  expected<size_t> verify(Session& session, std::span<const int32_t> tokens, const Session::KeepFn& keep) override;
  // The drafter computes on the engine: under lock(), between steps.
  Proposals propose(const std::function<Proposals()>& drafter) override {
    auto engine = lock();
    return drafter();
  }

  // The engine to the caller: no step runs while it is held.
  std::unique_lock<std::mutex> lock();

  // A running job, from its session choice to its end: prompt chunks of
  // the others are capped while it is active.
  void arrive();
  void depart();
  // A job inside generate() (RAII): steps wait up to `gather` for its rows.
  class Member {
   public:
    explicit Member(StepBatcher& b) : b_(b) { b_.join(); }
    ~Member() { b_.leave(); }
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;

   private:
    StepBatcher& b_;
  };

  StepReport report() const;
  size_t step_tokens() const { return options_.step_tokens; }
  size_t shared_prefill_tokens() const {
    return options_.shared_prefill_tokens > 0 ? options_.shared_prefill_tokens : options_.step_tokens;
  }

 private:
  struct Request {
    Session* session = nullptr;
    std::span<const int32_t> tokens;
    std::chrono::steady_clock::time_point arrived;
    size_t taken = 0;                       // tokens the step appends (the step thread sets it)
    const Session::KeepFn* keep = nullptr;  // a verify request (Session::verify; taken whole)
    size_t kept = 0;
    // A decode row or a verify pass: taken whole, before prompt chunks, counted as decode tokens.
    bool whole() const { return tokens.size() == 1 || keep; }
    bool done = false;
    Status status;
  };

  void join();
  void leave();
  // Appends tokens[0, k) in the next step that takes this request; returns k >= 1. With `keep`: one
  // verify pass of all the tokens, returning how many stay.
  expected<size_t> feed(Session& session, std::span<const int32_t> tokens, const Session::KeepFn* keep = nullptr);
  void loop();
  void run(std::span<Request* const> batch);
  void record(std::span<Request* const> batch, double seconds);

  Engine& engine_;
  const StepBatcherOptions options_;
  std::mutex engine_mu_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the step thread: a request, a member left, or stop
  std::condition_variable done_cv_;  // job threads: their request is done
  std::deque<Request*> pending_;
  size_t members_ = 0;
  size_t active_ = 0;  // jobs between arrive() and depart()
  std::chrono::steady_clock::time_point last_step_end_{};
  size_t lockers_ = 0;  // threads waiting in lock(): they go before the next step
  bool stop_ = false;
  StepReport report_;
  std::thread thread_;
};

}  // namespace dsv4::runtime
