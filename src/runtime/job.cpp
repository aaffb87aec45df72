#include "runtime/job.h"

namespace dsv4::runtime {

void Job::set_client_check(std::function<bool()> gone) {
  std::lock_guard<std::mutex> lock(client_mu_);
  client_gone_ = std::move(gone);
}

void Job::clear_client_check() {
  std::lock_guard<std::mutex> lock(client_mu_);
  client_gone_ = nullptr;
}

bool Job::client_gone() {
  std::lock_guard<std::mutex> lock(client_mu_);
  return client_gone_ && client_gone_();
}

void Job::report_prefill_progress(uint64_t done, uint64_t total) {
  if (!want_progress_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.push_back(PrefillStep{done, total});
  }
  cv_.notify_all();
}

void Job::push(const DsmlEvent& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }
  cv_.notify_all();
}

void Job::token_sampled() {
  const auto now = std::chrono::steady_clock::now();
  if (first_token_seconds_ < 0)
    first_token_seconds_ = std::chrono::duration<double>(now - created_).count();
  else
    token_gaps_.push_back(std::chrono::duration<float>(now - last_token_).count());
  last_token_ = now;
}

void Job::fill_latency(JobOutcome& outcome) {
  outcome.first_token_seconds = first_token_seconds_;
  outcome.token_gaps = std::move(token_gaps_);
}

void Job::finish(JobOutcome outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    DSV4_ASSERT(!finished_, "Job::finish called twice");
    outcome_ = std::move(outcome);
    finished_ = true;
  }
  cv_.notify_all();
}

bool Job::wait(std::vector<DsmlEvent>& out, std::chrono::milliseconds timeout, std::vector<PrefillStep>* progress) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !events_.empty() || !progress_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  if (progress) progress->insert(progress->end(), progress_.begin(), progress_.end());
  progress_.clear();
  return finished_;
}

}  // namespace dsv4::runtime
