// The CPU's share of a decode batch's host experts (backend/host/host_share.h): the plan's choice is the best
// split by its coefficients, the decaying fit recovers a line, and the adaptive control, fed the times of a
// simulated CPU and bus, settles on the best split, follows a CPU that slows down or speeds up, and probes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/host/host_share.h"

using namespace dsv4;

namespace {

// When the later of the two paths ends, for h host experts of u.
double end_of(const HostShareRule& r, int u, int h) {
  const double cpu = h > 0 ? r.c0 + r.c1 * h : 0.0;
  const double gpu = r.g0 + r.b * (u - h);
  return std::max(cpu, gpu);
}

TEST(HostShare, AFixedShareRoundsItsPartOfTheUsedExperts) {
  HostShareRule r;
  r.share = 0.25f;
  EXPECT_EQ(host_share_count(r, 0), 0);
  EXPECT_EQ(host_share_count(r, 4), 1);
  EXPECT_EQ(host_share_count(r, 6), 2);   // rint(1.5): to even
  EXPECT_EQ(host_share_count(r, 10), 2);  // rint(2.5): to even
  r.share = 1.0f;
  EXPECT_EQ(host_share_count(r, 5), 5);
  r.share = 0.0f;
  EXPECT_EQ(host_share_count(r, 5), 0);
}

TEST(HostShare, TheRuleTakesTheSplitThatEndsSoonest) {
  std::mt19937 g(7);
  std::uniform_real_distribution<float> c0(0.0f, 300.0f), c1(5.0f, 2000.0f), g0(0.0f, 300.0f), b(5.0f, 500.0f);
  for (int i = 0; i < 20000; ++i) {
    HostShareRule r;
    r.share = -1.0f;
    r.c0 = c0(g);
    r.c1 = c1(g);
    r.g0 = g0(g);
    r.b = b(g);
    const int u = static_cast<int>(g() % 97);
    const int h = host_share_count(r, u);
    ASSERT_GE(h, 0);
    ASSERT_LE(h, u);
    double best = 1e30;
    for (int k = 0; k <= u; ++k) best = std::min(best, end_of(r, u, k));
    ASSERT_LE(end_of(r, u, h), best * (1 + 1e-5) + 1e-3) << "u " << u << " h " << h;
  }
}

TEST(HostShare, ThePlanProbesACpuThatGotNothingOnlyUnderAuto) {
  HostShareRule r;
  r.share = -1.0f;
  r.c0 = 1000.0f;
  r.c1 = 5000.0f;
  r.g0 = 10.0f;
  r.b = 100.0f;
  int32_t since = 0;
  int probes = 0;
  for (int i = 0; i < 3 * k_host_probe_after + 10; ++i) {
    const int h = host_share_plan(r, 5, since);
    ASSERT_LE(h, 1);
    probes += h;
    EXPECT_EQ(host_share_plan(r, 0, since), 0);  // an op without host experts neither probes nor counts
  }
  EXPECT_EQ(probes, 3);  // ops 257, 514, 771
  r.probe_after = 1000;  // a longer interval (HostShareControl's after probes that found the CPU slow)
  since = 0;
  probes = 0;
  for (int i = 0; i < 2500; ++i) probes += host_share_plan(r, 5, since);
  EXPECT_EQ(probes, 2);  // ops 1001, 2002
  r.share = 0.0f;        // a fixed share of 0 never probes
  since = 10 * k_host_probe_after;
  EXPECT_EQ(host_share_plan(r, 5, since), 0);
  r.share = std::nanf("");  // a torn or garbage rule gives a count in range, not a crash
  r.c1 = std::nanf("");
  EXPECT_GE(host_share_count(r, 5), 0);
  EXPECT_LE(host_share_count(r, 5), 5);
}

TEST(HostShare, TheDecayingLineFitsALineAndKeepsItsPriorSlopeWithoutSpread) {
  DecayingLine fit(0.97, 0.0, 10.0);
  for (int i = 0; i < 2000; ++i) {
    const double x = i % 5;
    fit.add(x, 40.0 + 140.0 * x);
  }
  EXPECT_NEAR(fit.slope(), 140.0, 0.5);
  EXPECT_NEAR(fit.intercept(), 40.0, 1.5);
  EXPECT_NEAR(fit.weight(), 1.0 / (1.0 - 0.97), 1e-6);

  // Every sample at x = 6: the prediction there is the samples' level, the slope stays near its prior.
  DecayingLine one(0.97, 0.0, 140.0);
  for (int i = 0; i < 500; ++i) one.add(6.0, 900.0);
  EXPECT_NEAR(one.intercept() + 6.0 * one.slope(), 900.0, 1.0);
  EXPECT_NEAR(one.slope(), 140.0, 10.0);
}

TEST(HostShare, TheDecayingRateForgetsByRequests) {
  DecayingRate r(0.97, 250.0);
  for (int i = 0; i < 300; ++i) {
    r.age();
    r.add(1 + i % 3, 600.0 * (1 + i % 3));
  }
  EXPECT_NEAR(r.rate(), 600.0, 1.0);
  EXPECT_NEAR(r.spread(), 0.0, 5.0);
  for (int i = 0; i < 256; ++i) r.age();  // requests that gave the CPU nothing
  r.add(1, 100.0);                        // then one fast sample all but replaces the old rate
  EXPECT_LT(r.rate(), 120.0);             // (the old rate weighs 256 ops later 0.03 of a sample, the prior 0.01: ~115)
  // A jittery CPU's spread is its mean distance from the rate.
  DecayingRate j(0.97, 600.0);
  for (int i = 0; i < 500; ++i) {
    j.age();
    j.add(1, i % 2 ? 500.0 : 700.0);
  }
  EXPECT_NEAR(j.rate(), 600.0, 5.0);
  EXPECT_NEAR(j.spread(), 100.0, 5.0);
}

// A simulated offload: per op u host experts are used (3..6, as a 24 GiB budget gives Flash); the CPU takes
// cpu_fixed + cpu_per h microseconds (with jitter), the GPU gpu_fixed + bus_per (u - h). `since` is the plan's
// state on the GPU.
struct Sim {
  double cpu_fixed = 80, cpu_per = 600, gpu_fixed = 40, bus_per = 140, jitter = 0.05;
  std::mt19937 g{11};
  int32_t since = 0;

  int used() { return 3 + static_cast<int>(g() % 4); }
  double cpu(int h) {
    std::uniform_real_distribution<double> j(1.0 - jitter, 1.0 + jitter);
    return (cpu_fixed + cpu_per * h) * j(g);
  }
  double gpu(int gathered) const { return gpu_fixed + bus_per * gathered; }
  int best(int u) const {
    int best_h = 0;
    double best_t = 1e30;
    for (int h = 0; h <= u; ++h) {
      const double t = std::max(h > 0 ? cpu_fixed + cpu_per * h : 0.0, gpu_fixed + bus_per * (u - h));
      if (t < best_t - 1e-9) best_t = t, best_h = h;
    }
    return best_h;
  }
};

// Runs n ops through the plan and the control (a request, and so a measurement, only for h > 0); returns how
// many chose the best split, the experts the CPU took and the GPU's total wait.
struct Outcome {
  int best = 0, host_total = 0;
  double waited_us = 0;
};
Outcome drive(HostShareControl& c, Sim& s, int n) {
  Outcome out;
  for (int i = 0; i < n; ++i) {
    const int u = s.used();
    const int32_t skipped = s.since;
    const int h = host_share_plan(c.rule(), u, s.since);
    out.best += h == s.best(u);
    out.host_total += h;
    if (h == 0) continue;
    const double cpu = s.cpu(h), gpu = s.gpu(u - h);
    out.waited_us += std::max(0.0, cpu - gpu);
    c.observe_cpu(h, u, cpu, skipped);
    c.observe_gpu(u - h, gpu);
  }
  return out;
}

TEST(HostShareControl, SettlesOnTheBestSplitFromAnOptimisticCalibration) {
  Sim s;  // the best split: none at u = 3..4 (one would take 680 us, the gather 460..600), one at u = 5..6
  auto c = HostShareControl::adaptive(/*cpu_us_per_expert=*/250.0, /*bus_us_per_expert=*/150.0);
  drive(c, s, 200);  // settle
  const Outcome r = drive(c, s, 1000);
  EXPECT_GE(r.best, 900) << "best split in " << r.best << " of 1000";
  EXPECT_GT(r.host_total, 400);  // the CPU does take experts (one at about half the ops)
  EXPECT_LT(r.waited_us / 1000, 30.0);
  EXPECT_NEAR(c.gpu_fit().slope(), 140.0, 10.0);  // sampled at 4 and 5 gathered experts only
}

TEST(HostShareControl, AFastCpuTakesMoreAndASlowOneNone) {
  Sim s;
  s.cpu_per = 100;  // faster than the bus: most of the experts
  auto c = HostShareControl::adaptive(250.0, 150.0);
  drive(c, s, 300);
  Outcome r = drive(c, s, 500);
  EXPECT_GE(r.best, 450);
  EXPECT_GT(r.host_total, 500 * 2);

  s.cpu_per = 2500;  // the CPU slows down (another process): within a few ops it takes nothing
  drive(c, s, 50);
  r = drive(c, s, 200);
  EXPECT_LE(r.host_total, 1);  // at most a probe
  EXPECT_LT(r.waited_us, 3000.0);
}

TEST(HostShareControl, ProbesACpuThatTookNothingLessOftenAndSeesItRecover) {
  Sim s;
  s.cpu_per = 5000;
  auto c = HostShareControl::adaptive(5000.0, 150.0);
  // Each probe one expert that takes 5 ms and finds the CPU still too slow: the intervals double from
  // k_host_probe_after to k_host_probe_max, so probes come after 256, 512, 1024, 2048, 4096, 4096 ... skipped ops.
  EXPECT_EQ(c.rule().probe_after, k_host_probe_after);
  int probes = 0, ops = 0;
  for (int gap = k_host_probe_after; ops + gap + 1 <= 20000; gap = std::min(2 * gap, k_host_probe_max)) {
    ops += gap + 1;
    ++probes;
  }
  const Outcome slow = drive(c, s, 20000);
  EXPECT_EQ(slow.host_total, probes);  // 7
  EXPECT_EQ(c.rule().probe_after, k_host_probe_max);

  s.cpu_per = 100;  // the CPU is fast again: the next probe's time brings the share back, and the interval
  drive(c, s, k_host_probe_max + 10);
  EXPECT_EQ(c.rule().probe_after, k_host_probe_after);
  const Outcome r = drive(c, s, 500);
  EXPECT_GE(r.best, 450);
}

TEST(HostShareControl, AFixedShareIgnoresTheTimes) {
  auto c = HostShareControl::fixed(0.5f);
  const HostShareRule before = c.rule();
  c.observe_cpu(3, 6, 1e6);
  c.observe_gpu(3, 1.0);
  EXPECT_EQ(c.rule().share, 0.5f);
  EXPECT_EQ(host_share_count(c.rule(), 6), host_share_count(before, 6));
  EXPECT_FALSE(c.adaptive());
}

}  // namespace
