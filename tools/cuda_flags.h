// The CUDA backend's command-line switches, shared by dsv4 run/serve/bench/logits
// (help group "CUDA"). Each one maps to a field of EngineOptions; the defaults
// are the fast path, the switches are for A/B runs and fall-backs.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>

#include "dsv4/engine.h"

namespace dsv4::tools {

inline void add_cuda_flags(CLI::App* cmd, bool* tensor_cores, CudaSwitches* s) {
  const char* group = "CUDA";
  cmd->add_flag_callback("--no-tensor-cores", [tensor_cores] { *tensor_cores = false; },
                "Batched matmuls on FFMA tiles (bitwise equal to the decode kernels) instead of tensor cores; "
                "also turns off the switches below that need tensor cores")
      ->group(group);
  cmd->add_flag_callback("--no-int-dot", [s] { s->int_dot = false; },
                "Decode experts' IQ2_XXS/Q2_K rows on the float matvec instead of integer tensor-core MMAs")
      ->group(group);
  cmd->add_option("--cublas", s->cublas,
                  "Prefill matmuls on cuBLAS: auto (libcublas.so.13 when it loads, else the built-in tile), off, "
                  "or the path of the library (which must load)")
      ->type_name("auto|off|PATH")
      ->capture_default_str()
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
  cmd->add_flag_callback("--no-cuda-branches", [s] { s->branches = false; },
                "Every op on one stream (default: the shared expert runs on a second stream)")
      ->group(group);
  cmd->add_option("--expert-gemm", s->expert_gemm,
                  "Prefill experts on the grouped wgmma GEMM (sm_90a): those with at least N assignments in a batch "
                  "(the others on the tile); auto (N = 64), on (every expert), off, or N")
      ->type_name("auto|on|off|N")
      ->check(CLI::Validator(
          [](std::string& v) {
            int64_t n = 0;
            if (v == "auto" || v == "on" || v == "off") return std::string();
            return CLI::detail::lexical_cast(v, n) && n >= 1 && n <= 1000000
                       ? std::string()
                       : "want auto, on, off or a whole number from 1 to 1000000, got " + v;
          },
          ""))
      ->capture_default_str()
      ->group(group);
  cmd->add_flag_callback("--no-pdl", [s] { s->pdl = false; }, "Plain kernel launches instead of programmatic dependent launch (sm_90+)")
      ->group(group);
  cmd->add_flag_callback("--no-gemm-weight-cache", [s] { s->gemm_weight_cache = false; },
                "Split the cuBLAS matmuls' weights every prefill batch instead of keeping the splits (6 bytes per "
                "dense weight, kept while 16 GiB of GPU memory stay free)")
      ->group(group);
  cmd->add_option("--dup-ops", s->dup_ops,
                  "Profiling: launch these ops twice (comma-separated, ops that give the same result when run again: "
                  "hc_pre, hc_head, rms_norm, matmul, matmuls, store_rows, indexer_scores, topk, attention, moe_route, "
                  "moe_experts, swiglu); the slowdown is their cost inside the decode graph")
      ->type_name("OP[,OP...]")
      ->group(group);
}

}  // namespace dsv4::tools
