// cuBLAS, loaded at run time.
//
// The CUDA binaries link the CUDA runtime statically and need only the driver;
// cuBLAS (libcublas.so.13, ~600 MB with cublasLt) is an optional accelerator
// for the prefill matmuls (cuda_gemm.cu). Blas::load dlopens it: when it is
// missing the backend says so once and keeps the hand-written tensor-core tile.
// Only the handful of entry points used here are resolved; the header
// <cublas_v2.h> supplies their types (nothing is linked).
//
// One handle per backend, bound to the main op stream's work; a 32 MiB
// workspace of its own (cublasSetWorkspace), so a GEMM allocates nothing and is
// safe inside a stream capture. Not for the branch stream (cuda_backend.cu
// clears CudaContext::blas there: the workspace is not shared between streams).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "backend/options/cuda_options.h"
#include <string>

namespace dsv4::cuda {

class Blas {
 public:
  // The library and a handle on the current device, or nullptr with *why set
  // (off, library not found, symbol missing, handle creation failed).
  // AUTO: libcublas.so.13 from the library path, then /usr/local/cuda; OFF:
  // nullptr; LIBRARY: `library`, the path of the library.
  static std::unique_ptr<Blas> load(CublasMode mode, const std::string& library, std::string* why);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // For b = 0 .. batch - 1, column-major, f16 inputs, f32 accumulation and output:
  //   C_b[m x n] = A_b^T B_b (+ C_b when accumulate: one f32 addition per element),
  //                            A_b = A + b sA: k x m (lda >= k), i.e. m rows of k halves
  //                             B_b = B + b sB: k x n (ldb >= k), i.e. n rows of k halves
  //                             C_b = C + b sC: ldc >= m
  // (CUBLAS_OP_T, CUBLAS_OP_N, CUBLAS_COMPUTE_32F: tensor cores, f32 accumulators).
  // Fatal (with cuBLAS's status) on failure, like every other CUDA call.
  void gemm_tn_f16(cudaStream_t stream, int m, int n, int k, const void* A, int lda, int64_t sA, const void* B, int ldb,
                   int64_t sB, float* C, int ldc, int64_t sC, int batch, bool accumulate);

  const std::string& library() const { return library_; }  // e.g. "libcublas.so.13 (cuBLAS 130000)"

 private:
  Blas() = default;
  struct Api;
  std::unique_ptr<Api> api_;
  void* dl_ = nullptr;
  void* handle_ = nullptr;
  void* workspace_ = nullptr;
  std::string library_;
};

}  // namespace dsv4::cuda
