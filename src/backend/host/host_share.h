// How many of a decode batch's host-memory experts the CPU computes while the GPU gathers the others over the bus
// (--cpu-experts; cuda_host_experts.cuh, docs/design-notes/expert-offload.md).
//
// The two paths of one expert op, for u host experts the batch uses of which the CPU takes h (the first h in
// expert order) and the GPU gathers u - h:
//   cpu(h) = c0 + c1 h   (h > 0: the CPU's time from seeing the request to answering it; 0 for h = 0)
//   gpu(h) = g0 + b (u - h)   (the GPU's time from posting the request to waiting for the answer: the gather of
//                              u - h experts, then the device's experts)
// The op ends with the later of the two, so the best h minimises max(cpu(h), gpu(h)): cpu rises and gpu falls
// with h, so it is h0 = floor((g0 - c0 + b u) / (c1 + b)) (clamped to 0..u: the largest h with cpu(h) <= gpu(h))
// or h0 + 1, whichever ends sooner. HostShareRule carries the coefficients (microseconds) to the gather plan on
// the GPU, which knows u; host_share_count is that plan's choice, the same function on both sides.
//
// The plan posts a request to the CPU only for h > 0: an op that gives the CPU nothing costs no round trip. An
// op that would give it nothing after rule.probe_after such ops in a row (with `auto`) gives it one expert
// instead (host_share_plan), so that a CPU which became faster is seen again. Each probe that finds the CPU
// still not worth an expert doubles probe_after (k_host_probe_after up to k_host_probe_max), so a CPU that is
// slower than the bus costs a probe's wait every ~4,000 ops (~100 tokens of Flash) instead of every 256; a
// request the CPU was worth resets it.
//
// HostShareControl fits the coefficients to what each request measured (the CPU's time by its own clock, the
// GPU's path by the GPU's timer), weighting each by decay^age (the CPU's times by their age in ops that used
// host experts, the skipped ones included; the GPU's, a steadier path, by their age in requests), so the share
// follows a CPU whose speed changes (other processes, clocks) within a few tokens instead of trusting one
// calibration: a CPU slower than planned makes the GPU wait for it, which the next rules see. The CPU's time is fitted
// as a rate per expert, c0 being the spread of its times around that rate (a jittery CPU is planned at its slow end);
// the GPU's path as a line over the gathered experts. By the time a probe comes the old times weigh nothing (0.97^256 ~
// 4e-4), so the probe's time is the estimate.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"

namespace dsv4 {

constexpr int k_host_probe_after = 256;
constexpr int k_host_probe_max = 16 * k_host_probe_after;

struct HostShareRule {
  float share = 0.0f;  // >= 0: a fixed share, h = min(rint(share u), u); < 0: the coefficients below
  float c0 = 0.0f, c1 = 0.0f, g0 = 0.0f, b = 0.0f;  // microseconds (c1 + b > 0)
  int32_t probe_after = k_host_probe_after;         // `auto`: the ops that give the CPU nothing before a probe
};

// The plan's h for u used host experts (see the top of this file).
DSV4_HD int host_share_count(const HostShareRule& r, int u) {
  if (u <= 0) return 0;
  int h = 0;
  if (r.share >= 0.0f) {
    const float s = rintf(r.share * static_cast<float>(u));
    h = s >= static_cast<float>(u) ? u : static_cast<int>(s);
  } else {
    const float x = (r.g0 - r.c0 + r.b * static_cast<float>(u)) / (r.c1 + r.b);
    h = !(x > 0.0f) ? 0 : x >= static_cast<float>(u) ? u : static_cast<int>(x);  // NaN: 0
    if (h < u) {
      auto end = [&](int k) {
        const float cpu = k > 0 ? r.c0 + r.c1 * static_cast<float>(k) : 0.0f;
        const float gpu = r.g0 + r.b * static_cast<float>(u - k);
        return cpu > gpu ? cpu : gpu;
      };
      if (end(h + 1) < end(h)) ++h;
    }
  }
  return h;
}

// The plan's h with the probe: `since` (kept by the plan between ops) counts the ops in a row that used host
// experts and gave the CPU none; with `auto`, the op after r.probe_after of them gives it one.
DSV4_HD int host_share_plan(const HostShareRule& r, int u, int32_t& since) {
  if (u <= 0) return 0;
  int h = host_share_count(r, u);
  if (h == 0 && !(r.share >= 0.0f) && since >= r.probe_after) h = 1;
  since = h > 0 ? 0 : since + 1;
  return h;
}

// y ~ p + q x by least squares over samples weighted decay^age, pulled towards a prior (p0, q0) with the weight
// of k_prior_weight samples: with few samples, or all at one x, the slope stays near its prior.
class DecayingLine {
 public:
  DecayingLine(double decay, double p0, double q0) : decay_(decay), p0_(p0), q0_(q0), p_(p0), q_(q0) {}
  void add(double x, double y);
  double intercept() const { return p_; }
  double slope() const { return q_; }
  double weight() const { return w_; }  // the samples' total weight (at most 1 / (1 - decay))

  static constexpr double k_prior_weight = 0.5;

 private:
  double decay_, p0_, q0_, p_, q_;
  double w_ = 0, wx_ = 0, wxx_ = 0, wy_ = 0, wxy_ = 0;
};

// y ~ r x (a rate, no intercept) over samples weighted decay^age, where age counts age() calls (samples and
// ops without one alike): r = (k_prior_weight r0 + sum w y) / (k_prior_weight + sum w x). spread() is the
// weighted mean of |y - r x| of the samples, each against the rate that includes it (so that the first sample
// after the old ones have faded is not measured against them).
class DecayingRate {
 public:
  DecayingRate(double decay, double r0) : decay_(decay), r0_(r0), r_(r0) {}
  void age(int n = 1);           // n ops later
  void add(double x, double y);  // x > 0
  double rate() const { return r_; }
  double spread() const { return w_ > 0 ? abs_res_ / w_ : 0.0; }

  static constexpr double k_prior_weight = 0.01;  // the first sample all but replaces the prior

 private:
  double decay_, r0_, r_;
  double w_ = 0, wx_ = 0, wy_ = 0, abs_res_ = 0;
};

class HostShareControl {
 public:
  // A fixed share (--cpu-experts SHARE): the rule never changes.
  static HostShareControl fixed(float share);
  // Adaptive (--cpu-experts auto), from first estimates of the CPU's time per expert and the bus's per
  // gathered expert (microseconds; the runner's calibration).
  static HostShareControl adaptive(double cpu_us_per_expert, double bus_us_per_expert);

  const HostShareRule& rule() const { return rule_; }
  // A request the CPU answered: it computed `host` experts of the `used` host experts of its op in cpu_us, after
  // `skipped` ops that gave it none (a probe when that reached the rule's probe_after).
  void observe_cpu(int host, int used, double cpu_us, int skipped = 0);
  // The GPU's side of a request (timed by the GPU once it has the answer): it gathered `gathered` experts and
  // reached its wait gpu_us after posting the request.
  void observe_gpu(int gathered, double gpu_us);
  bool adaptive() const { return adaptive_; }
  const DecayingRate& cpu_fit() const { return cpu_; }
  const DecayingLine& gpu_fit() const { return gpu_; }

  static constexpr double k_decay = 0.97;  // a sample's weight halves after ~23 ops (half a token at Flash)

 private:
  HostShareControl(bool adaptive, float share, double cpu_us, double bus_us);
  void update_rule();

  bool adaptive_;
  DecayingRate cpu_;  // cpu_us against host experts (h > 0)
  DecayingLine gpu_;  // gpu_us against gathered experts
  double cpu_prior_, bus_prior_;
  HostShareRule rule_;
};

}  // namespace dsv4
