// Launchers of the embedding and mHC kernels (see cuda_mhc.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_embed(const CudaContext& ctx, const EmbedOp& op);
void launch_hc_pre(const CudaContext& ctx, const HcPreOp& op);
void launch_hc_post(const CudaContext& ctx, const HcPostOp& op);
void launch_hc_head(const CudaContext& ctx, const HcHeadOp& op);

}  // namespace dsv4::cuda
