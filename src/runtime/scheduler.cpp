#include "runtime/scheduler.h"

#include <algorithm>

#include "core/log.h"
#include "runtime/job_runner.h"

namespace dsv4::runtime {

Scheduler::Scheduler(Backend& backend, size_t max_queue, JobObserver on_done)
    : backend_(backend), max_queue_(max_queue), on_done_(std::move(on_done)) {
  const size_t n = std::max<size_t>(1, backend.parallel());
  for (size_t i = 0; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

Scheduler::~Scheduler() { stop(); }

Scheduler::Admit Scheduler::submit(std::shared_ptr<Job> job) {
  std::vector<std::shared_ptr<Job>> gone;
  Admit admit = Admit::OK;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone = take_cancelled_locked();
    if (draining_ || stopping_)
      admit = Admit::STOPPING;
    else if (queue_.size() >= max_queue_)
      admit = Admit::QUEUE_FULL;
    else
      queue_.push_back(std::move(job));
  }
  finish_cancelled(std::move(gone));
  if (admit == Admit::OK) cv_.notify_one();
  return admit;
}

void Scheduler::withdraw(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) return;
    queue_.erase(it);
    if (queue_.empty() && running_.empty()) idle_cv_.notify_all();
  }
  job->cancel = true;
  finish_cancelled({job});
}

std::vector<std::shared_ptr<Job>> Scheduler::take_cancelled_locked() {
  std::vector<std::shared_ptr<Job>> out;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if ((*it)->cancel.load()) {
      out.push_back(std::move(*it));
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void Scheduler::finish_cancelled(std::vector<std::shared_ptr<Job>> jobs) {
  for (auto& job : jobs) {
    JobOutcome outcome;
    outcome.result.finish = FinishReason::CANCELLED;
    outcome.queued = std::chrono::steady_clock::now() - job->created();
    if (on_done_) on_done_(outcome);
    job->finish(std::move(outcome));
  }
}

void Scheduler::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool Scheduler::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, timeout, [&] { return queue_.empty() && running_.empty(); });
}

void Scheduler::cancel_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& j : queue_) j->cancel = true;
  for (auto& j : running_) j->cancel = true;
}

void Scheduler::stop() {
  std::lock_guard<std::mutex> join_lock(join_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    draining_ = true;
    for (auto& j : queue_) j->cancel = true;
    for (auto& j : running_) j->cancel = true;
  }
  abort_ = true;
  cv_.notify_all();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
}

void Scheduler::with_backend(const std::function<void(Backend&)>& fn) {
  std::unique_lock<std::shared_mutex> exclusive(backend_mu_);
  fn(backend_);
}

size_t Scheduler::queue_depth() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

size_t Scheduler::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_.size();
}

void Scheduler::worker_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      running_.push_back(job);
    }
    JobOutcome outcome;
    const auto started = std::chrono::steady_clock::now();
    if (job->cancel || abort_) {
      outcome.result.finish = FinishReason::CANCELLED;
    } else {
      JobHooks hooks;
      hooks.on_event = [&](const DsmlEvent& e) { job->push(e); };
      hooks.on_prefill_progress = [&](uint64_t done, uint64_t total) { job->report_prefill_progress(done, total); };
      hooks.cancelled = [&] {
        if (job->cancel.load() || abort_.load()) return true;
        if (!job->client_gone()) return false;
        job->cancel = true;  // the client hung up: stop before the next token
        return true;
      };
      hooks.on_token = [&] { job->token_sampled(); };
      std::shared_lock<std::shared_mutex> shared(backend_mu_);
      outcome = run_job(backend_, job->input(), hooks);
      if (outcome.error) log_warn("request failed: %s", outcome.error->message.c_str());
    }
    outcome.queued = started - job->created();
    job->fill_latency(outcome);
    if (on_done_) on_done_(outcome);
    job->finish(std::move(outcome));
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase(running_, job);
      if (queue_.empty() && running_.empty()) idle_cv_.notify_all();
    }
  }
}

}  // namespace dsv4::runtime
