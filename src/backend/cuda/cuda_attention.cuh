// Launcher of the core attention kernel (see cuda_attention.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_attention(const CudaContext& ctx, const AttentionOp& op);

}  // namespace dsv4::cuda
