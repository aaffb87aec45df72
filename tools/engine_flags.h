// The engine's command-line choices shared by dsv4 run/serve/bench/logits,
// parsed here into typed values once: --backend and --numerics (enums), and
// the CUDA backend's switches (help group "CUDA") into one CudaOptions
// (backend/options/cuda_options.h). The defaults are the fast path; the CUDA
// switches are for A/B runs and fall-backs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "backend/options/cuda_options.h"
#include "dsv4/engine.h"

namespace dsv4::tools {

// A CLI11 check from one of the typed parsers (the parser's error is the message).
template <class Parse>
CLI::Validator parsed_by(Parse parse) {
  return CLI::Validator(
      [parse](std::string& v) {
        auto r = parse(v);
        return r ? std::string() : r.error().message;
      },
      "");
}

inline void add_backend_flags(CLI::App* cmd, BackendChoice* backend, Numerics* numerics) {
  cmd->add_option_function<std::string>(
         "--backend", [backend](const std::string& v) { *backend = *backend_choice_from_name(v); }, "auto | cpu | cuda")
      ->check(parsed_by([](const std::string& v) { return backend_choice_from_name(v); }))
      ->default_str(backend_choice_name(*backend));
  cmd->add_option_function<std::string>(
         "--numerics", [numerics](const std::string& v) { *numerics = *numerics_from_name(v); },
         "reference | plain | fast (fast: the linear layers' inputs quantised to int8 blocks, the attention's excepted "
         "by default)")
      ->check(parsed_by([](const std::string& v) { return numerics_from_name(v); }))
      ->default_str(numerics_name(*numerics));
}

// --fast-skip SITES (EngineOptions::fast_skip): inputs fast numerics leaves unquantised, for measurements.
inline void add_fast_skip_flag(CLI::App* cmd, std::optional<unsigned>* skip) {
  cmd->add_option_function<std::string>(
         "--fast-skip", [skip](const std::string& v) { *skip = *fast_sites_from_names(v); },
         "With --numerics fast: leave these inputs unquantised (comma-separated: attn-in, q, wo-b, ffn-in, "
         "shexp-mid, exp-mid, mtp; none: quantise every one), to measure what each costs in accuracy and gains "
         "in speed")
      ->check(parsed_by([](const std::string& v) { return fast_sites_from_names(v); }))
      ->default_str(fast_sites_name(FAST_DEFAULT_SKIP));
}

// --expert-stats FILE (EngineOptions::expert_stats).
inline void add_expert_stats_flag(CLI::App* cmd, std::string* path) {
  cmd->add_option("--expert-stats", *path,
                  "Routing statistics: read at load when FILE exists (with --gpu-memory below the model's size, the "
                  "most-used routed experts go to the GPU first), counted during the run and merged into FILE at exit")
      ->type_name("FILE");
}

// --synthetic PRESET and its --seed, instead of -m (EngineOptions::synthetic, synthetic_seed).
inline void add_synthetic_flags(CLI::App* cmd, std::string* preset, uint64_t* seed) {
  cmd->add_option("--synthetic", *preset,
                  "Instead of -m: generate this `dsv4 synth` preset's weights in memory (the same bytes as the "
                  "file; needs RAM for the whole model)");
  cmd->add_option("--seed", *seed, "Seed of --synthetic (as dsv4 synth --seed)")->capture_default_str();
}

// Speculative decoding's flags (docs/SPECULATIVE.md): the drafter (--mtp FILE or --dspark FILE) and
// how many tokens it proposes per pass. draft stays -1 unless given: draft() resolves it.
struct SpeculationArgs {
  std::string mtp, dspark;
  int draft = -1;
  float margin = 0;         // --draft-margin (MTP)
  float confidence = 0.7f;  // --dspark-confidence

  // The --draft in effect: given, or the drafter's default (MTP 2; DSpark 4, its block of 5 less
  // the model's own next token); an error for proposals without a drafter or past what one pass
  // verifies (Session::max_verify).
  expected<int> draft_in_effect() const {
    const bool any = !mtp.empty() || !dspark.empty();
    if (draft < 0) return !any ? 0 : dspark.empty() ? 2 : 4;
    if (draft > 0 && !any)
      return make_error("--draft needs a drafter: --mtp FILE or --dspark FILE (it proposes the tokens)");
    const int most = static_cast<int>(Session::max_verify()) - 1;
    if (draft > most) return make_error("--draft must be between 0 and %d", most);
    return draft;
  }
  void apply(EngineOptions& o) const {
    o.mtp_path = mtp;
    o.dspark_path = dspark;
    o.dspark_confidence = confidence;
  }
};

inline void add_speculation_flags(CLI::App* cmd, SpeculationArgs* a) {
  cmd->add_option("--mtp", a->mtp,
                  "MTP block GGUF: it proposes the next tokens and each forward pass checks them (speculative "
                  "decoding; output unchanged)")
      ->type_name("FILE");
  cmd->add_option("--dspark", a->dspark,
                  "DSpark support GGUF (0731 weights): a 3-stage drafter proposing a block of tokens per pass; "
                  "used instead of --mtp when both are given")
      ->type_name("FILE");
  cmd->add_option("--draft", a->draft,
                  "Tokens proposed per forward pass (0: off; default 2 with --mtp, 4 with --dspark)")
      ->type_name("N");
  cmd->add_option("--draft-margin", a->margin,
                  "With --mtp: stop proposing at a token whose MTP logit leads the runner-up by less than this "
                  "(0: propose --draft tokens always)")
      ->check(CLI::Range(0.0f, 1000.0f))
      ->capture_default_str();
  cmd->add_option("--dspark-confidence", a->confidence,
                  "With --dspark: stop proposing at a token whose confidence is below this (0: the whole block)")
      ->check(CLI::Range(0.0f, 0.999f))
      ->capture_default_str();
}

inline void add_cuda_flags(CLI::App* cmd, CudaOptions* s) {
  const char* group = "CUDA";
  cmd->add_flag_callback(
         "--no-tensor-cores", [s] { s->tensor_cores = false; },
         "Batched matmuls on FFMA tiles (bitwise equal to the decode kernels) instead of tensor cores; "
         "also turns off the switches below that need tensor cores")
      ->group(group);
  cmd->add_flag_callback(
         "--no-int-dot", [s] { s->int_dot = false; },
         "Decode experts' IQ2_XXS/Q2_K rows on the float matvec instead of integer tensor-core MMAs")
      ->group(group);
  cmd->add_flag_callback(
         "--no-int8-matvec", [s] { s->int8_matvec = false; },
         "With --numerics fast: decode matvecs of Q8_0 weights on the float matvec instead of int8 dot products")
      ->group(group);
  cmd->add_flag_callback(
         "--no-int8-tiles", [s] { s->int8_tiles = false; },
         "With --numerics fast: prefill matmuls and tile experts on f16 tensor-core MMAs instead of int8 ones")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--act-quant-fusion", [s](const std::string& v) { s->act_quant_fusion = *parse_act_quant_fusion(v); },
         "With --numerics fast: where the activation quantisation runs (the same results): auto (inside the "
         "SwiGLU, expert and matvec kernels where measured faster), all (also inside the norms), off (each its "
         "own kernel)")
      ->check(parsed_by([](const std::string& v) { return parse_act_quant_fusion(v); }))
      ->type_name("auto|all|off")
      ->default_str("auto")
      ->group(group);
  cmd->add_flag_callback(
         "--no-token-matvec", [s] { s->token_matvec = false; },
         "Batched matmuls of 2-4 tokens (Q8_0, F16, BF16, F32 weights) on the tiles instead of the token matvec "
         "(which reads each weight once and gives each token the decode step's sums)")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--cublas", [s](const std::string& v) { (void)parse_cublas(v, *s); },
         "Prefill matmuls on cuBLAS: auto (libcublas.so.13 when it loads, else the built-in tile), off, or the path "
         "of the library (which must load)")
      ->check(parsed_by([](const std::string& v) {
        CudaOptions o;
        return parse_cublas(v, o);
      }))
      ->type_name("auto|off|PATH")
      ->default_str("auto")
      ->group(group);
  cmd->add_option("--gemm-min-tokens", s->gemm_min_tokens, "Matmuls of at least this many tokens (>= 2) go to cuBLAS")
      ->type_name("N")
      ->check(CLI::Validator(
          [](std::string& v) {
            int64_t n = 0;
            return CLI::detail::lexical_cast(v, n) && n >= 2 ? std::string() : "want a whole number >= 2, got " + v;
          },
          ""))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--ffma-max-tokens", s->ffma_max_tokens,
                  "Batched matmuls of at most N tokens (verify passes, small batched steps) on the FFMA tile, in the "
                  "decode matvec's summation order, instead of tensor cores; 0: none")
      ->type_name("N")
      ->check(CLI::Range(int64_t{0}, int64_t{64}))
      ->capture_default_str()
      ->group(group);
  cmd->add_flag_callback(
         "--no-cuda-branches", [s] { s->branches = false; },
         "Every op on one stream (default: the shared expert runs on a second stream)")
      ->group(group);
  cmd->add_flag_callback(
         "--no-cuda-graphs", [s] { s->graphs = false; },
         "Launch every op as it is issued (default: decode steps are recorded once as CUDA graphs and replayed)")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--expert-gemm", [s](const std::string& v) { s->expert_gemm_min = *parse_expert_gemm(v); },
         "Prefill experts on the grouped wgmma GEMM (sm_90a): those with at least N assignments in a batch (the "
         "others on the tile); auto (N by weight type: " +
             expert_gemm_auto_text() + "), on (every expert), off, or N")
      ->check(parsed_by([](const std::string& v) { return parse_expert_gemm(v); }))
      ->type_name("auto|on|off|N")
      ->default_str("auto")
      ->group(group);
  cmd->add_flag_callback(
         "--no-expert-gemm-codes", [s] { s->expert_gemm_codes = false; },
         "Grouped GEMM: IQ2_XXS and Q2_K weights as f16 hi/lo splits (two wgmmas per x term) instead of exact "
         "integer codes with the block scale applied to the sums (one; Q2_K's mins as one more per 64 columns)")
      ->group(group);
  cmd->add_option("--fast-attention-terms", s->fast_attention_terms,
                  "--numerics fast: q and the softmax weights in the tensor-core attention as 1, 2 or 3 bf16 terms "
                  "(8, 16 or 24 significant bits; 1: bf16, as DeepSeek's own inference; 3: f32-exact, as the other "
                  "numerics)")
      ->type_name("1|2|3")
      ->check(CLI::Range(1, 3).description(""))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--expert-group-min", s->expert_group_min,
                  "Routed experts of batches of at least N tokens grouped by expert (each expert's weights read once "
                  "per tile); smaller batches run the per-assignment matvec")
      ->type_name("N")
      ->check(CLI::Validator(
          [](std::string& v) {
            int64_t n = 0;
            return CLI::detail::lexical_cast(v, n) && n >= 1 && n <= 1000000
                       ? std::string()
                       : "want a whole number from 1 to 1000000, got " + v;
          },
          ""))
      ->capture_default_str()
      ->group(group);
  cmd->add_flag_callback(
         "--no-expert-gather", [s] { s->expert_gather = false; },
         "Routed experts in host memory (--gpu-memory) read in place over the bus by the expert kernels instead "
         "of first gathered into GPU memory by one copy per batch")
      ->group(group);
  cmd->add_flag_callback(
         "--no-expert-prefetch", [s] { s->expert_prefetch = false; },
         "Prefill with routed experts in host memory gathers each layer's after its router instead of copying "
         "them in while the layer's attention runs")
      ->group(group);
  cmd->add_flag_callback(
         "--no-pdl", [s] { s->pdl = false; }, "Plain kernel launches instead of programmatic dependent launch (sm_90+)")
      ->group(group);
  cmd->add_flag_callback(
         "--no-gemm-weight-cache", [s] { s->gemm_weight_cache = false; },
         "Split the cuBLAS matmuls' weights every prefill batch instead of keeping the splits (6 bytes per "
         "dense weight, kept while 16 GiB of GPU memory stay free)")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--gpu-memory", [s](const std::string& v) { s->gpu_memory = *parse_gpu_memory(v); },
         "GPU memory the model may take (weights, activations, a session's state); routed experts beyond it stay "
         "in host memory and are read over the bus (decode slows with the share left there). auto: the free "
         "memory less a margin, so a model larger than the GPU runs instead of failing. A SIZE also turns the "
         "split-weight cache off (it would sit outside the budget)")
      ->check(parsed_by([](const std::string& v) { return parse_gpu_memory(v); }))
      ->type_name("auto|SIZE")
      ->default_str("auto")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--gpus", [s](const std::string& v) { s->gpus = *parse_gpus(v); },
         "Split the model's layers over these GPUs (device indices, or all): each holds a contiguous range of "
         "layers sized to its memory (or --gpu-memory each) and passes the hidden state on to the next; when the "
         "GPUs cannot hold every weight, each keeps the routed experts it has no room for in host memory. "
         "Speculative decoding (--mtp, --dspark of run, serve and bench) does not run with it")
      ->check(parsed_by([](const std::string& v) { return parse_gpus(v); }))
      ->type_name("all|N,N...")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--cpu-experts", [s](const std::string& v) { s->cpu_experts = *parse_cpu_experts(v); },
         "Decode steps with routed experts in host memory (--gpu-memory): the CPU computes this share of the host "
         "experts a step uses (all cores but one, or --threads; SIMD integer dots) while the GPU gathers the "
         "others over the bus. auto: as many as the CPU computes before the gather of the rest ends, fitted to "
         "every step's measured times (it follows a CPU that slows down, and takes none from a slow one); off: "
         "all gathered")
      ->check(parsed_by([](const std::string& v) { return parse_cpu_experts(v); }))
      ->type_name("auto|off|SHARE")
      ->default_str("off")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--stream-experts", [s](const std::string& v) { s->stream_experts = *parse_stream_experts(v); },
         "Routed experts in host memory (--gpu-memory) are pinned for the GPU to read while RAM holds them. auto: "
         "those that do not fit stay in the model file and each step's are copied to the GPU by the host (pages "
         "not in RAM are read from the disk: SSD streaming, far slower than pinned); on: stream them all, pin "
         "nothing; off: refuse a model whose host experts cannot be pinned")
      ->check(parsed_by([](const std::string& v) { return parse_stream_experts(v); }))
      ->type_name("auto|on|off")
      ->default_str("auto")
      ->group(group);
  cmd->add_option_function<std::string>(
         "--dup-ops", [s](const std::string& v) { s->dup_ops = *parse_dup_ops(v); },
         "Profiling: launch these ops twice (comma-separated, ops that give the same result when run again: "
         "hc_pre, hc_head, rms_norm, matmul, matmuls, store_rows, indexer_scores, topk, attention, moe_route, "
         "moe_experts, swiglu); the slowdown is their cost inside the decode graph")
      ->check(parsed_by([](const std::string& v) { return parse_dup_ops(v); }))
      ->type_name("OP[,OP...]")
      ->group(group);
}

// The switches as EngineOptions::cuda holds them.
inline std::shared_ptr<const CudaOptions> cuda_options_for(const CudaOptions& s) {
  return std::make_shared<const CudaOptions>(s);
}

// What the model-loading commands without a server (bench, logits) take alike, and the EngineOptions it
// sets; each command registers the flags it offers.
struct LoadArgs {
  std::string model, synthetic, expert_stats;  // -m, --synthetic, --expert-stats
  uint64_t seed = 1;                           // of --synthetic
  BackendChoice backend = BackendChoice::AUTO;
  Numerics numerics = Numerics::REFERENCE;
  std::optional<unsigned> fast_skip;  // --fast-skip
  int threads = 0, batch = 0;         // 0: the backend's default
  CudaOptions cuda;

  void apply(EngineOptions& o) const {
    o.model_path = model;
    o.synthetic = synthetic;
    o.synthetic_seed = seed;
    o.backend = backend;
    o.cuda = cuda_options_for(cuda);
    o.numerics = numerics;
    o.fast_skip = fast_skip;
    o.threads = threads;
    o.prefill_batch = batch;
    o.expert_stats = expert_stats;
  }
};

}  // namespace dsv4::tools
