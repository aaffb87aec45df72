// Which valid model shapes (ModelSpec::validate: what transformers' DeepseekV4
// builds) a numerics mode and a backend can run. `plain` numerics on the CPU
// run every valid shape; these are the requirements on top, each refused with a
// message that names the model's numbers, the requirement and the way out.
// Model::create applies them before it uploads anything.
#pragma once

#include "core/error.h"
#include "model/forward.h"
#include "model/model_spec.h"
#include "model/weights.h"

namespace dsv4 {

// `reference` and `fast` numerics (DeepSeek's inference graph):
//  * the FP8 round trip of KV rows quantises the non-RoPE dims in 64-value
//    blocks: head_dim - rope_dim a multiple of 64;
//  * the indexer's Hadamard rotation needs a power-of-two width and its FP4
//    round trip 32-value blocks: indexer_head_dim a power of two >= 32 (only
//    when a layer has ratio 4, the indexer's layers).
// `plain`: nothing.
Status check_numerics_fit(const ModelSpec& spec, Numerics numerics);

// The CUDA kernels' launch requirements that depend on the model, checked on
// the host (the kernels assert them; this turns a load of an unsupported shape
// into an error instead of an abort at the first forward):
//  * attention (cuda_attention.cu): the split kernel takes head_dim d with
//    d % 128 == 0, d % (32 w) == 0 and d / w <= 1024, where w = 8 / g warps
//    share a head and g is the largest of 8, 4, 2, 1 dividing head_count. With
//    `reference` or `fast` numerics the tensor-core kernel (cuda_attention_mma.cu) takes
//    d = 128, 256 and 512 whatever the head count (not under --no-tensor-cores,
//    which this check does not see);
//  * RoPE tables (cuda_rowops.cuh) hold at most 64 pairs: rope_dim <= 128;
//  * indexer scores (cuda_indexer.cu): indexer_head_dim % 4 == 0 and the
//    queries of all indexer heads plus 8 staged rows within 200 KiB of shared
//    memory (layers of ratio 4 only);
//  * mHC (cuda_mhc.cu): at most 8 streams, hc_count x embedding width a
//    multiple of 8;
//  * routing (cuda_moe.cu): at most 1024 experts, at most 64 used per token;
//  * matrices (cuda_matmul.cu, cuda_moe.cu, cuda_mhc.cu): the kernels decode a
//    row in units of 4 values (F32) or 8 (F16, BF16), so each matrix's row
//    length (its input width) is a multiple of that; quantised rows are whole
//    blocks by construction.
// `mtp` may be null.
Status check_cuda_fit(const ModelWeights& weights, const MtpWeights* mtp, Numerics numerics);

}  // namespace dsv4
