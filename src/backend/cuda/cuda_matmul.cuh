// Matmul launcher (see cuda_matmul.cu for the kernels).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

// out[t, r] = sum_c W[r, c] x[t, g(r) * cols + c] (MatmulOp, grouped when groups > 1).
void launch_matmul(const CudaContext& ctx, const MatmulOp& op);

// out[i] = W[i] x for every matrix of the set (MatmulsOp): one matvec kernel
// for a single token when the weights share type and width, else launch_matmul each.
void launch_matmuls(const CudaContext& ctx, const MatmulsOp& op);

// dst[r, :] = dequantised row r of w, for every row (f32, [n_rows, ne0]); bit-identical to quant::dequantize_row.
void launch_dequantize_rows(const CudaContext& ctx, const Tensor& w, float* dst);

}  // namespace dsv4::cuda
