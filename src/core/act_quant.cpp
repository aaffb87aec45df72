#include "core/act_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/float_conv.h"

namespace dsv4 {

const char* act_quant_name(ActQuant q) {
  switch (q) {
    case ActQuant::NONE: return "none";
    case ActQuant::FP8_128: return "fp8-128";
    case ActQuant::INT8_32: return "int8-32";
  }
  return "?";
}

expected<ActQuant> act_quant_from_name(std::string_view s) {
  for (ActQuant q : {ActQuant::NONE, ActQuant::FP8_128, ActQuant::INT8_32})
    if (s == act_quant_name(q)) return q;
  return make_error("unknown activation quantisation \"%s\" (expected none, fp8-128 or int8-32)",
                    std::string(s).c_str());
}

int act_quant_block(ActQuant q) {
  switch (q) {
    case ActQuant::NONE: return 0;
    case ActQuant::FP8_128: return 128;
    case ActQuant::INT8_32: return 32;
  }
  return 0;
}

namespace {

// max(1e-4, max_i |x_i|) over x[0, n); NaN values are skipped (std::max keeps the left operand).
float block_amax(const float* x, int64_t n) {
  float amax = 1e-4f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

}  // namespace

void fp8_block_round(float* x, int64_t n) {
  const float s = pow2_ceil(block_amax(x, n) / k_fp8_e4m3_max);
  for (int64_t i = 0; i < n; ++i) x[i] = fp8_e4m3_round(std::clamp(x[i] / s, -k_fp8_e4m3_max, k_fp8_e4m3_max)) * s;
}

void act_quant_row(float* x, int64_t d, ActQuant q) {
  const int64_t B = act_quant_block(q);
  if (B == 0) return;
  for (int64_t b0 = 0; b0 < d; b0 += B) {
    const int64_t nb = std::min(B, d - b0);
    float* v = x + b0;
    const float amax = block_amax(v, nb);
    if (std::isinf(amax)) {  // no scale: the block is NaN
      std::fill(v, v + nb, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    if (q == ActQuant::FP8_128) {
      fp8_block_round(v, nb);
      continue;
    }
    const Int8Step st = act_int8_block_scale(amax);
    for (int64_t i = 0; i < nb; ++i) v[i] = std::clamp(std::nearbyint(v[i] * st.inv), -127.0f, 127.0f) * st.scale;
  }
}

}  // namespace dsv4
