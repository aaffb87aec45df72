// The CUDA backend's switches, in one typed struct: what `--no-tensor-cores`,
// `--cublas`, `--expert-gemm`, ... choose (parsed once, in tools/engine_flags.h),
// what the backend reads (CudaBackendOptions extends it) and what the engine
// passes between them (EngineOptions::cuda). The defaults are the fast path;
// the others are for A/B runs and fall-backs. The CPU backend ignores them.
// Plain C++ (no CUDA): every build can parse and print them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include <string_view>

#include "core/error.h"
#include "core/ggml_type.h"

namespace dsv4 {

// Where the prefill matmuls' cuBLAS comes from.
enum class CublasMode {
  AUTO,     // libcublas.so.13 from the library path, then /usr/local/cuda; without it the built-in tile
  OFF,      // never: the tensor-core tile
  LIBRARY,  // CudaOptions::cublas_library, which must load
};

// Whether routed experts in host memory that RAM cannot pin are streamed from the model file
// (CudaOptions::stream_experts).
enum class StreamExperts { AUTO, ON, OFF };

// Ops that give the same result when launched twice (they do not read what
// they write); CudaOptions::dup_ops is a mask of (1 << op).
enum class CudaDupOp : unsigned {
  HC_PRE,
  HC_HEAD,
  RMS_NORM,
  MATMUL,
  MATMULS,
  STORE_ROWS,
  INDEXER_SCORES,
  TOPK,
  ATTENTION,
  MOE_ROUTE,
  MOE_EXPERTS,
  SWIGLU,
  COUNT
};

// CudaOptions::expert_gemm_min's "auto": the threshold follows the experts' weight type
// (expert_gemm_auto_min).
inline constexpr int k_expert_gemm_auto = -1;
// The grouped expert GEMM's threshold under "auto": experts with at least this many assignments in a
// prefill batch, by the gate/up weight type (where the GEMM and the tile cross, measured per type:
// docs/design-notes/moe-grouped-gemm.md) — IQ2_XXS (the q2 files) and Q4_K 32, others 64.
int expert_gemm_auto_min(GgmlType gate_type);
// "32 IQ2_XXS and Q4_K, else 64": expert_gemm_auto_min's thresholds as --help and the device banner print them.
std::string expert_gemm_auto_text();
// Batches of at least this many tokens group the routed experts by expert
// (CudaOptions::expert_group_min; measured: PERFORMANCE.md, serving several agents).
inline constexpr int64_t k_expert_group_auto_min = 65;

// Where `fast` numerics' INT8_32 activation quantisation runs on CUDA (CudaOptions::act_quant_fusion; the
// same bits every way): AUTO inside the kernels where that measured faster than a separate act_quant launch
// (the SwiGLUs, the decode experts' digit split of mid, the int8 matvec's staging of wo_b's input, hc_pre's
// fused norm in batches of more than 16 tokens), ALL also
// in the norms (rms_norm, hc_pre's fused norm: a warp quantises the row's blocks it holds; its first form
// measured slower than the separate launch, the form since not yet measured), OFF: every quantisation its
// own act_quant launch after the producer.
enum class ActQuantFusion { OFF, AUTO, ALL };

struct CudaOptions {
  // Batched matmuls (prefill, grouped experts) of block-quantised weights on
  // tensor cores (sm_80+): within f32 rounding of the CPU, not bitwise equal
  // to the float matvec. false: FFMA tiles that share the matvec's summation
  // order, so chunked prefill, whole prefill and decode agree bitwise (and
  // every switch below that needs tensor cores is off).
  bool tensor_cores = true;
  // Decode experts' IQ2_XXS/Q2_K rows as integer dot products on int8 MMAs
  // (cuda_idot.cuh, cuda_expert_imma.cuh; tensor cores only); false: the float matvec.
  bool int_dot = true;
  // Decode matvecs of Q8_0 weights whose x is an int8-32 activation quantiser's output (`fast` numerics;
  // launches of >= 4,096 rows, where it measured faster) as int8 dot products (dp4a; cuda_matmul.cu; tensor
  // cores only); false: the float matvec.
  bool int8_matvec = true;
  // Prefill matmuls and tile experts whose x is an int8-32 activation quantiser's output (`fast` numerics) on
  // int8 tensor-core MMAs, one per 32-value unit (cuda_mma_i8.cuh; Q8_0, IQ2_XXS, Q4_K, Q2_K, MXFP4; tensor cores
  // only); false: the f16 tile (x's hi and lo terms, four MMAs per unit).
  bool int8_tiles = true;
  ActQuantFusion act_quant_fusion = ActQuantFusion::AUTO;  // see ActQuantFusion
  // Batched matmuls of 2 .. 4 tokens of Q8_0/F16/BF16/F32 weights on the token matvec (cuda_matmul.cu: each
  // weight read once, every token's outputs bitwise the decode matvec's); false: the tiles, as larger batches.
  bool token_matvec = true;
  // cuBLAS for the prefill matmuls (cuda_gemm.cu; tensor cores only).
  CublasMode cublas = CublasMode::AUTO;
  std::string cublas_library;  // LIBRARY: the path to dlopen
  // Matmuls of at least this many tokens (>= 2) go to cuBLAS.
  int64_t gemm_min_tokens = 128;
  // Batched matmuls of at most this many tokens run on the FFMA tile even with tensor cores (those the token
  // matvec does not take): the float decode matvec's summation order, so a verify pass or a small batched
  // step gives each row's matmuls the decode step's bits (reference and plain numerics; measured ~28% slower
  // than the tensor-core tile at 3 tokens; 0: none; at most 64).
  int64_t ffma_max_tokens = 0;
  // The shared expert on a second stream beside the router and routed experts; false: one stream.
  bool branches = true;
  // Steps that recur (a decode step, a batched decode step) recorded once as a CUDA graph and replayed
  // (Backend::capture_begin); false: every op launched as it is issued (the A/B of launch costs).
  bool graphs = true;
  // Programmatic dependent launch on sm_90+ (cuda_launch.cuh); false: plain launches.
  bool pdl = true;
  // Prefill experts with at least this many assignments in a batch run as
  // one grouped GEMM per matrix (cuda_expert_wgmma.cu: wgmma, sm_90a builds
  // and devices, tensor cores only), the others on the tile. 0: never; 1:
  // every expert; k_expert_gemm_auto: expert_gemm_auto_min of the weight type.
  int expert_gemm_min = k_expert_gemm_auto;
  // The grouped GEMM's IQ2_XXS and Q2_K weights as exact integer codes (f16; Q2_K's mins as one more wgmma per
  // 64 columns) with each block's scale applied to the
  // chunk sums: one wgmma per 16 columns and x term instead of the split's two (cuda_expert_gemm.cuh); false:
  // f16 hi/lo splits, as the other weight types.
  bool expert_gemm_codes = true;
  // bf16 terms of q and of the softmax weights P in the tensor-core attention of `fast` numerics (heads of
  // 512; AttentionOp::fast, cuda_attention_mma.cu): 3 (24 significant bits, f32-exact as under the other
  // numerics), 2 (16) or 1 (8, the bf16 of DeepSeek's own inference). Fewer terms take fewer MMAs and, at 1,
  // a third of the q staging. Default 1: a 4,096-token batch's attention takes 46% less time than with 3 terms
  // (H100, bench_cuda_ops), and the full-size distance to `reference` is no larger (issue #37's check:
  // docs/design-notes/fast-numerics.md, "Attention on one bf16 term").
  int fast_attention_terms = 1;
  // Routed experts of batches of at least this many tokens are grouped by
  // expert (each expert's weights read once per tile of its assignments);
  // smaller batches (decode steps, batched decode steps of a few sessions) run
  // the per-assignment matvec, which reads an expert once per assignment but
  // streams at the copy rate. 1: always grouped.
  int64_t expert_group_min = k_expert_group_auto_min;
  // Routed experts in host memory that a batch uses are first gathered into GPU memory by one wide copy, then
  // read there (each crosses the bus once per batch; prefill then runs the grouped GEMM); false: the expert
  // kernels read them in place over the bus (once per assignment or tile).
  bool expert_gather = true;
  // With expert_gather: a batch large enough to use nearly every expert has its layer's host experts copied
  // into GPU memory by the copy engine while the layer's attention runs (cuda_expert_prefetch.cuh), instead of
  // gathered after the router; false: always gathered after the router.
  bool expert_prefetch = true;
  // Keep the cuBLAS matmuls' split weights across calls (cuda_gemm.cuh,
  // GemmWeightCache: 6 bytes per dense weight) while at least
  // gemm_cache_reserve bytes of device memory stay free; false: split every
  // call (the same bits either way).
  bool gemm_weight_cache = true;
  // GPU memory the model may take (weights, activation buffers, one session's state and working memory);
  // 0: what the device has free less a margin. An explicit size also turns gemm_weight_cache off (the cache
  // would sit outside the budget). Routed experts beyond it stay in host memory, read in place
  // over the bus (Engine::load; docs/design-notes/expert-offload.md).
  uint64_t gpu_memory = 0;
  // The GPUs (device indices) of a layer pipeline (--gpus): the model's layers split into contiguous ranges,
  // one per GPU, sized to each GPU's memory (model/pipeline.h). Empty: device 0 alone; {-1}: every device.
  // gpu_memory, when set, is each GPU's budget.
  std::vector<int> gpus;
  // Decode steps (at most 16 tokens) with routed experts in host memory: the host CPU computes this share of
  // the host experts a step uses (from the same bytes, at the same time as the GPU gathers the others;
  // backend/host, docs/design-notes/expert-offload.md). 0: off, the default (every host expert gathered: see
  // PERFORMANCE.md for what the CPU's share measured); < 0: auto (as many as end before the gather of the rest,
  // fitted to every request's times: backend/host/host_share.h); 1: all on the CPU.
  float cpu_experts = 0.0f;
  // Threads of the host experts (and of expert streaming's copies); 0: every core but one.
  int cpu_expert_threads = 0;
  // Routed experts in host memory are pinned (registered) for the GPU to read while RAM holds them. AUTO: those
  // that do not fit stay pageable in the model file's mapping and are streamed: the host copies each op's into
  // a ring of pinned slots (pages not in RAM are read from the disk), the GPU copies them on
  // (cuda_expert_stream.cuh); ON: every host expert streamed, nothing pinned; OFF: a model whose host experts
  // cannot be pinned is refused at load.
  StreamExperts stream_experts = StreamExperts::AUTO;
  size_t gemm_cache_reserve = size_t{16} << 30;
  // Profiling: these ops (CudaDupOp bits) are launched twice, so a run's
  // slowdown is their marginal cost inside the decode graph and the prefill stream.
  unsigned dup_ops = 0;

  bool dup(CudaDupOp op) const { return (dup_ops >> static_cast<unsigned>(op)) & 1u; }
  // Every value in range (gemm_min_tokens >= 2, a library path when LIBRARY, ...).
  Status check() const;
  // The switches that differ from the defaults, "key=value ..." ("" when none).
  std::string describe() const;
};

// The command-line spellings (the CLI validates with these; errors name the value):
//   cublas       auto | off | PATH
//   expert gemm  auto | on | off | N (1 .. 1000000); auto: k_expert_gemm_auto
//   dup ops      comma-separated names of cuda_dup_op_names()
Status parse_cublas(std::string_view text, CudaOptions& options);
expected<int> parse_expert_gemm(std::string_view text);
//   gpu memory   auto | N[G|GiB|M|MiB] (a plain number: GiB), at least 1 GiB
expected<uint64_t> parse_gpu_memory(std::string_view text);
//   gpus         all | N[,N...] (device indices, distinct, at most 16)
expected<std::vector<int>> parse_gpus(std::string_view text);
//   cpu experts  auto | off | SHARE (0 .. 1; 0 = off)
expected<float> parse_cpu_experts(std::string_view text);
//   stream experts  auto | on | off
expected<StreamExperts> parse_stream_experts(std::string_view text);
const char* stream_experts_name(StreamExperts mode);
//   act quant fusion  auto | all | off
expected<ActQuantFusion> parse_act_quant_fusion(std::string_view text);
const char* act_quant_fusion_name(ActQuantFusion mode);
expected<unsigned> parse_dup_ops(std::string_view list);
const char* cuda_dup_op_name(CudaDupOp op);
const char* cuda_dup_op_names();  // "hc_pre, hc_head, ..."

}  // namespace dsv4
