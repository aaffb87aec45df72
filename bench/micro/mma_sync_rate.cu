// Micro-benchmark: the H200's issue rate of mma.sync.m16n8k16 (f16 inputs, f32
// accumulators) as a function of resident warps per SM and of independent
// accumulators per warp. Answers: what TFLOP/s ceiling do the mma.sync tiles of
// src/backend/cuda (cuda_mma.cuh, cuda_expert_gemm.cuh) have on Hopper?
//   built with -DDSV4_CUDA=ON as build/bench/mma_sync_rate (or: nvcc -O3 -arch=sm_90 -o mma_sync_rate
//   bench/micro/mma_sync_rate.cu); result on an H200: PERFORMANCE.md
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "cuda_check.h"

template <int ACC>
__global__ void mma_loop(float* out, int iters, unsigned seed) {
  float c[ACC][4] = {};
  unsigned a0 = seed ^ threadIdx.x, a1 = a0 * 3u, a2 = a0 * 5u, a3 = a0 * 7u, b0 = a0 * 11u, b1 = a0 * 13u;
  // keep the f16 bit patterns finite: clear exponent bits that would make inf/nan
  a0 &= 0x3bff3bffu;
  a1 &= 0x3bff3bffu;
  a2 &= 0x3bff3bffu;
  a3 &= 0x3bff3bffu;
  b0 &= 0x3bff3bffu;
  b1 &= 0x3bff3bffu;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < ACC; ++k)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
          : "+f"(c[k][0]), "+f"(c[k][1]), "+f"(c[k][2]), "+f"(c[k][3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
  float s = 0;
#pragma unroll
  for (int k = 0; k < ACC; ++k) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
  if (s == 1.2345f) out[threadIdx.x] = s;
}

template <int ACC>
void run(int warps_per_block, int blocks_per_sm, int sms) {
  float* out;
  CK(cudaMalloc(&out, 4096));
  const int iters = 4096;
  const int blocks = sms * blocks_per_sm;
  mma_loop<ACC><<<blocks, 32 * warps_per_block>>>(out, 16, 1);  // warm-up
  CK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  mma_loop<ACC><<<blocks, 32 * warps_per_block>>>(out, iters, 2);
  CK(cudaGetLastError());
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  const double mmas = double(blocks) * warps_per_block * iters * ACC;
  const double tflops = mmas * 4096.0 / (ms * 1e-3) / 1e12;
  printf("acc/warp %2d  warps/SM %3d  %8.3f ms  %7.1f TFLOP/s  %6.2f SM-cycles per MMA @1.98GHz\n", ACC,
         warps_per_block * blocks_per_sm, ms, tflops, (ms * 1e-3 * 1.98e9 * sms) / mmas);
  CK(cudaFree(out));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  printf("mma.sync.m16n8k16 f16 -> f32, %d SMs\n", sms);
  for (int w : {4, 8, 16, 32}) run<8>(w, 1, sms);
  for (int w : {4, 8, 16}) run<16>(w, 1, sms);
  for (int w : {8, 16}) run<4>(w, 1, sms);
  for (int w : {8, 16}) run<2>(w, 1, sms);
  return 0;
}
