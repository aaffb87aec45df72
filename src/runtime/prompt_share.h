// One prompt, several jobs (OpenAI n > 1): the prompt is prefilled once. The
// first job to reach it leads: it prefills its session to the prompt and
// publishes the session's exact state (Session::save); the others wait for
// that, load it into their own sessions (an exact copy: every reply is the
// one it gets alone) and go straight to sampling. A leader that fails or is
// cancelled before publishing publishes nothing, and the others prefill
// themselves.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace dsv4::runtime {

class PromptShare {
 public:
  // True for exactly one caller: the leader.
  bool lead();
  // The leader's session state after the prompt (nullptr: none; the others prefill themselves).
  void publish(std::shared_ptr<const std::vector<uint8_t>> state);
  // A follower: waits until the leader published (nullptr when it published
  // nothing) or `cancelled()` (polled every 50 ms) says stop (nullptr).
  std::shared_ptr<const std::vector<uint8_t>> wait(const std::function<bool()>& cancelled);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool led_ = false, published_ = false;
  std::shared_ptr<const std::vector<uint8_t>> state_;
};

}  // namespace dsv4::runtime
