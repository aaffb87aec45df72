// cuBLAS loaded at run time (see cuda_blas.h).
#include "backend/cuda/cuda_blas.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "core/error.h"

namespace dsv4::cuda {

// The entry points, typed after <cublas_api.h> (declared here: the header's
// C++ overloads make decltype of the names ambiguous).
struct Blas::Api {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*get_version)(cublasHandle_t, int*) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t) = nullptr;
  const char* (*status_string)(cublasStatus_t) = nullptr;  // optional
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                         const void*, const void*, cudaDataType, int, long long, const void*,
                                         cudaDataType, int, long long, const void*, void*, cudaDataType, int, long long,
                                         int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

namespace {

constexpr size_t k_workspace_bytes = size_t{32} << 20;  // cuBLAS's recommendation for Hopper

template <class F>
bool resolve(void* dl, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(dl, name));
  return f != nullptr;
}

}  // namespace

std::unique_ptr<Blas> Blas::load(CublasMode mode, const std::string& library, std::string* why) {
  if (mode == CublasMode::OFF) {
    *why = "off (--cublas off)";
    return nullptr;
  }
  std::vector<std::string> names;
  if (mode == CublasMode::LIBRARY)
    names.push_back(library);
  else
    names = {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so.12", "libcublas.so"};
  void* dl = nullptr;
  std::string tried;
  for (const std::string& n : names) {
    dl = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (dl) {
      tried = n;
      break;
    }
    const char* e = dlerror();
    tried += (tried.empty() ? "" : "; ") + n + ": " + (e ? e : "not found");
  }
  if (!dl) {
    *why = "libcublas not found (" + tried + ")";
    return nullptr;
  }
  std::unique_ptr<Blas> b(new Blas());
  b->dl_ = dl;  // closed by ~Blas from here on
  b->api_ = std::make_unique<Api>();
  Api& a = *b->api_;
  if (!resolve(dl, "cublasCreate_v2", a.create) || !resolve(dl, "cublasDestroy_v2", a.destroy) ||
      !resolve(dl, "cublasGetVersion_v2", a.get_version) || !resolve(dl, "cublasSetStream_v2", a.set_stream) ||
      !resolve(dl, "cublasSetWorkspace_v2", a.set_workspace) ||
      !resolve(dl, "cublasGemmStridedBatchedEx", a.gemm_strided_batched)) {
    *why = tried + " lacks a cuBLAS entry point this build uses";
    return nullptr;
  }
  resolve(dl, "cublasGetStatusString", a.status_string);
  cublasHandle_t h = nullptr;
  const cublasStatus_t st = a.create(&h);
  if (st != CUBLAS_STATUS_SUCCESS) {
    *why = strfmt("%s: cublasCreate failed (status %d)", tried.c_str(), static_cast<int>(st));
    return nullptr;
  }
  b->handle_ = h;
  CUDA_CHECK(cudaMalloc(&b->workspace_, k_workspace_bytes));
  if (a.set_workspace(h, b->workspace_, k_workspace_bytes) != CUBLAS_STATUS_SUCCESS) {
    *why = tried + ": cublasSetWorkspace failed";
    return nullptr;
  }
  int version = 0;
  a.get_version(h, &version);
  b->library_ = strfmt("%s (cuBLAS %d)", tried.c_str(), version);
  return b;
}

Blas::~Blas() {
  if (handle_ && api_) api_->destroy(static_cast<cublasHandle_t>(handle_));
  if (workspace_) cudaFree(workspace_);
  if (dl_) dlclose(dl_);
}

void Blas::gemm_tn_f16(cudaStream_t stream, int m, int n, int k, const void* A, int lda, int64_t sA, const void* B,
                       int ldb, int64_t sB, float* C, int ldc, int64_t sC, int batch, bool accumulate) {
  auto h = static_cast<cublasHandle_t>(handle_);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  cublasStatus_t st = api_->set_stream(h, stream);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = api_->gemm_strided_batched(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16F, lda, sA, B, CUDA_R_16F,
                                    ldb, sB, &beta, C, CUDA_R_32F, ldc, sC, batch, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
  DSV4_ASSERT(st == CUBLAS_STATUS_SUCCESS, "cuBLAS GEMM (m %d, n %d, k %d, batch %d) failed: %s (status %d)", m, n, k,
              batch, api_->status_string ? api_->status_string(st) : "?", static_cast<int>(st));
}

}  // namespace dsv4::cuda
