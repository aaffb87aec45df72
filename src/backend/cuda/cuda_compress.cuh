// Launcher of the KV compressor step (see cuda_compress.cu).
#pragma once

#include <span>

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_compress(const CudaContext& ctx, const CompressOp& op);
// The ops of single-token sequences in one launch (cuda_seqs.cuh), the others one by one.
void launch_compress_seqs(const CudaContext& ctx, std::span<const CompressOp> ops);

}  // namespace dsv4::cuda
