// Internal to the quant layer: the per-type row quantisers behind quantize_row.
// n is a multiple of the block size; `importance` is null or n weights >= 0.
#pragma once

#include <cstdint>

#include "quant/quant.h"

namespace dsv4::quant::detail {

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n);
void quantize_row_mxfp4(const float* x, BlockMXFP4* y, int64_t n);
void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n, const float* importance);
void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n, const float* importance);
void quantize_row_iq2_xxs(const float* x, BlockIQ2_XXS* y, int64_t n, const float* importance);

}  // namespace dsv4::quant::detail
