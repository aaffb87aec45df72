// Waits for a new value of a mailbox's request word that another agent (a GPU kernel, through mapped memory)
// writes: spins while requests come within k_busy of the previous one, else naps k_nap between looks. The
// host experts' and the expert streamer's workers (cuda_host_experts.cu, expert_stream.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace dsv4 {

class RequestPoll {
 public:
  // last: the word's value before the first request (read before the polling thread starts).
  explicit RequestPoll(uint32_t last) : last_(last), idle_since_(std::chrono::steady_clock::now()) {}
  // The next request's value, or 0 once `stop` is set (request values are never 0).
  uint32_t next(const uint32_t* word, const std::atomic<bool>& stop);
  // The request was served: the busy spinning window restarts.
  void served() { idle_since_ = std::chrono::steady_clock::now(); }

  static constexpr std::chrono::milliseconds k_busy{20};
  static constexpr std::chrono::microseconds k_nap{100};

 private:
  uint32_t last_;
  std::chrono::steady_clock::time_point idle_since_;
};

}  // namespace dsv4
