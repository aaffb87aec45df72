#include "backend/host/request_poll.h"

#include <thread>

#include "core/spin_team.h"

namespace dsv4 {

uint32_t RequestPoll::next(const uint32_t* word, const std::atomic<bool>& stop) {
  while (!stop.load(std::memory_order_relaxed)) {
    const uint32_t r = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if (r != last_) {
      last_ = r;
      return r;
    }
    if (std::chrono::steady_clock::now() - idle_since_ < k_busy) {
      for (int i = 0; i < 64; ++i) cpu_relax();
    } else {
      std::this_thread::sleep_for(k_nap);
    }
  }
  return 0;
}

}  // namespace dsv4
