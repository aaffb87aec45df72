// HostExperts: the routed experts a GPU backend leaves to the host (host_experts.h).
//
// Work split: phase 1 over (host assignment, gate/up row) pairs, then the mid
// vectors are quantised, then phase 2 over (host assignment, down row) pairs;
// each phase is one SpinTeam::run over chunks of consecutive rows, so a thread
// streams whole consecutive rows of one expert matrix.
#include "backend/host/host_experts.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "core/assert.h"
#include "core/spin_team.h"
#include "quant/dot_fast.h"
#include "quant/quant.h"

namespace dsv4 {

namespace {

int default_threads() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores - 1);
}

// Rows per chunk: at least 16 (a few KiB of weights streamed by one thread), about 8 chunks per thread.
size_t chunk_rows(size_t n, int threads) { return std::max<size_t>(16, n / (static_cast<size_t>(threads) * 8)); }

const uint8_t* expert_row(const HostExpertMatrix& m, int32_t e, int64_t r) {
  return m.base + static_cast<int64_t>(e) * m.expert_bytes +
         r * static_cast<int64_t>(ggml_row_bytes(m.type, static_cast<uint64_t>(m.cols)));
}

}  // namespace

HostExperts::HostExperts(int n_threads)
    : team_(std::make_unique<SpinTeam>(n_threads > 0 ? n_threads : default_threads())) {}
HostExperts::~HostExperts() = default;

int HostExperts::threads() const { return team_->size(); }

int64_t HostExperts::run(const HostExpertTask& t) {
  const int64_t D = t.gate.cols, F = t.gate.rows, n_assign = t.n_tokens * t.k;
  DSV4_ASSERT(t.up.cols == D && t.up.rows == F && t.down.cols == F && t.down.rows == D,
              "host experts: gate/up [%lld x %lld] and down [%lld x %lld] do not chain", static_cast<long long>(F),
              static_cast<long long>(D), static_cast<long long>(t.down.rows), static_cast<long long>(t.down.cols));
  DSV4_ASSERT(n_assign >= 0 && t.y && (n_assign == 0 || (t.x && t.experts && t.weights)), "host experts: task");
  std::vector<int64_t> mine;  // the host's assignments, in order
  for (int64_t a = 0; a < n_assign; ++a) {
    if (t.experts[a] < 0)
      mine.push_back(a);
    else if (t.zero_others)
      std::memset(t.y + a * D, 0, static_cast<size_t>(D) * sizeof(float));
  }
  if (mine.empty()) return 0;
  const auto n_mine = static_cast<int64_t>(mine.size());
  const bool same_act = quant::act_type(t.gate.type) == quant::act_type(t.up.type);
  const size_t xg_bytes = quant::act_row_bytes(t.gate.type, D), xu_bytes = quant::act_row_bytes(t.up.type, D);
  const size_t mq_bytes = quant::act_row_bytes(t.down.type, F);
  // act_: [n_tokens] x rows for gate, [n_tokens] for up (unless the same format), [n_mine] mid rows; 64-byte
  // aligned rows.
  auto pad = [](size_t b) { return (b + 63) / 64 * 64; };
  const size_t xg_stride = pad(xg_bytes), xu_stride = pad(xu_bytes), mq_stride = pad(mq_bytes);
  const size_t need = static_cast<size_t>(t.n_tokens) * (xg_stride + (same_act ? 0 : xu_stride)) +
                      static_cast<size_t>(n_mine) * mq_stride + 64;
  if (need > act_bytes_) {
    act_ = std::make_unique<uint8_t[]>(need);
    act_bytes_ = need;
  }
  const size_t mid_need = static_cast<size_t>(n_mine * F);
  if (mid_need > mid_floats_) {
    mid_ = std::make_unique<float[]>(mid_need);
    mid_floats_ = mid_need;
  }
  uint8_t* base = act_.get() + (64 - reinterpret_cast<uintptr_t>(act_.get()) % 64) % 64;
  uint8_t* xg = base;
  uint8_t* xu = same_act ? xg : xg + static_cast<size_t>(t.n_tokens) * xg_stride;
  uint8_t* mq =
      xu + (same_act ? static_cast<size_t>(t.n_tokens) * xg_stride : static_cast<size_t>(t.n_tokens) * xu_stride);
  std::vector<bool> quantised(static_cast<size_t>(t.n_tokens), false);
  for (int64_t a : mine) {
    const int64_t tok = a / t.k;
    if (quantised[static_cast<size_t>(tok)]) continue;
    quantised[static_cast<size_t>(tok)] = true;
    quant::quantize_act(t.gate.type, t.x + tok * D, xg + static_cast<size_t>(tok) * xg_stride, D);
    if (!same_act) quant::quantize_act(t.up.type, t.x + tok * D, xu + static_cast<size_t>(tok) * xu_stride, D);
  }
  auto expert_of = [&](int64_t a) {
    const int32_t e = -1 - t.experts[a];
    DSV4_ASSERT(e >= 0 && e < t.gate.count && e < t.up.count && e < t.down.count, "host experts: expert %d of %lld", e,
                static_cast<long long>(t.gate.count));
    return e;
  };
  const float c = t.clamp;
  float* mid = mid_.get();
  team_->run(static_cast<size_t>(n_mine * F), chunk_rows(static_cast<size_t>(n_mine * F), team_->size()),
             [&](size_t b, size_t e) {
               for (size_t item = b; item < e; ++item) {
                 const auto j = static_cast<int64_t>(item / static_cast<size_t>(F));
                 const auto f = static_cast<int64_t>(item % static_cast<size_t>(F));
                 const int64_t a = mine[static_cast<size_t>(j)];
                 const int32_t ex = expert_of(a);
                 const int64_t tok = a / t.k;
                 const float g = quant::vec_dot_q_fast(t.gate.type, expert_row(t.gate, ex, f),
                                                       xg + static_cast<size_t>(tok) * xg_stride, D);
                 const float u = quant::vec_dot_q_fast(t.up.type, expert_row(t.up, ex, f),
                                                       xu + static_cast<size_t>(tok) * xu_stride, D);
                 const float gt = std::min(g, c);
                 const float up = std::clamp(u, -c, c);
                 mid[j * F + f] = gt * (1.0f / (1.0f + std::exp(-gt))) * up * t.weights[a];
               }
             });
  for (int64_t j = 0; j < n_mine; ++j) {
    act_quant_row(mid + j * F, F, t.mid_quant);
    quant::quantize_act(t.down.type, mid + j * F, mq + static_cast<size_t>(j) * mq_stride, F);
  }
  team_->run(static_cast<size_t>(n_mine * D), chunk_rows(static_cast<size_t>(n_mine * D), team_->size()),
             [&](size_t b, size_t e) {
               for (size_t item = b; item < e; ++item) {
                 const auto j = static_cast<int64_t>(item / static_cast<size_t>(D));
                 const auto d = static_cast<int64_t>(item % static_cast<size_t>(D));
                 const int64_t a = mine[static_cast<size_t>(j)];
                 t.y[a * D + d] = quant::vec_dot_q_fast(t.down.type, expert_row(t.down, expert_of(a), d),
                                                        mq + static_cast<size_t>(j) * mq_stride, F);
               }
             });
  return n_mine;
}

}  // namespace dsv4
