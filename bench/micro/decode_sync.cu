// Micro-benchmark: the floor of one op-to-op hand-off of a decode step on one
// GPU, as CUDA graph kernel boundaries (what dsv4 runs: ~1,400-1,700 dependent
// kernels per token, with programmatic dependent launch) against grid-wide
// barriers inside one persistent kernel (what a persistent decode design would
// run instead). Answers: at ~1,100 small ops per token (PERFORMANCE.md),
// how much of a 3.33 ms (300 t/s) step would the hand-offs alone take either way?
//
//   built with -DDSV4_CUDA=ON as build/bench/decode_sync (or: nvcc -O3 -arch=sm_90 -o decode_sync
//   bench/micro/decode_sync.cu); scripts/gpu.sh micro runs it.
//
// Cases, each for B blocks of 128 threads (B = 1, 16, 132; the persistent ones
// at most one block per SM) and K = 1,000 steps:
//   graph plain / graph pdl: K kernels recorded into one graph and replayed
//     (µs per kernel = replay time / K); pdl: every launch carries the
//     programmatic-serialization attribute and every kernel starts with
//     griddepcontrol.wait + launch_dependents, as src/backend/cuda's pdl_enter().
//   persistent cg / persistent flag: one cooperative launch running K steps,
//     each ended by a grid barrier (µs per step = kernel time / K): cg =
//     cooperative_groups grid sync; flag = one arrival counter and a generation
//     word (thread 0 of each block: release fence, atomicAdd, acquire spin).
// Work per step: "none" (thread 0 of block 0 bumps a counter: the pure
// hand-off) or "vec16K" (y = x + 1 over 4,096 floats split across the blocks,
// x of a step = y of the one before, read past L1: a real data dependency of a
// norm-sized activation). The vec16K results are checked (every element must
// equal its start + K); a wrong one is printed as WRONG and the exit code is 1.
#include <cooperative_groups.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.h"

namespace cg = cooperative_groups;

namespace {

constexpr int k_threads = 128;
constexpr int k_vec = 4096;
constexpr int k_steps = 1000;

__device__ __forceinline__ void dependent_launch_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// One step's work: the counter bump, or y = x + 1 over the vector (x read with
// ld.global.cg: L2, never a stale L1 line of an earlier step).
__device__ __forceinline__ void step_work(bool vec, const float* x, float* y, unsigned* counter) {
  if (!vec) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *counter += 1u;
    return;
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k_vec; i += gridDim.x * blockDim.x)
    y[i] = __ldcg(x + i) + 1.0f;
}

__global__ void chain_kernel(const float* x, float* y, unsigned* counter, bool vec) {
  dependent_launch_enter();
  step_work(vec, x, y, counter);
}

struct Barrier {
  unsigned arrive;
  unsigned gen;
};

__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
#else
  v = *reinterpret_cast<const volatile unsigned*>(p);
  __threadfence();
#endif
  return v;
}

// Every block's thread 0 arrives; the last one resets the count and bumps the
// generation the others spin on. gen: the generation this block waits to leave
// (thread 0's copy).
__device__ __forceinline__ void flag_barrier(Barrier* bar, unsigned& gen) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this block's writes before the arrival
    if (atomicAdd(&bar->arrive, 1u) == gridDim.x - 1) {
      atomicExch(&bar->arrive, 0u);
      __threadfence();
      atomicExch(&bar->gen, gen + 1u);
    } else {
      while (ld_acquire_gpu(&bar->gen) == gen) {
      }
    }
    ++gen;
  }
  __syncthreads();
}

template <bool CG>
__global__ void persistent_kernel(float* a, float* b, unsigned* counter, bool vec, int steps, Barrier* bar) {
  unsigned gen = 0;
  for (int s = 0; s < steps; ++s) {
    const float* x = (s & 1) ? b : a;
    float* y = (s & 1) ? a : b;
    step_work(vec, x, y, counter);
    if constexpr (CG) {
      cg::this_grid().sync();
    } else {
      flag_barrier(bar, gen);
    }
  }
}

struct Buffers {
  float* a = nullptr;
  float* b = nullptr;
  unsigned* counter = nullptr;
  Barrier* bar = nullptr;
  Buffers() {
    CK(cudaMalloc(&a, k_vec * sizeof(float)));
    CK(cudaMalloc(&b, k_vec * sizeof(float)));
    CK(cudaMalloc(&counter, sizeof(unsigned)));
    CK(cudaMalloc(&bar, sizeof(Barrier)));
  }
  ~Buffers() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(counter);
    cudaFree(bar);
  }
  void reset(cudaStream_t s) {
    std::vector<float> v(k_vec);
    for (int i = 0; i < k_vec; ++i) v[i] = static_cast<float>(i % 97);
    CK(cudaMemcpyAsync(a, v.data(), k_vec * sizeof(float), cudaMemcpyHostToDevice, s));
    CK(cudaMemsetAsync(counter, 0, sizeof(unsigned), s));
    CK(cudaMemsetAsync(bar, 0, sizeof(Barrier), s));
    CK(cudaStreamSynchronize(s));
  }
  // After `steps` vec steps from reset(): the last y is a (steps even) or b.
  bool check(int steps) const {
    std::vector<float> v(k_vec);
    CK(cudaMemcpy(v.data(), steps % 2 == 0 ? a : b, k_vec * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < k_vec; ++i)
      if (v[i] != static_cast<float>(i % 97) + static_cast<float>(steps)) return false;
    return true;
  }
};

bool g_wrong = false;

void report(const char* mode, int blocks, bool vec, double us, bool checked_ok) {
  std::printf("%-16s blocks %4d  work %-6s  %7.3f us per step%s\n", mode, blocks, vec ? "vec16K" : "none", us,
              checked_ok ? "" : "  WRONG");
  std::fflush(stdout);
  if (!checked_ok) g_wrong = true;
}

void graph_chain(bool pdl, int blocks, bool vec) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Buffers buf;
  buf.reset(s);
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int k = 0; k < k_steps; ++k) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(blocks));
    cfg.blockDim = dim3(k_threads);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    if (pdl) {
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
    }
    const float* x = (k & 1) ? buf.b : buf.a;
    float* y = (k & 1) ? buf.a : buf.b;
    CK(cudaLaunchKernelEx(&cfg, chain_kernel, x, y, buf.counter, vec));
  }
  cudaGraph_t graph;
  CK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CK(cudaGraphInstantiate(&exec, graph, 0));
  // One checked replay, then timed ones (the values drift; only the first is checked).
  CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  const bool ok = !vec || buf.check(k_steps);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int replays = 10;
  CK(cudaEventRecord(e0, s));
  for (int r = 0; r < replays; ++r) CK(cudaGraphLaunch(exec, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  report(pdl ? "graph pdl" : "graph plain", blocks, vec, ms * 1e3 / (replays * k_steps), ok);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(s));
}

template <bool CG>
void persistent(int blocks, bool vec) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Buffers buf;
  int steps = k_steps;
  bool v = vec;
  void* args[] = {&buf.a, &buf.b, &buf.counter, &v, &steps, &buf.bar};
  auto launch = [&] {
    CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel<CG>), dim3(static_cast<unsigned>(blocks)),
                                   dim3(k_threads), args, 0, s));
  };
  buf.reset(s);
  launch();  // warm-up, checked
  CK(cudaStreamSynchronize(s));
  const bool ok = !vec || buf.check(k_steps);
  buf.reset(s);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  launch();
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  report(CG ? "persistent cg" : "persistent flag", blocks, vec, ms * 1e3 / k_steps, ok);
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  int dev = 0, sms = 0, coop = 0, cc_major = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  std::printf("decode_sync: %d SMs, %d steps per case, %d threads per block\n", sms, k_steps, k_threads);
  const int counts[] = {1, 16, sms};
  for (bool vec : {false, true})
    for (int b : counts) {
      graph_chain(false, b, vec);
      if (cc_major >= 9) graph_chain(true, b, vec);  // programmatic launches need sm_90
    }
  if (!coop) {
    std::printf("decode_sync: no cooperative launch on this device; persistent cases skipped\n");
  } else {
    int per_sm_cg = 0, per_sm_flag = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_cg, persistent_kernel<true>, k_threads, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_flag, persistent_kernel<false>, k_threads, 0));
    for (bool vec : {false, true})
      for (int b : counts) {
        if (b > per_sm_cg * sms || b > per_sm_flag * sms) continue;
        persistent<true>(b, vec);
        persistent<false>(b, vec);
      }
  }
  return g_wrong ? 1 : 0;
}
