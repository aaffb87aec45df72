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

void Job::set_prefill_progress(uint64_t done, uint64_t total) {
  prefill_total_ = total;
  prefill_done_ = done;
}

void Job::push(const DsmlEvent& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(e);
  }
  cv_.notify_all();
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

bool Job::wait(std::vector<DsmlEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return finished_ || !events_.empty(); });
  while (!events_.empty()) {
    out.push_back(std::move(events_.front()));
    events_.pop_front();
  }
  return finished_;
}

}  // namespace dsv4::runtime
