// Result on an H200: LBO = K stride is right; ~950 TFLOP/s from shared memory (PERFORMANCE.md).
// Micro-check and micro-benchmark: wgmma (sm_90a) with both operands in shared memory (f16, K-major, no swizzle)
// and f32 accumulators — the building block of the grouped expert GEMM (docs/design-notes/moe-grouped-gemm.md:
// mma.sync versions of it were bound by ldmatrix traffic and mma.sync's issue rate). It settles what the PTX
// manual's prose leaves open:
//  1. check: D = A B^T (64 x N x K = 64) against the CPU for two shared layouts of 8x8 "core matrices"
//     (row-group-major or K-major order of the cores) x the two readings of the descriptor's leading / stride
//     byte offsets (LBO = the stride between cores along K and SBO along M/N, or the other way round); the
//     accumulator fragment is read back as (row 16 w + g + 8 (i / 2), column 8 j + 2 t + i % 2) for value
//     4 j + i of lane (g = lane / 4, t = lane % 4) of warp w — the mma.sync C layout repeated over N / 8;
//     a variant with max error ~1e-6 is the right one.
//  2. rate: m64n64k16 and m64n128k16 with 1 or 3 products per k-step (the hi/lo split needs 3), 1 or 2
//     warpgroups per SM, operands resident in shared memory; prints TFLOP/s of MMAs.
// Build: -DDSV4_CUDA=ON builds it as bench/wgmma_f16 for sm_90a (it needs the arch-specific target);
// or: nvcc -O3 -gencode arch=compute_90a,code=sm_90a -o wgmma_f16 bench/micro/wgmma_f16.cu
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_check.h"

constexpr int kK = 64;  // K of the check

// Offset (in halves) of element (r, k) of a rows x K operand stored as 8x8 core matrices of 16-byte rows:
// layout 0: cores in row-group-major order (core (mi, ki) at mi * K/8 + ki); layout 1: K-major order (ki * rows/8 +
// mi).
__host__ __device__ inline int core_offset(int layout, int rows, int K, int r, int k) {
  const int mi = r / 8, ki = k / 8, core = layout == 0 ? mi * (K / 8) + ki : ki * (rows / 8) + mi;
  return core * 64 + (r % 8) * 8 + (k % 8);
}
// Byte strides between neighbouring cores along K and along the rows.
__host__ __device__ inline int k_stride(int layout, int rows) { return layout == 0 ? 128 : (rows / 8) * 128; }
__host__ __device__ inline int r_stride(int layout, int K) { return layout == 0 ? (K / 8) * 128 : 128; }

// Shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte units), no swizzle.
__device__ inline uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);
}
__device__ inline void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ inline void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// D (64 x 64, f32, this thread's 32 values) (+)= A (64 x 16) * B (64 x 16)^T, both f16 K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "
      "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, "
      "0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}

// D (64 x 128, f32, this thread's 64 values) (+)= A (64 x 16) * B (128 x 16)^T, both f16 K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}

template <int N>
__device__ inline void wgmma_k16(float (&d)[N / 2], uint64_t da, uint64_t db, int acc) {
  if constexpr (N == 64)
    wgmma_m64n64k16(d, da, db, acc);
  else
    wgmma_m64n128k16(d, da, db, acc);
}

// One warpgroup: D (64 x N) = A (64 x K) B (N x K)^T through wgmma, written back with the assumed fragment layout.
template <int N>
__global__ void __launch_bounds__(128) wgmma_check(const __half* A, const __half* B, float* D, int layout, int swap) {
  extern __shared__ __align__(128) __half sm[];
  __half* sa = sm;
  __half* sb = sm + 64 * kK;
  const int tid = threadIdx.x;
  for (int i = tid; i < 64 * kK; i += 128) sa[core_offset(layout, 64, kK, i / kK, i % kK)] = A[i];
  for (int i = tid; i < N * kK; i += 128) sb[core_offset(layout, N, kK, i / kK, i % kK)] = B[i];
  fence_async_smem();
  __syncthreads();
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  const uint32_t ka = k_stride(layout, 64), ra = r_stride(layout, kK), kb = k_stride(layout, N),
                 rb = r_stride(layout, kK);
  uint64_t da[kK / 16], db[kK / 16];  // all descriptors before the first wgmma
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    da[ks] = swap ? smem_desc(sa + core_offset(layout, 64, kK, 0, 16 * ks), ra, ka)
                  : smem_desc(sa + core_offset(layout, 64, kK, 0, 16 * ks), ka, ra);
    db[ks] = swap ? smem_desc(sb + core_offset(layout, N, kK, 0, 16 * ks), rb, kb)
                  : smem_desc(sb + core_offset(layout, N, kK, 0, 16 * ks), kb, rb);
  }
  wg_fence();
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) wgmma_k16<N>(d, da[ks], db[ks], ks > 0);
  wg_commit();
  wg_wait<0>();
  const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) D[(16 * w + g + 8 * (i / 2)) * N + 8 * j + 2 * t + (i % 2)] = d[4 * j + i];
}

// WG warpgroups per block, each accumulating P products per k-step over a resident 64 x 64 (A) and N x 64 (B)
// pair per product (layout 0, descriptors as given), `iters` times; one wgmma group in flight.
template <int N, int P, int WG>
__global__ void __launch_bounds__(128 * WG) wgmma_rate(float* out, int iters, int swap) {
  extern __shared__ __align__(128) __half sm[];
  const int tid = threadIdx.x;
  const int a_el = 64 * kK, b_el = N * kK;
  for (int i = tid; i < P * (a_el + b_el); i += blockDim.x)
    sm[i] = __float2half(0.001f * static_cast<float>((i * 7) % 13 - 6));
  fence_async_smem();
  __syncthreads();
  float d[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
  const uint32_t ka = k_stride(0, 64), ra = r_stride(0, kK), kb = k_stride(0, N), rb = r_stride(0, kK);
  for (int it = 0; it < iters; ++it) {
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kK / 16; ++ks)
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const __half* a = sm + p * (a_el + b_el) + core_offset(0, 64, kK, 0, 16 * ks);
        const __half* b = sm + p * (a_el + b_el) + a_el + core_offset(0, N, kK, 0, 16 * ks);
        const uint64_t da = swap ? smem_desc(a, ra, ka) : smem_desc(a, ka, ra);
        const uint64_t db = swap ? smem_desc(b, rb, kb) : smem_desc(b, kb, rb);
        wgmma_k16<N>(d, da, db, 1);
      }
    wg_commit();
    wg_wait<1>();
  }
  wg_wait<0>();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) s += d[i];
  if (s == 1.2345f) out[tid] = s;  // keeps the loop
}

template <int N>
void check(int layout, int swap) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<__half> A(64 * kK), B(N * kK);
  std::vector<float> Af(A.size()), Bf(B.size());
  for (size_t i = 0; i < A.size(); ++i) Af[i] = __half2float(A[i] = __float2half(u(rng)));
  for (size_t i = 0; i < B.size(); ++i) Bf[i] = __half2float(B[i] = __float2half(u(rng)));
  __half *dA, *dB;
  float* dD;
  CK(cudaMalloc(&dA, A.size() * 2));
  CK(cudaMalloc(&dB, B.size() * 2));
  CK(cudaMalloc(&dD, 64 * N * 4));
  CK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemset(dD, 0xff, 64 * N * 4));  // NaN
  const size_t smem = (A.size() + B.size()) * 2;
  CK(cudaFuncSetAttribute(wgmma_check<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  wgmma_check<N><<<1, 128, smem>>>(dA, dB, dD, layout, swap);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> D(64 * N);
  CK(cudaMemcpy(D.data(), dD, D.size() * 4, cudaMemcpyDeviceToHost));
  double max_err = 0.0, max_ref = 0.0;
  int bad = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0.0;
      for (int k = 0; k < kK; ++k) ref += static_cast<double>(Af[m * kK + k]) * Bf[n * kK + k];
      const double e = std::fabs(ref - D[m * N + n]);
      if (!(e <= 1e-3)) ++bad;
      max_err = std::fmax(max_err, std::isnan(e) ? 1e30 : e);
      max_ref = std::fmax(max_ref, std::fabs(ref));
    }
  std::printf("check m64n%dk16 x %d: layout %s, LBO = %s stride: max |err| %.3g (max |D| %.3g), %d of %d off -> %s\n",
              N, kK / 16, layout == 0 ? "row-group-major cores" : "K-major cores", swap ? "row" : "K", max_err, max_ref,
              bad, 64 * N, bad == 0 ? "OK" : "wrong");
  CK(cudaFree(dA));
  CK(cudaFree(dB));
  CK(cudaFree(dD));
}

template <int N, int P, int WG>
void rate(int sms, int blocks_per_sm, int swap) {
  float* out;
  CK(cudaMalloc(&out, 4096));
  const size_t smem = static_cast<size_t>(P) * (64 + N) * kK * 2;
  CK(cudaFuncSetAttribute(wgmma_rate<N, P, WG>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int blocks = sms * blocks_per_sm, iters = 2048;
  wgmma_rate<N, P, WG><<<blocks, 128 * WG, smem>>>(out, 8, swap);
  CK(cudaGetLastError());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  wgmma_rate<N, P, WG><<<blocks, 128 * WG, smem>>>(out, iters, swap);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0.0f;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  const double flop = 2.0 * 64 * N * 16 * (kK / 16) * P * static_cast<double>(iters) * WG * blocks;
  std::printf("rate m64n%dk16, %d product(s) per k-step, %d warpgroup(s) x %d block(s) per SM: %.3f ms, %.1f TFLOP/s\n",
              N, P, WG, blocks_per_sm, ms, flop / (ms * 1e-3) / 1e12);
  CK(cudaFree(out));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("wgmma f16 -> f32, shared-memory operands, no swizzle; %s, %d SMs\n", p.name, sms);
  // Measured on an H200: LBO = K stride is right for both core orders; LBO = row stride is wrong for the
  // row-group-major order and faults (illegal address, a sticky error) for the K-major order, so that one is skipped.
  for (int layout : {0, 1})
    for (int swap : {0, 1}) {
      if (layout == 1 && swap == 1) continue;
      check<64>(layout, swap);
      check<128>(layout, swap);
    }
  for (int swap : {0}) {
    std::printf("-- rates, LBO = %s stride\n", swap ? "row" : "K");
    rate<64, 1, 1>(sms, 1, swap);
    rate<64, 1, 2>(sms, 1, swap);
    rate<64, 3, 2>(sms, 1, swap);
    rate<128, 1, 2>(sms, 1, swap);
    rate<128, 3, 1>(sms, 1, swap);
    rate<128, 3, 2>(sms, 1, swap);
    rate<64, 3, 1>(sms, 2, swap);
  }
  return 0;
}
