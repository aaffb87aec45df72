// HostShareControl and DecayingLine (host_share.h): the CPU's share of a decode batch's host experts, fitted to
// what each request measured.
#include "backend/host/host_share.h"

#include <algorithm>
#include <cmath>

namespace dsv4 {

// Minimises sum_i w_i (y_i - p - q x_i)^2 + k_prior_weight ((p - p0)^2 + (q - q0)^2), w_i = decay^age_i:
//   [W + l   Wx    ] [p]   [Wy  + l p0]
//   [Wx      Wxx + l] [q] = [Wxy + l q0]     (l = k_prior_weight; the determinant is > 0: Wx^2 <= W Wxx)
void DecayingLine::add(double x, double y) {
  w_ = decay_ * w_ + 1.0;
  wx_ = decay_ * wx_ + x;
  wxx_ = decay_ * wxx_ + x * x;
  wy_ = decay_ * wy_ + y;
  wxy_ = decay_ * wxy_ + x * y;
  const double l = k_prior_weight;
  const double a = w_ + l, c = wxx_ + l, r0 = wy_ + l * p0_, r1 = wxy_ + l * q0_;
  const double det = a * c - wx_ * wx_;
  p_ = (r0 * c - wx_ * r1) / det;
  q_ = (a * r1 - wx_ * r0) / det;
}

void DecayingRate::age(int n) {
  const double f = std::pow(decay_, n);
  w_ *= f;
  wx_ *= f;
  wy_ *= f;
  abs_res_ *= f;
}

void DecayingRate::add(double x, double y) {
  w_ += 1.0;
  wx_ += x;
  wy_ += y;
  r_ = (k_prior_weight * r0_ + wy_) / (k_prior_weight + wx_);
  abs_res_ += std::abs(y - r_ * x);
}

HostShareControl::HostShareControl(bool adaptive, float share, double cpu_us, double bus_us)
    : adaptive_(adaptive), cpu_(k_decay, cpu_us), gpu_(k_decay, 0.0, bus_us), cpu_prior_(cpu_us), bus_prior_(bus_us) {
  rule_.share = adaptive ? -1.0f : share;
  if (adaptive) update_rule();
}

HostShareControl HostShareControl::fixed(float share) { return HostShareControl(false, share, 1.0, 1.0); }

HostShareControl HostShareControl::adaptive(double cpu_us_per_expert, double bus_us_per_expert) {
  return HostShareControl(true, -1.0f, std::max(cpu_us_per_expert, 1e-3), std::max(bus_us_per_expert, 1e-3));
}

void HostShareControl::observe_cpu(int host, int used, double cpu_us, int skipped) {
  if (!adaptive_) return;
  cpu_.age(1 + std::max(skipped, 0));
  if (host > 0) cpu_.add(host, cpu_us);
  update_rule();
  const bool probe = skipped >= rule_.probe_after;
  rule_.probe_after = probe && host_share_count(rule_, used) == 0 ? std::min(2 * rule_.probe_after, k_host_probe_max)
                                                                  : k_host_probe_after;
}

void HostShareControl::observe_gpu(int gathered, double gpu_us) {
  if (!adaptive_ || !(gpu_us >= 0.0)) return;
  gpu_.add(gathered, gpu_us);
  update_rule();
}

// c0 is the CPU's spread (its slow end, for h > 0); slopes kept above a small floor, so that c1 + b > 0 whatever
// the samples did, and the GPU's intercept at 0 or more.
void HostShareControl::update_rule() {
  rule_.c0 = static_cast<float>(cpu_.spread());
  rule_.c1 = static_cast<float>(std::max(cpu_.rate(), 1e-3 * cpu_prior_));
  rule_.g0 = static_cast<float>(std::max(gpu_.intercept(), 0.0));
  rule_.b = static_cast<float>(std::max(gpu_.slope(), 0.25 * bus_prior_));
}

}  // namespace dsv4
