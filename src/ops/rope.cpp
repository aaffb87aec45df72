#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace dsv4 {

// omega_j = theta^(-2j/n_rot); with YaRN (model-spec.md §5.3, no magnitude
// scaling) blended towards omega_j / factor over the ramp [lo, hi] of pairs:
//   corr(beta) = n_rot * ln(orig_ctx / (2 pi beta)) / (2 ln theta)
//   lo = max(floor(corr(beta_fast)), 0), hi = min(ceil(corr(beta_slow)), n_rot - 1)
//   ramp_j = clamp((j - lo) / (hi - lo), 0, 1); omega_j = omega0_j (1 - ramp_j) + omega0_j / factor * ramp_j
void rope_frequencies(const RopeParams& p, float* omega) {
  const int half = p.n_rot / 2;
  double lo = 0, hi = 0;
  if (p.yarn) {
    auto corr = [&](double beta) {
      return p.n_rot * std::log(static_cast<double>(p.orig_ctx) / (2.0 * M_PI * beta)) / (2.0 * std::log(static_cast<double>(p.theta)));
    };
    lo = std::max(std::floor(corr(p.beta_fast)), 0.0);
    hi = std::min(std::ceil(corr(p.beta_slow)), static_cast<double>(p.n_rot - 1));
    if (hi == lo) hi = lo + 0.001;
  }
  for (int j = 0; j < half; ++j) {
    float w0 = static_cast<float>(1.0 / std::pow(static_cast<double>(p.theta), 2.0 * j / p.n_rot));
    if (!p.yarn) {
      omega[j] = w0;
      continue;
    }
    float ramp = static_cast<float>(std::clamp((j - lo) / (hi - lo), 0.0, 1.0));
    omega[j] = w0 * (1.0f - ramp) + (w0 / p.factor) * ramp;
  }
}

}  // namespace dsv4
