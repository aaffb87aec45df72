// Launcher of the KV compressor step (see cuda_compress.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_compress(const CudaContext& ctx, const CompressOp& op);

}  // namespace dsv4::cuda
