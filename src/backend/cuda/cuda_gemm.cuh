// Prefill matmuls through cuBLAS (see cuda_gemm.cu).
#pragma once

#include <unordered_map>

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

// The matmul as one f16 tensor-core GEMM (cuBLAS) on exact hi/lo splits of W and
// x, when it applies: ctx.blas loaded, tensor cores on, at least
// ctx.gemm_min_tokens tokens, a Q8_0/Q2_K/Q4_K/IQ2_XXS/F16 weight with rows of
// whole 32-element units, and scratch within k_gemm_max_scratch. Returns false
// (nothing launched) otherwise.
bool launch_matmul_gemm(const CudaContext& ctx, const MatmulOp& op);
// MatmulsOp (one x, several matrices of its width) on the GEMM path with x split
// once for all of them (the same bits as one launch_matmul_gemm each); false
// when any matrix does not take the GEMM path (the caller runs them one by one).
bool launch_matmuls_gemm(const CudaContext& ctx, const MatmulsOp& op);

// The split weights A' = [hi | lo | hi] and row exponents e_r of the GEMM path
// (cuda_gemm.cu), kept across calls: W never changes, so its split is made by
// its first GEMM-path matmul and reused by the next ones (the same bits as a
// split per call). 6 bytes per weight (~34 GB for Flash's dense matrices), so
// an entry is made only while the device keeps `reserve` bytes free after it;
// otherwise (and while a graph is being recorded) the matmul splits per call
// as before. Entries are keyed by the weight's address and shape; drop_range()
// forgets those inside a freed allocation (the backend's free()).
class GemmWeightCache {
 public:
  explicit GemmWeightCache(size_t reserve) : reserve_(reserve) {}
  ~GemmWeightCache();
  GemmWeightCache(const GemmWeightCache&) = delete;
  GemmWeightCache& operator=(const GemmWeightCache&) = delete;

  struct Entry {
    void* mem = nullptr;  // A' [rows, 3 cols] f16, then e_r [rows] int (256-byte aligned)
    size_t bytes = 0, exp_offset = 0;
    int64_t rows = 0, cols = 0;
    GgmlType type = GgmlType::F32;
    bool filled = false;  // A' and e_r written (by the stream order of the first call)
  };
  // The entry of weight w (rows x cols of `type`): an existing one, a new one
  // (filled == false: the caller splits into it), or nullptr (no room, a graph
  // being recorded, or the address cached with another shape).
  Entry* find_or_make(const void* w, int64_t rows, int64_t cols, GgmlType type, cudaStream_t stream);
  void drop_range(const void* begin, size_t bytes);  // the stream must be idle (free() synchronises first)
  // Frees every entry once the device has finished the work queued on it, and
  // makes no new ones from then on: the backend's allocations call it when the
  // device is out of memory (malloc_evicting), so the cache never costs one.
  // Returns the bytes freed; 0 (nothing done) when empty or while `stream` is
  // recording a graph (a device synchronisation would break the recording).
  size_t release_all(cudaStream_t stream);
  size_t bytes() const { return bytes_; }
  size_t entries() const { return map_.size(); }
  uint64_t refused() const { return refused_; }
  bool released() const { return released_; }

 private:
  size_t reserve_, bytes_ = 0;
  uint64_t refused_ = 0;
  bool released_ = false;
  std::unordered_map<const void*, Entry> map_;
};

// cudaMalloc that, when the device is out of memory and `cache` (may be null)
// holds split weights, releases them (release_all(stream)) and tries once more.
cudaError_t malloc_evicting(void** p, size_t bytes, GemmWeightCache* cache, cudaStream_t stream);

// Most scratch one GEMM-path matmul may take (W', x', C; above it the launcher
// leaves the matmul to the tensor-core tile, e.g. the output head over many tokens).
constexpr size_t k_gemm_max_scratch = size_t{3} << 29;  // 1.5 GiB

}  // namespace dsv4::cuda
