// Launchers of the lightning-indexer scores and the top-k selection (see cuda_indexer.cu).
#pragma once

#include <span>

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

void launch_indexer_scores(const CudaContext& ctx, const IndexerScoresOp& op);
void launch_topk(const CudaContext& ctx, const TopKOp& op);
// The ops of single-token sequences in one launch (cuda_seqs.cuh), the others one by one.
void launch_indexer_scores_seqs(const CudaContext& ctx, std::span<const IndexerScoresOp> ops);
void launch_topk_seqs(const CudaContext& ctx, std::span<const TopKOp> ops);

}  // namespace dsv4::cuda
