#include "core/spin_team.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dsv4 {

namespace {
thread_local bool t_in_run = false;  // SpinTeam::in_run()
}  // namespace

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

bool SpinTeam::in_run() { return t_in_run; }

// Pauses first, then yields the core between looks: 4,096 pauses (PAUSE teams) are ~0.1 ms on current x86
// cores, longer than a loop's last chunks usually take; yield teams yield after 64.
template <class Done>
void SpinTeam::wait_until(Done done) const {
  const int spins = yield_ ? 64 : 4096;
  for (int i = 0; !done(); ++i) {
    if (i < spins)
      cpu_relax();
    else
      std::this_thread::yield();
  }
}

SpinTeam::SpinTeam(int n_threads, std::chrono::microseconds spin, bool yield) : spin_(spin), yield_(yield) {
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker(); });
}

SpinTeam::~SpinTeam() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void SpinTeam::work() {
  for (;;) {
    const size_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (b >= n_) return;
    const size_t e = std::min(n_, b + grain_);
    (*fn_)(b, e);
    done_.fetch_add(e - b, std::memory_order_release);
  }
}

void SpinTeam::worker() {
  t_in_run = true;
  uint64_t seen = 0;
  auto last = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint64_t g = gen_.load(std::memory_order_acquire);
    if (g == seen || (g & 1u)) {
      if (std::chrono::steady_clock::now() - last < spin_) {
        if (yield_)
          std::this_thread::yield();
        else
          for (int i = 0; i < 32; ++i) cpu_relax();
        continue;
      }
      std::unique_lock<std::mutex> lock(mu_);
      ++sleepers_;
      cv_.wait(lock, [&] {
        const uint64_t now = gen_.load(std::memory_order_acquire);
        return stop_.load() || (now != seen && !(now & 1u));
      });
      --sleepers_;
      last = std::chrono::steady_clock::now();
      continue;
    }
    // Enter, then check that the call did not change meanwhile (the caller waits for inside_ == 0 before
    // rewriting it, after making gen_ odd).
    inside_.fetch_add(1, std::memory_order_seq_cst);
    if (gen_.load(std::memory_order_seq_cst) == g) work();
    inside_.fetch_sub(1, std::memory_order_acq_rel);
    seen = g;
    last = std::chrono::steady_clock::now();
  }
}

void SpinTeam::run(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  if (t_in_run) {
    fn(0, n);
    return;
  }
  if (workers_.empty()) {
    const size_t step = std::max<size_t>(grain, 1);
    for (size_t b = 0; b < n; b += step) fn(b, std::min(n, b + step));
    return;
  }
  struct InRun {
    InRun() { t_in_run = true; }
    ~InRun() { t_in_run = false; }
  } in_run;
  // Odd: workers stay out. (gen_ here and inside_ in worker(): each side writes one and then reads the other,
  // which needs sequential consistency for one of them to see the other's write.)
  gen_.fetch_add(1, std::memory_order_seq_cst);
  wait_until([&] { return inside_.load(std::memory_order_seq_cst) == 0; });
  fn_ = &fn;
  n_ = n;
  grain_ = std::max<size_t>(grain, 1);
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  gen_.fetch_add(1, std::memory_order_acq_rel);  // even: published
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sleepers_ > 0) cv_.notify_all();
  }
  work();
  wait_until([&] { return done_.load(std::memory_order_acquire) == n; });
}

}  // namespace dsv4
