#include "server/job.h"

#include "server/connection.h"

namespace dsv4::server {

void Job::watch_client(int fd) {
  std::lock_guard<std::mutex> lock(fd_mu_);
  client_fd_ = fd;
}

void Job::unwatch_client() {
  std::lock_guard<std::mutex> lock(fd_mu_);
  client_fd_ = -1;
}

bool Job::client_gone() {
  std::lock_guard<std::mutex> lock(fd_mu_);
  return connection_closed(client_fd_);
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

}  // namespace dsv4::server
