// The engine workers: a bounded FIFO queue of jobs and backend.parallel()
// threads that run them (one, unless the backend batches several sequences
// per step: `dsv4 serve --parallel N`, step_batcher.h).
//
//   submit()   client threads; refused when the queue holds `max_queue` jobs
//              (an HTTP caller answers 503 with Retry-After) or after drain().
//              Jobs cancelled while queued hold no slot: withdraw() (the
//              client thread saw its client go) and submit() take them out.
//   workers    pop jobs in order (FIFO admission); a job cancelled while
//              queued finishes at once without touching the model; otherwise
//              run_job() with cancellation polled before every token and
//              prefill batch.
//   drain()    graceful shutdown, step 1: refuse new jobs, keep running the
//              queued ones. wait_idle() waits for them.
//   stop()     cancels whatever is left and joins the workers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "runtime/backend.h"
#include "runtime/job.h"

namespace dsv4::runtime {

// Called with every finished job's outcome, before the job's client sees it:
// on the worker thread, or on the thread that took a cancelled job out of
// the queue (submit, withdraw).
using JobObserver = std::function<void(const JobOutcome&)>;

class Scheduler {
 public:
  Scheduler(Backend& backend, size_t max_queue, JobObserver on_done = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  enum class Admit { OK, QUEUE_FULL, STOPPING };
  Admit submit(std::shared_ptr<Job> job);
  // Takes a job that is still queued out of the queue (its client is gone):
  // it finishes at once as cancelled and its slot is free. No effect on a
  // job that is running or done.
  void withdraw(const std::shared_ptr<Job>& job);

  void drain();
  // True when nothing is queued or running (waits up to `timeout`).
  bool wait_idle(std::chrono::milliseconds timeout);
  // Cancels queued and running jobs (they finish with FinishReason::CANCELLED).
  void cancel_all();
  void stop();

  // Runs `fn` on the calling thread with the backend to itself: it waits for
  // the running jobs to end, and no job starts until `fn` returns. For the
  // backend's calls between jobs (`dsv4 run`'s /save).
  void with_backend(const std::function<void(Backend&)>& fn);

  size_t queue_depth() const;
  size_t running() const;  // jobs running now
  bool busy() const { return running() > 0; }
  size_t workers() const { return workers_.size(); }
  size_t max_queue() const { return max_queue_; }

 private:
  void worker_loop();
  // Removes the cancelled jobs from the queue (mu_ held); the caller finishes them.
  std::vector<std::shared_ptr<Job>> take_cancelled_locked();
  void finish_cancelled(std::vector<std::shared_ptr<Job>> jobs);

  Backend& backend_;
  const size_t max_queue_;
  const JobObserver on_done_;
  std::shared_mutex backend_mu_;  // shared while a job runs, exclusive in with_backend()
  mutable std::mutex mu_;
  std::condition_variable cv_;       // worker: a job arrived or stopping
  std::condition_variable idle_cv_;  // wait_idle: the queue ran empty
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;
  bool draining_ = false;
  bool stopping_ = false;
  std::atomic<bool> abort_{false};  // cancels the running jobs from stop()
  std::mutex join_mu_;              // stop() may be called from several threads
  std::vector<std::thread> workers_;
};

}  // namespace dsv4::runtime
