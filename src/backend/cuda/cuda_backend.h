// The CUDA backend: every op of src/ops/ops.h as CUDA kernels on one device
// and one stream, tested op by op against the CPU backend (tests/cuda).
//
// Memory: activations/state from cudaMalloc (zero-initialised), weights copied
// to device memory at upload (never read through host-mapped memory).
// Dynamic values (positions, expert ids, selections) are read by the kernels
// from device tensors and no op synchronises with the host, so a decode step
// can later be captured in a CUDA graph. Every CUDA call is checked; a failure
// (bad device state, a kernel that trapped on a broken invariant) is fatal
// with the statement, file and line.
//
// This header is plain C++ (no CUDA headers), so the engine and the tests can
// include it from .cpp files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/error.h"
#include "ops/ops.h"

namespace dsv4 {

struct CudaBackendOptions {
  // Called after each weight upload with the bytes uploaded so far (all
  // weights of this backend) — a progress hook for loaders.
  std::function<void(uint64_t bytes_done)> upload_progress;
  // Print the device's properties (log_info) when the backend starts.
  bool print_properties = true;
  // Batched matmuls (prefill, grouped experts) of Q8_0/Q2_K/Q4_K/IQ2_XXS weights
  // on tensor cores (sm_80+): within f32 rounding of the CPU, but not bitwise
  // equal to the float matvec. false: FFMA tiles that share the matvec's
  // summation order, so chunked prefill, whole prefill and decode agree
  // bitwise (and every switch below that needs tensor cores is off).
  bool tensor_cores = true;
  // The decode experts' IQ2_XXS/Q2_K rows as integer dot products on int8 MMAs
  // with a digit-split x (cuda_idot.cuh, cuda_expert_imma.cuh; with tensor_cores
  // only); false: the float matvec.
  bool int_dot = true;
  // cuBLAS for the prefill matmuls (cuda_gemm.cu; with tensor_cores only):
  // "auto" = libcublas.so.13 from the library path or /usr/local/cuda, "off" =
  // never (the tensor-core tile), else the path of the library to dlopen.
  std::string cublas = "auto";
  // Matmuls of at least this many tokens (>= 2) go to cuBLAS.
  int64_t gemm_min_tokens = 128;
  // Branches (the shared expert beside the router and routed experts) on a
  // second stream; false: every op on one stream.
  bool branches = true;
  // Programmatic dependent launch on sm_90+ (cuda_launch.cuh); false: plain launches.
  bool pdl = true;
  // Prefill experts as one grouped GEMM per matrix that decodes each weight
  // chunk once per 128 assignments (cuda_expert_wgmma.cu; wgmma, sm_90a builds
  // and devices, tensor_cores only), for the experts with at least N
  // assignments in a batch (the others on the tile): "auto" (N = 64), "on"
  // (every expert), "off" (never), or N as a whole number >= 1.
  std::string expert_gemm = "auto";
  // Keep the cuBLAS matmuls' split weights across calls (cuda_gemm.cuh,
  // GemmWeightCache: 6 bytes per dense weight, made by a weight's first prefill
  // matmul) while at least gemm_cache_reserve bytes of device memory stay free;
  // false: split every call (the same bits either way).
  bool gemm_weight_cache = true;
  size_t gemm_cache_reserve = size_t{16} << 30;
  // Profiling: the ops named here (comma-separated; cuda_dup_op_names() lists
  // the ones allowed: those that can run twice with the same result, since they
  // do not read what they write) are launched twice, so a run's slowdown is
  // their marginal cost inside the decode graph and the prefill stream. "" = none.
  std::string dup_ops;
};

// The op names CudaBackendOptions::dup_ops accepts, comma-separated.
const char* cuda_dup_op_names();

// Weight upload totals of a CUDA backend (load-rate reporting).
struct CudaUploadStats {
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  double seconds = 0;  // wall time spent in upload_weight (including the final drain)
  double rate_gbs() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }
};

// True when the CUDA runtime finds at least one usable device (false without
// a driver or GPU; never fails).
bool cuda_device_present();

// A backend on CUDA device `device`. Fails with a clear message when the
// device does not exist or cannot be initialised.
expected<std::unique_ptr<Backend>> make_cuda_backend(int device = 0, const CudaBackendOptions& options = {});

// Upload totals of a backend made by make_cuda_backend (waits for pending copies).
CudaUploadStats cuda_upload_stats(Backend& backend);

}  // namespace dsv4
