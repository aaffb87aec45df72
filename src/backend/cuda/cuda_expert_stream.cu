// ExpertStreamRunner (cuda_expert_stream.cuh): routed experts copied by the host from the model file's pageable
// mapping into mapped pinned slots, and by the GPU from there into its gather stage.
#include "backend/cuda/cuda_expert_stream.cuh"

#include <algorithm>
#include <cstdio>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "core/log.h"

namespace dsv4::cuda {

namespace {
struct StreamSrc {
  uint64_t src[3];
  int64_t bytes[3];
  int32_t n_expert;
};
struct StreamDst {
  uint8_t* dst[3];
  int64_t bytes[3];
};

// One block: the request's words into the mailbox, then its sequence number (none for an empty list: the copy
// kernel then has nothing to wait for). Every thread fences its own
// writes to system scope before the barrier, so the host sees them before the new number.
__global__ void __launch_bounds__(1024)
    stream_request_kernel(ExpertStreamBox* box, uint32_t* seq, const int32_t* __restrict__ list,
                          const int32_t* __restrict__ count, StreamSrc src) {
  pdl_enter();
  const int32_t n = *count;
  if (n <= 0) return;  // nothing to stage: no request (backend/host/expert_stream.h)
  volatile ExpertStreamBox* b = box;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) b->list[i] = list[i];
  if (threadIdx.x == 0) {
    b->count = n;
    b->n_expert = src.n_expert;
    for (int m = 0; m < 3; ++m) {
      b->src[m] = src.src[m];
      b->bytes[m] = src.bytes[m];
    }
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t s = *seq + 1 == 0 ? 1 : *seq + 1;  // never 0 (RequestPoll: 0 means stopped)
    *seq = s;
    __threadfence_system();
    b->request = s;
  }
}

// Grid (P = gridDim.x blocks per slot, slots in use = gridDim.y); block (x, r) takes stage positions
// c = r, r + slots, ... < *count (cuda_expert_stream.cuh). The P blocks of a slot count themselves done in
// done[r]; counts of position c all land before any of c + slots (those wait for the slot, which the last
// count of c hands back), so the last of c's is the one whose count is a multiple of P (P divides 2^32).
// Slot reads bypass the caches (__ldcv): the same addresses hold another expert at the next position.
__global__ void __launch_bounds__(256)
    stream_copy_kernel(ExpertStreamBox* box, const uint8_t* __restrict__ staging, int64_t slot_bytes, int slots,
                       const uint32_t* __restrict__ seq, uint32_t* __restrict__ done, const int32_t* __restrict__ count,
                       StreamDst d) {
  pdl_enter();
  const int32_t n = *count;
  const uint32_t s = *seq;
  const int r = static_cast<int>(blockIdx.y);
  volatile ExpertStreamBox* b = box;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int32_t c = r; c < n; c += slots) {
    const uint64_t tag = stream_tag(s, c);
    if (threadIdx.x == 0) {
      uint64_t t0 = 0, t = 0;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      while (b->ready[r] != tag) {
        __nanosleep(200);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > ExpertStreamer::k_wait_limit_ns) {
          printf("dsv4: fatal: expert streaming: request %u position %d not staged by the host within %llu s\n", s, c,
                 static_cast<unsigned long long>(ExpertStreamer::k_wait_limit_ns / 1000000000ull));
          __trap();
        }
      }
      __threadfence_system();
    }
    __syncthreads();
    const uint8_t* slot = staging + static_cast<int64_t>(r) * slot_bytes;
    for (int m = 0; m < 3; ++m) {
      const int64_t n16 = d.bytes[m] / 16;
      const uint4* src = reinterpret_cast<const uint4*>(slot);
      uint4* dst = reinterpret_cast<uint4*>(d.dst[m] + static_cast<int64_t>(c) * d.bytes[m]);
      int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
      for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 v0 = __ldcv(src + i), v1 = __ldcv(src + i + stride), v2 = __ldcv(src + i + 2 * stride),
                    v3 = __ldcv(src + i + 3 * stride);
        dst[i] = v0;
        dst[i + stride] = v1;
        dst[i + 2 * stride] = v2;
        dst[i + 3 * stride] = v3;
      }
      for (; i < n16; i += stride) dst[i] = __ldcv(src + i);
      slot += d.bytes[m];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      const uint32_t old = atomicAdd(&done[r], 1u);
      if ((old + 1u) % gridDim.x == 0) {
        __threadfence_system();
        b->consumed[r] = tag;
      }
    }
  }
}
}  // namespace

ExpertStreamRunner::ExpertStreamRunner(int threads) : threads_(threads) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, sizeof(ExpertStreamBox), cudaHostAllocMapped));
  box_ = new (p) ExpertStreamBox();
  CUDA_CHECK(cudaHostGetDevicePointer(&box_d_, p, 0));
  CUDA_CHECK(cudaMalloc(&seq_d_, sizeof(uint32_t) * (1 + k_slots)));
  CUDA_CHECK(cudaMemset(seq_d_, 0, sizeof(uint32_t) * (1 + k_slots)));
  done_d_ = seq_d_ + 1;
  CUDA_CHECK(cudaDeviceSynchronize());
}

ExpertStreamRunner::~ExpertStreamRunner() {
  streamer_.reset();  // joins the worker
  if (staging_) CUDA_CHECK(cudaFreeHost(staging_));
  CUDA_CHECK(cudaFreeHost(box_));
  CUDA_CHECK(cudaFree(seq_d_));
}

Status ExpertStreamRunner::allocate(size_t slot_bytes) {
  slot_bytes = (slot_bytes + 255) / 256 * 256;
  if (slot_bytes <= slot_bytes_) return {};
  streamer_.reset();
  if (staging_) CUDA_CHECK(cudaFreeHost(staging_));
  staging_ = nullptr;
  slot_bytes_ = 0;
  void* p = nullptr;
  const size_t total = static_cast<size_t>(k_slots) * slot_bytes;
  if (const cudaError_t e = cudaHostAlloc(&p, total, cudaHostAllocMapped); e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error("cannot pin %.1f MiB of host memory for streaming experts from the model file: %s",
                      static_cast<double>(total) / (1 << 20), cudaGetErrorString(e));
  }
  staging_ = static_cast<uint8_t*>(p);
  CUDA_CHECK(cudaHostGetDevicePointer(&staging_d_, p, 0));
  slot_bytes_ = slot_bytes;
  streamer_ = std::make_unique<ExpertStreamer>(box_, staging_, k_slots, slot_bytes_, threads_);
  return {};
}

Status ExpertStreamRunner::note_expert_bytes(int64_t bytes) {
  max_expert_bytes_ = std::max(max_expert_bytes_, bytes);
  return streamed_.empty() ? Status{} : allocate(3 * static_cast<size_t>(max_expert_bytes_));
}

Status ExpertStreamRunner::add_streamed(const void* host, size_t bytes) {
  streamed_[reinterpret_cast<uintptr_t>(host)] = bytes;
  return allocate(3 * static_cast<size_t>(max_expert_bytes_));
}

bool ExpertStreamRunner::streamed(const void* p) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = streamed_.upper_bound(a);
  if (it == streamed_.begin()) return false;
  --it;
  return a - it->first < it->second;
}

void ExpertStreamRunner::stage(const CudaContext& ctx, const uint8_t* const src[3], const int64_t bytes[3],
                               int64_t n_expert, const int32_t* list, const int32_t* count, int64_t cap,
                               uint8_t* const dst[3]) {
  DSV4_ASSERT(streamer_, "expert streaming: no staging slots");
  DSV4_ASSERT(n_expert <= k_stream_max_experts && cap <= n_expert, "expert streaming: %lld experts (at most %d)",
              static_cast<long long>(n_expert), k_stream_max_experts);
  DSV4_ASSERT(static_cast<size_t>(bytes[0] + bytes[1] + bytes[2]) <= slot_bytes_,
              "expert streaming: an expert of %lld bytes in slots of %zu",
              static_cast<long long>(bytes[0] + bytes[1] + bytes[2]), slot_bytes_);
  if (cap <= 0) return;
  StreamSrc s{};
  StreamDst d{};
  for (int m = 0; m < 3; ++m) {
    DSV4_ASSERT(src[m] && bytes[m] % 16 == 0 && reinterpret_cast<uintptr_t>(dst[m]) % 16 == 0,
                "expert streaming: matrix %d not streamable", m);
    s.src[m] = reinterpret_cast<uint64_t>(src[m]);
    s.bytes[m] = d.bytes[m] = bytes[m];
    d.dst[m] = dst[m];
  }
  s.n_expert = static_cast<int32_t>(n_expert);
  launch_kernel(stream_request_kernel, 1, 1024, 0, ctx.stream, static_cast<ExpertStreamBox*>(box_d_), seq_d_, list,
                count, s);
  CUDA_CHECK_LAUNCH();
  const int slots = static_cast<int>(std::min<int64_t>(k_slots, cap));
  launch_kernel(stream_copy_kernel, dim3(k_blocks_per_slot, static_cast<unsigned>(slots)), 256, 0, ctx.stream,
                static_cast<ExpertStreamBox*>(box_d_), static_cast<const uint8_t*>(staging_d_),
                static_cast<int64_t>(slot_bytes_), k_slots, static_cast<const uint32_t*>(seq_d_), done_d_, count, d);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
