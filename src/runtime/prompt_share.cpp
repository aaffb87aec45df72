#include "runtime/prompt_share.h"

#include <chrono>

namespace dsv4::runtime {

bool PromptShare::lead() {
  std::lock_guard<std::mutex> lk(mu_);
  if (led_) return false;
  led_ = true;
  return true;
}

void PromptShare::publish(std::shared_ptr<const std::vector<uint8_t>> state) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (published_) return;
    published_ = true;
    state_ = std::move(state);
  }
  cv_.notify_all();
}

std::shared_ptr<const std::vector<uint8_t>> PromptShare::wait(const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!published_) {
    cv_.wait_for(lk, std::chrono::milliseconds(50));
    if (!published_ && cancelled && cancelled()) return nullptr;
  }
  return state_;
}

}  // namespace dsv4::runtime
