// Launchers of the MoE router and the routed experts (see cuda_moe.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_moe_route(const CudaContext& ctx, const MoeRouteOp& op);
void launch_moe_experts(const CudaContext& ctx, const MoeExpertsOp& op);

}  // namespace dsv4::cuda
