// Launchers of the lightning-indexer scores and the top-k selection (see cuda_indexer.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_indexer_scores(const CudaContext& ctx, const IndexerScoresOp& op);
void launch_topk(const CudaContext& ctx, const TopKOp& op);

}  // namespace dsv4::cuda
