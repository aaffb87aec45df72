// Prefill matmuls through cuBLAS (see cuda_gemm.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

// The matmul as one f16 tensor-core GEMM (cuBLAS) on exact hi/lo splits of W and
// x, when it applies: ctx.blas loaded, tensor cores on, at least
// ctx.gemm_min_tokens tokens, a Q8_0/Q2_K/Q4_K/IQ2_XXS/F16 weight with rows of
// whole 32-element units, and scratch within k_gemm_max_scratch. Returns false
// (nothing launched) otherwise.
bool launch_matmul_gemm(const CudaContext& ctx, const MatmulOp& op);

// Most scratch one GEMM-path matmul may take (W', x', C; above it the launcher
// leaves the matmul to the tensor-core tile, e.g. the output head over many tokens).
constexpr size_t k_gemm_max_scratch = size_t{3} << 29;  // 1.5 GiB

}  // namespace dsv4::cuda
