#include "backend/host/expert_stream.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/host/request_poll.h"
#include "core/spin_team.h"
#include "core/log.h"

namespace dsv4 {

namespace {
using Clock = std::chrono::steady_clock;

[[noreturn]] void fatal(const char* what, uint64_t tag) {
  // The GPU is waiting on this side (or this side on the GPU): nothing can recover the step.
  std::fprintf(stderr, "dsv4: fatal: expert streaming: %s (request %u, position %u) within %llu s\n", what,
               static_cast<unsigned>(tag >> 32), static_cast<unsigned>(tag & 0xffffffffu) - 1,
               static_cast<unsigned long long>(ExpertStreamer::k_wait_limit_ns / 1000000000ull));
  std::abort();
}

// Waits until *word == want; fatal after the wait limit.
void wait_for(const uint64_t* word, uint64_t want, const char* what) {
  if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == want) return;
  const auto t0 = Clock::now();
  for (uint32_t i = 0;; ++i) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == want) return;
    cpu_relax();
    if ((i & 1023u) == 0 &&
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()) >
            ExpertStreamer::k_wait_limit_ns)
      fatal(what, want);
  }
}
}  // namespace

ExpertStreamer::ExpertStreamer(ExpertStreamBox* box, uint8_t* staging, int slots, size_t slot_bytes, int threads)
    : box_(box), staging_(staging), slots_(slots), slot_bytes_(slot_bytes) {
  if (threads <= 0) threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 16);
  team_ = std::make_unique<SpinTeam>(threads);
  // Requests are the ones posted after construction (read here: the worker may start after the first).
  const uint32_t seen = __atomic_load_n(&box_->request, __ATOMIC_ACQUIRE);
  thread_ = std::thread([this, seen] { worker(seen); });
}

ExpertStreamer::~ExpertStreamer() {
  stop_.store(true);
  thread_.join();
  if (stats_.requests > 0)
    log_info("expert streaming: %llu requests, %.2f experts and %.3f ms each, %.1f GB/s from the model file",
             static_cast<unsigned long long>(stats_.requests),
             static_cast<double>(stats_.experts) / static_cast<double>(stats_.requests),
             1e3 * stats_.seconds / static_cast<double>(stats_.requests),
             stats_.seconds > 0 ? stats_.bytes / stats_.seconds / 1e9 : 0.0);
}

int ExpertStreamer::threads() const { return team_->size(); }

// Serves each new request (RequestPoll: spinning while they come back to back, napping otherwise).
void ExpertStreamer::worker(uint32_t last) {
  RequestPoll poll(last);
  while (const uint32_t r = poll.next(&box_->request, stop_)) {
    serve(r);
    poll.served();
  }
}

void ExpertStreamer::serve(uint32_t s) {
  const auto t0 = Clock::now();
  const int32_t count = __atomic_load_n(&box_->count, __ATOMIC_ACQUIRE);
  if (count < 0 || count > k_stream_max_experts) {
    std::fprintf(stderr, "dsv4: fatal: expert streaming: request %u lists %d experts\n", s, count);
    std::abort();
  }
  const uint8_t* src[3];
  size_t bytes[3], total = 0;
  for (int m = 0; m < 3; ++m) {
    src[m] = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(box_->src[m]));
    bytes[m] = static_cast<size_t>(box_->bytes[m]);
    total += bytes[m];
  }
  if (total > slot_bytes_) {
    std::fprintf(stderr, "dsv4: fatal: expert streaming: an expert of %zu bytes in slots of %zu\n", total, slot_bytes_);
    std::abort();
  }
  // One stage position per chunk, claimed in increasing order: a copy waits only on the GPU's copy of a smaller
  // position, which some thread has already staged or is staging.
  team_->run(static_cast<size_t>(count), 1, [&](size_t b, size_t e) {
    for (size_t c = b; c < e; ++c) {
      const auto pos = static_cast<int32_t>(c);
      const size_t r = c % static_cast<size_t>(slots_);
      if (c >= static_cast<size_t>(slots_))
        wait_for(&box_->consumed[r], stream_tag(s, pos - slots_), "the GPU did not hand a staging slot back");
      const int32_t ex = box_->list[c];
      if (ex < 0 || ex >= box_->n_expert) {
        std::fprintf(stderr, "dsv4: fatal: expert streaming: request %u lists expert %d of %d\n", s, ex,
                     box_->n_expert);
        std::abort();
      }
      uint8_t* dst = staging_ + r * slot_bytes_;
      for (int m = 0; m < 3; ++m) {
        std::memcpy(dst, src[m] + static_cast<size_t>(ex) * bytes[m], bytes[m]);
        dst += bytes[m];
      }
      __atomic_store_n(&box_->ready[r], stream_tag(s, pos), __ATOMIC_RELEASE);
    }
  });
  stats_.requests += 1;
  stats_.experts += static_cast<uint64_t>(count);
  stats_.bytes += static_cast<double>(count) * static_cast<double>(total);
  stats_.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  served_.store(stats_.requests, std::memory_order_release);
}

}  // namespace dsv4
