// Internal to the quant layer: IQ2_XXS tables in the shapes the decoders want
// (same values as iq2xxs_grid()/iq2xxs_signs(), laid out one lane per weight so
// the per-tuple loops are plain element-wise multiplies).
#pragma once

#include <cstdint>

namespace dsv4::quant::detail {

const float* iq2xxs_grid_f32();    // [256 * 8]: entry i, weight j -> byte j of grid[i] (8, 25 or 43)
const float* iq2xxs_sign_f32();    // [128 * 8]: sign index s, weight j -> -1.0f if bit j of signs[s], else +1.0f
const int8_t* iq2xxs_sign_mask();  // [128 * 8]: -1 (all bits set) if bit j of signs[s], else 0

}  // namespace dsv4::quant::detail
