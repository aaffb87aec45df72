// HostExpertWorker's protocol with a thread playing the GPU (as cuda_host_experts.cu does it): the plan's h from
// the rule the worker writes, no request for h = 0, the host's rows of every request bitwise HostExperts' own,
// the totals, and `auto` taking most experts when the simulated gather is slow and none when it is instant.
#include <gtest/gtest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backend/host/host_expert_worker.h"
#include "core/float_conv.h"
#include "quant/quant.h"

using namespace dsv4;

namespace {

constexpr int64_t k_E = 16, k_F = 128, k_D = 256, k_k = 6;

std::vector<uint8_t> random_matrix(std::mt19937& g, GgmlType t, int64_t rows, int64_t cols) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = d(g);
  const size_t rb = ggml_row_bytes(t, static_cast<uint64_t>(cols));
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) quant::quantize_row(t, x.data() + r * cols, out.data() + r * rb, cols);
  return out;
}

// The GPU's side, one token per op (k experts, all of them in host memory: u = k).
struct Gpu {
  std::mt19937 g{3};
  std::vector<uint8_t> gate, up, down;
  std::vector<float> x, w, y;  // the mailbox's buffers (mapped memory on a GPU)
  std::vector<int32_t> ids;
  HostMailbox box;
  HostShareRule rules[HostExpertWorker::k_slots];
  HostExpertTask task;
  int32_t since = 0, since_used = 0;
  uint32_t seq = 0;

  Gpu() {
    gate = random_matrix(g, GgmlType::Q8_0, k_E * k_F, k_D);
    up = random_matrix(g, GgmlType::Q8_0, k_E * k_F, k_D);
    down = random_matrix(g, GgmlType::Q8_0, k_E * k_D, k_F);
    x.resize(k_D);
    w.resize(k_k);
    y.assign(static_cast<size_t>(k_k * k_D), 0.0f);
    ids.resize(k_k);
    auto mat = [](const std::vector<uint8_t>& b, int64_t rows, int64_t cols) {
      return HostExpertMatrix{GgmlType::Q8_0, b.data(), rows, cols, static_cast<int64_t>(b.size()) / k_E, k_E};
    };
    task.gate = mat(gate, k_F, k_D);
    task.up = mat(up, k_F, k_D);
    task.down = mat(down, k_D, k_F);
    task.n_tokens = 1;
    task.k = k_k;
    task.x = x.data();
    task.experts = ids.data();
    task.weights = w.data();
    task.y = y.data();
    task.zero_others = false;
  }

  // One op: k distinct experts, the plan's h from the rule (the first h in expert order are the host's), then
  // (h > 0) the request, the "gather" (gather_us per gathered expert, spinning), the wait and the times.
  // Returns h. check: the host's rows against HostExperts computing the task alone (bitwise).
  int op(HostExpertWorker& worker, uint32_t job, double gather_us, HostExperts& alone, bool check) {
    std::vector<int32_t> e(k_E);
    for (int64_t i = 0; i < k_E; ++i) e[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    std::shuffle(e.begin(), e.end(), g);
    e.resize(k_k);
    std::sort(e.begin(), e.end());
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(g);
    for (auto& v : w) v = 0.1f + 0.1f * std::abs(d(g));
    const int before = since, before_used = since_used;
    const int h = host_share_plan(rules[0], static_cast<int>(k_k), since);
    since_used = h > 0 ? 0 : before_used + static_cast<int>(k_k);
    for (int64_t a = 0; a < k_k; ++a) ids[static_cast<size_t>(a)] = a < h ? -1 - e[static_cast<size_t>(a)] : e[a];
    if (h == 0) return 0;
    box.job = job;
    box.gathered = static_cast<uint32_t>(k_k - h);
    box.skipped = static_cast<uint32_t>(before);
    box.skipped_used = static_cast<uint32_t>(before_used);
    seq = seq + 1 == 0 ? 1 : seq + 1;
    const auto posted = std::chrono::steady_clock::now();
    __atomic_store_n(&box.request, seq, __ATOMIC_RELEASE);
    const auto until = posted + std::chrono::duration<double, std::micro>(gather_us * static_cast<double>(k_k - h));
    while (std::chrono::steady_clock::now() < until) {
    }
    const auto arrived = std::chrono::steady_clock::now();
    while (__atomic_load_n(&box.answer, __ATOMIC_ACQUIRE) != seq) std::this_thread::yield();
    const auto done = std::chrono::steady_clock::now();
    if (check) {
      std::vector<float> want(y.size(), 0.0f);
      HostExpertTask t = task;
      t.y = want.data();
      alone.run(t);
      for (int64_t a = 0; a < h; ++a)
        for (int64_t i = 0; i < k_D; ++i) {
          const size_t j = static_cast<size_t>(a * k_D + i);
          EXPECT_EQ(std::bit_cast<uint32_t>(y[j]), std::bit_cast<uint32_t>(want[j])) << "assignment " << a;
        }
    }
    box.gpu_us = std::chrono::duration<float, std::micro>(arrived - posted).count();
    box.wait_us = std::chrono::duration<float, std::micro>(done - arrived).count();
    __atomic_store_n(&box.timed, seq, __ATOMIC_RELEASE);
    return h;
  }
};

TEST(HostExpertWorker, AFixedShareIsServedBitwiseAndCounted) {
  Gpu gpu;
  HostExpertWorker worker(2, &gpu.box, gpu.rules);
  worker.set_controls(HostShareControl::fixed(0.5f));
  const uint32_t job = worker.add_job(gpu.task);
  HostExperts alone(1);
  int host = 0;
  for (int i = 0; i < 20; ++i) host += gpu.op(worker, job, 0.0, alone, true);
  EXPECT_EQ(host, 20 * 3);  // rint(0.5 x 6)
  worker.stop();
  const auto& s = worker.stats();
  EXPECT_EQ(s.calls, 20u);
  EXPECT_EQ(s.host, 60u);
  EXPECT_EQ(s.ops, 20u);
  EXPECT_EQ(s.used, 120u);
  EXPECT_EQ(s.assignments, 60u);
  EXPECT_EQ(s.timed, 19u);  // each request's times are read with the next one
}

// `auto` seeded with a CPU 100x too slow (no expert for it) and the true bus: the probe after
// k_host_probe_after ops finds the CPU fast beside a slow gather (10 ms an expert, far above the CPU's ~0.1 ms
// for these small experts, and above it under the sanitizers on a loaded machine), which then takes most.
TEST(HostExpertWorker, AutoFindsAFastCpuBesideASlowGather) {
  Gpu gpu;
  HostExpertWorker worker(2, &gpu.box, gpu.rules);
  worker.set_controls(HostShareControl::adaptive(/*cpu_us_per_expert=*/1e6, /*bus_us_per_expert=*/10000.0));
  const uint32_t job = worker.add_job(gpu.task);
  HostExperts alone(1);
  int first = 0;
  while (first < 3 * k_host_probe_after && gpu.op(worker, job, 10000.0, alone, false) == 0) ++first;
  EXPECT_EQ(first, k_host_probe_after);  // ops 0..255 skip, op 256 probes
  int late = 0;
  for (int i = 0; i < 40; ++i) {
    const int h = gpu.op(worker, job, 10000.0, alone, i % 10 == 0);
    if (i >= 20) late += h;
  }
  EXPECT_GE(late, 20 * 3) << "the CPU took " << late << " of 120 experts in the last 20 ops";
  worker.stop();
  const auto& st = worker.stats();
  EXPECT_GE(st.ops, st.calls + static_cast<uint64_t>(first));  // the skipped ops before the probe are counted
  EXPECT_GE(st.host, static_cast<uint64_t>(late) + 1);         // the probe's expert and the late ops' among them
}

// `auto` seeded with a CPU 10x too fast beside an instant gather: the first requests show the CPU slower than
// the gather, and from then on it gets no expert but the probes.
TEST(HostExpertWorker, AutoGivesASlowerCpuNothingBesideAnInstantGather) {
  Gpu gpu;
  HostExpertWorker worker(2, &gpu.box, gpu.rules);
  worker.set_controls(HostShareControl::adaptive(/*cpu_us_per_expert=*/0.5, /*bus_us_per_expert=*/1.0));
  const uint32_t job = worker.add_job(gpu.task);
  HostExperts alone(1);
  for (int i = 0; i < 40; ++i) gpu.op(worker, job, 1.0, alone, i % 10 == 0);
  int later = 0;
  for (int i = 0; i < 200; ++i) later += gpu.op(worker, job, 1.0, alone, false);
  EXPECT_LE(later, 1) << "the CPU took " << later << " experts in 200 ops";
  worker.stop();
  EXPECT_GT(worker.stats().calls, 0u);
}

}  // namespace
