// Launchers of the dense element/row kernels (see cuda_dense.cu).
#pragma once

#include <span>

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_rms_norm(const CudaContext& ctx, const RmsNormOp& op);
void launch_rope(const CudaContext& ctx, const RopeOp& op);
void launch_quant_sim(const CudaContext& ctx, const QuantSimOp& op);
void launch_act_quant(const CudaContext& ctx, const ActQuantOp& op);
// out = x with each of `rows` rows of d floats (consecutive) quantised by q (ActQuantOp); out may be x.
void launch_act_quant(cudaStream_t stream, float* out, const float* x, int64_t d, int64_t rows, ActQuant q);
void launch_store_rows(const CudaContext& ctx, const StoreRowsOp& op);
// The ops of single-token sequences in one launch (cuda_seqs.cuh), the others one by one.
void launch_store_rows_seqs(const CudaContext& ctx, std::span<const StoreRowsOp> ops);
void launch_swiglu(const CudaContext& ctx, const SwigluOp& op);
void launch_add(const CudaContext& ctx, const AddOp& op);
void launch_scale(const CudaContext& ctx, const ScaleOp& op);
// dst[i] = value for the n floats at dst (Backend::fill).
void launch_fill(const CudaContext& ctx, float* dst, int64_t n, float value);

}  // namespace dsv4::cuda
