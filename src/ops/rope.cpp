#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace dsv4 {

// omega_j = theta^(-2j/n_rot); with YaRN (model-spec.md §5.3, no magnitude
// scaling) blended towards omega_j / factor over the ramp [lo, hi] of pairs:
//   corr(beta) = n_rot * ln(orig_ctx / (2 pi beta)) / (2 ln theta)
//   lo = max(floor(corr(beta_fast)), 0), hi = min(ceil(corr(beta_slow)), n_rot - 1)
//   ramp_j = clamp((j - lo) / (hi - lo), 0, 1); omega_j = omega0_j (1 - ramp_j) + omega0_j / factor * ramp_j
// Computed in fp32 exactly the way the reference and transformers build their
// tables (powf of a float exponent, reciprocals, the blend as separate float
// ops), so our angles match theirs bit for bit: a 1-ulp difference in omega
// grows to ~1e-5 rad at position ~800.
void rope_frequencies(const RopeParams& p, float* omega) {
  const int half = p.n_rot / 2;
  double lo = 0, hi = 0;
  if (p.yarn) {
    auto corr = [&](double beta) {
      return p.n_rot * std::log(static_cast<double>(p.orig_ctx) / (beta * 2.0 * M_PI)) /
             (2.0 * std::log(static_cast<double>(p.theta)));
    };
    lo = std::max(std::floor(corr(p.beta_fast)), 0.0);
    hi = std::min(std::ceil(corr(p.beta_slow)), static_cast<double>(p.n_rot - 1));
    if (hi == lo) hi += 0.001;
  }
  for (int j = 0; j < half; ++j) {
    const float expo = static_cast<float>(2 * j) / static_cast<float>(p.n_rot);
    const float pos_freq = std::pow(p.theta, expo);  // float pow, as torch computes base ** exponent
    const float extrap = 1.0f / pos_freq;
    if (!p.yarn) {
      omega[j] = extrap;
      continue;
    }
    const float interp = 1.0f / (p.factor * pos_freq);
    float ramp = (static_cast<float>(j) - static_cast<float>(lo)) / static_cast<float>(hi - lo);
    ramp = std::min(std::max(ramp, 0.0f), 1.0f);
    const float e = 1.0f - ramp;  // extrapolation weight
    const float a = interp * (1.0f - e);
    const float b = extrap * e;
    omega[j] = a + b;
  }
}

}  // namespace dsv4
