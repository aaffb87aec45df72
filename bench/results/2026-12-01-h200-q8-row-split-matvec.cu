// Kernel experiment (llm.c dev/cuda style: checked, then timed; not part of the
// engine): does a Q8_0 decode matvec read faster when each row is repacked at
// load time from 34-byte GGUF blocks into
//
//   row r: [codes: cols int8][scales: cols/32 f16]   (row_bytes = 1.0625 cols, unchanged)
//
// so that a lane can load 16 codes with one aligned 16-byte load straight into
// registers (the GGUF blocks are 34 bytes: the production matvec stages them
// through shared memory with cp.async)?
//
//   y[r] = sum_u d[r, u] * sum_{i<32} q[r, 32u + i] * x[32u + i]
//
// Kernel: one warp per row (8 rows per 256-thread block); lane l owns the
// 16-code chunks c = l + 32 j (j < cols / 512): all of the row's chunk loads are
// issued before any arithmetic (cols / 512 16-byte loads in flight per lane), x
// sits in shared memory permuted so that lane l's float4 of chunk (j, q) is
// float4 (4 j + q) * 32 + l (conflict-free). The f16 scale of unit c / 2 comes
// from the row tail (2-byte loads that share sectors across the warp).
//
// Timing: the weight is allocated in 4 copies (> 2 x L2) and the launches
// rotate over them, like bench_cuda_ops: a graph of 16 launches replayed 25 times, cudaEvent time / launch.
// Compare with `bench_cuda_ops --filter Q8_0` in the same call (the production
// kernel on the GGUF layout, same shapes).
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o q8_row_split_matvec bench/results/2026-12-01-h200-q8-row-split-matvec.cu
// Result (slower than the production kernel): bench/results/2026-12-01-h200-q8-row-split-matvec-slower.txt
//   ./q8_row_split_matvec            # prints one line per shape: us, GB/s, NMSE vs a double reference
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

namespace {

constexpr int k_warps = 8;

__device__ __forceinline__ float s8(uint32_t w, int j) {
  return static_cast<float>(static_cast<int8_t>((w >> (8 * j)) & 0xff));
}

// J = cols / 512 chunks per lane; MINB: blocks per SM asked of the register allocator.
template <int J, int MINB>
__global__ void __launch_bounds__(256, MINB) q8_split_matvec(const uint8_t* __restrict__ w, const float* __restrict__ x,
                                                        float* __restrict__ y, int rows) {
  constexpr int cols = J * 512;
  constexpr size_t row_bytes = cols + cols / 16;
  __shared__ float4 xs[cols / 4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = blockIdx.x * k_warps + warp;
  const uint8_t* row = w + static_cast<size_t>(r < rows ? r : 0) * row_bytes;
  // Loads first: the row's codes and scales.
  uint4 q[J];
  __half d[J];
#pragma unroll
  for (int j = 0; j < J; ++j) q[j] = __ldg(reinterpret_cast<const uint4*>(row) + lane + 32 * j);
#pragma unroll
  for (int j = 0; j < J; ++j) d[j] = __ldg(reinterpret_cast<const __half*>(row + cols) + (lane + 32 * j) / 2);
  // x, permuted: float4 (4 j + qq) * 32 + l = x[16 (l + 32 j) + 4 qq ..].
  for (int i = threadIdx.x; i < cols / 4; i += 256) {
    const int l = i & 31, qq = (i >> 5) & 3, j = i >> 7;
    xs[i] = __ldg(reinterpret_cast<const float4*>(x) + 4 * (l + 32 * j) + qq);
  }
  __syncthreads();
  if (r >= rows) return;
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const uint32_t wd[4] = {q[j].x, q[j].y, q[j].z, q[j].w};
    float p = 0.f;
#pragma unroll
    for (int qq = 0; qq < 4; ++qq) {
      const float4 xv = xs[(4 * j + qq) * 32 + lane];
      p = fmaf(s8(wd[qq], 0), xv.x, p);
      p = fmaf(s8(wd[qq], 1), xv.y, p);
      p = fmaf(s8(wd[qq], 2), xv.z, p);
      p = fmaf(s8(wd[qq], 3), xv.w, p);
    }
    acc = fmaf(__half2float(d[j]), p, acc);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) y[r] = acc;
}

struct Shape {
  int rows, cols;
};

template <int J, int MINB = 1>
void run(int rows) {
  constexpr int cols = J * 512;
  const size_t row_bytes = cols + cols / 16, bytes = row_bytes * rows;
  // Host weights: random codes, scales ~ 1e-3.
  std::vector<uint8_t> hw(bytes);
  uint64_t s = 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(rows) << 20) ^ cols;
  auto rnd = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (int r = 0; r < rows; ++r) {
    uint8_t* row = hw.data() + static_cast<size_t>(r) * row_bytes;
    for (int c = 0; c < cols; ++c) row[c] = static_cast<uint8_t>(rnd());
    for (int u = 0; u < cols / 32; ++u) {
      const __half h = __float2half(1e-3f * (1.0f + static_cast<float>(rnd() % 1000) / 1000.0f));
      std::memcpy(row + cols + 2 * u, &h, 2);
    }
  }
  std::vector<float> hx(cols);
  for (auto& v : hx) v = static_cast<float>(static_cast<int64_t>(rnd() % 20001) - 10000) / 5000.0f;
  // Reference in double.
  std::vector<double> ref(rows);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = hw.data() + static_cast<size_t>(r) * row_bytes;
    double acc = 0;
    for (int u = 0; u < cols / 32; ++u) {
      __half h;
      std::memcpy(&h, row + cols + 2 * u, 2);
      const double d = __half2float(h);
      double p = 0;
      for (int i = 0; i < 32; ++i) p += static_cast<double>(static_cast<int8_t>(row[32 * u + i])) * hx[32 * u + i];
      acc += d * p;
    }
    ref[r] = acc;
  }
  constexpr int copies = 4;
  uint8_t* dw = nullptr;
  float *dx = nullptr, *dy = nullptr;
  CK(cudaMalloc(&dw, bytes * copies));
  CK(cudaMalloc(&dx, cols * sizeof(float)));
  CK(cudaMalloc(&dy, rows * sizeof(float)));
  for (int c = 0; c < copies; ++c) CK(cudaMemcpy(dw + c * bytes, hw.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, hx.data(), cols * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMemset(dy, 0xff, rows * sizeof(float)));  // NaN poison
  const dim3 grid((rows + k_warps - 1) / k_warps);
  q8_split_matvec<J, MINB><<<grid, 256>>>(dw, dx, dy, rows);
  CK(cudaGetLastError());
  std::vector<float> hy(rows);
  CK(cudaMemcpy(hy.data(), dy, rows * sizeof(float), cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    if (!std::isfinite(hy[r])) ++bad;
    num += (hy[r] - ref[r]) * (hy[r] - ref[r]);
    den += ref[r] * ref[r];
  }
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // One graph of 16 launches rotating over the copies (as bench_cuda_ops records its ops), replayed 25 times.
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const int per_graph = 16, replays = 25, reps = per_graph * replays;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) q8_split_matvec<J, MINB><<<grid, 256, 0, st>>>(dw + (i % copies) * bytes, dx, dy, rows);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  CK(cudaEventRecord(e0, st));
  for (int i = 0; i < replays; ++i) CK(cudaGraphLaunch(ge, st));
  CK(cudaEventRecord(e1, st));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  const double us = 1e3 * ms / reps;
  std::printf("q8 row-split matvec %6dx%-6d minb %d %8.2f us %8.1f GB/s  NMSE %.2e  non-finite %d\n", rows, cols, MINB, us,
              static_cast<double>(bytes) / us / 1e3, num / den, bad);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
  CK(cudaFree(dw));
  CK(cudaFree(dx));
  CK(cudaFree(dy));
}

}  // namespace

int main() {
  run<16>(4096);   // 4096 x 8192 (attention output, wo_b)
  run<16, 2>(4096);
  run<16, 3>(4096);
  run<2>(32768);   // 32768 x 1024 (wq_b)
  run<8>(4096);    // 4096 x 4096
  run<8, 3>(4096);
  run<4>(4096);    // 4096 x 2048 (shared expert down)
  return 0;
}
