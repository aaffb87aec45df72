// Launchers of the MoE router and the routed experts (see cuda_moe.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_moe_route(const CudaContext& ctx, const MoeRouteOp& op);
void launch_moe_experts(const CudaContext& ctx, const MoeExpertsOp& op);
// The grouped expert GEMM (cuda_expert_wgmma.cu) can run here: this binary
// carries its sm_90a kernel and the device is of compute capability 9.0.
bool expert_wgmma_available();

}  // namespace dsv4::cuda
