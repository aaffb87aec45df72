// Shared pieces of the CUDA kernels: error checking, the per-backend launch
// context (stream, IQ2 tables, scratch memory), warp/block reductions, and
// device versions of the scalar conversions of core/float_conv.h.
//
// Numerics: the device conversions below repeat the host formulas operation
// for operation (IEEE division and square root, no fast math, no contraction
// where the host has none), so quant_sim and the bf16/fp8/fp4 round trips are
// bit-identical to the CPU backend for identical inputs.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_launch.cuh"
#include "core/kv_rows.h"
#include "ops/ops.h"

namespace dsv4::cuda {

// Fatal on any CUDA error: a failed call means bad device state (or a kernel
// that trapped on a broken invariant), which dsv4 cannot recover from.
[[noreturn]] void cuda_fatal(cudaError_t err, const char* stmt, const char* file, int line);

#define CUDA_CHECK(stmt)                                                                                    \
  do {                                                                                                      \
    cudaError_t dsv4_cuda_err_ = (stmt);                                                                    \
    if (dsv4_cuda_err_ != cudaSuccess) ::dsv4::cuda::cuda_fatal(dsv4_cuda_err_, #stmt, __FILE__, __LINE__); \
  } while (0)

// After every kernel launch: reports bad launch configurations at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// Device-side invariant: prints the condition and traps, which makes the next
// checked CUDA call fail (fatal, with the kernel's message on stdout above it).
#define DEVICE_CHECK(cond)                                                                   \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      printf("dsv4 CUDA kernel invariant failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      __trap();                                                                              \
    }                                                                                        \
  } while (0)

// IQ2_XXS lookup tables in device memory (quant::iq2xxs_grid / iq2xxs_signs).
struct QuantTables {
  const uint64_t* iq2_grid = nullptr;  // [256]
  const uint8_t* iq2_signs = nullptr;  // [128]
};

// Device scratch memory of one backend, grown on demand. The pointer stays the
// same until a larger request arrives; growing synchronises the stream first
// (never on the steady decode path, whose sizes repeat).
class GemmWeightCache;  // cuda_gemm.cuh

class DeviceScratch {
 public:
  DeviceScratch() = default;
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void* get(size_t bytes, cudaStream_t stream);
  size_t capacity() const { return bytes_; }
  uint64_t generation() const { return generation_; }  // +1 whenever the buffer moves
  // Released when growing finds the device out of memory (malloc_evicting); null: none.
  void set_evictable(GemmWeightCache* cache) { evictable_ = cache; }

 private:
  GemmWeightCache* evictable_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  uint64_t generation_ = 0;
};

class Blas;                // cuda_blas.h
class HostExpertRunner;    // cuda_host_experts.cuh
class ExpertStreamRunner;  // cuda_expert_stream.cuh
class HostRanges;          // cuda_host_ranges.h
struct PrefetchedExperts;  // cuda_expert_prefetch.cuh

// Everything a launcher needs besides the op itself.
struct CudaContext {
  cudaStream_t stream = nullptr;
  QuantTables tables;
  DeviceScratch* scratch = nullptr;
  int sm_count = 0;
  // Prefill matmuls / grouped experts of block-quantised weights on tensor
  // cores (cuda_mma.cuh); false: the FFMA tiles (bitwise equal to the matvec).
  bool tensor_cores = false;
  // Decode expert matvecs (IQ2_XXS, Q2_K) as integer dot products with a
  // digit-split x on integer MMAs (cuda_idot.cuh, cuda_expert_imma.cuh): on with tensor cores (the same f32-rounding
  // contract); CudaBackendOptions::int_dot = false (--no-int-dot) turns it off.
  bool int_dot = false;
  // Decode matvecs of Q8_0 weights with an int8-32 quantised x (MatmulOp::x_quant, `fast` numerics) as dp4a
  // dot products (cuda_matmul.cu): on with tensor cores (the same contract); CudaOptions::int8_matvec.
  bool int8_matvec = false;
  // Tensor-core tiles of x from an INT8_32 quantiser (MatmulOp::x_quant, MoeExpertsOp::x_quant / mid_quant,
  // `fast` numerics) on int8 MMAs (cuda_mma_i8.cuh; Q8_0, IQ2_XXS, Q4_K, Q2_K, MXFP4): on with tensor cores (the
  // same contract); CudaOptions::int8_tiles.
  bool int8_tiles = false;
  // `fast` numerics' INT8_32 activation quantisation inside the kernel that produces or reads the input
  // (CudaOptions::act_quant_fusion; the same bits): the SwiGLUs, the experts' mid split, the int8 matvec's
  // staging (AUTO, ALL); the norms (RmsNormOp::quant, HcPreOp::norm_quant: ALL only).
  bool fuse_act_quant = true;
  bool fuse_act_quant_norms = false;
  // Batched matmuls of 2 .. 4 tokens of Q8_0/F16/BF16/F32 weights on the token matvec (cuda_matmul.cu);
  // CudaOptions::token_matvec.
  bool token_matvec = false;
  // cuBLAS for the prefill matmuls of at least gemm_min_tokens tokens
  // (cuda_gemm.cu); nullptr: not loaded, off, or on the branch stream.
  Blas* blas = nullptr;
  int64_t gemm_min_tokens = 128;
  // Batched matmuls of at most this many tokens on the FFMA tile (CudaOptions::ffma_max_tokens).
  int64_t ffma_max_tokens = 0;
  // A graph is being recorded (Backend::capture_begin): matmuls stay off cuBLAS (its weight cache allocates).
  bool capturing = false;
  // The split weights of the cuBLAS matmuls kept across calls; nullptr: split per call.
  GemmWeightCache* gemm_cache = nullptr;
  // Prefill experts with >= expert_gemm_min assignments in a batch on the
  // grouped GEMM (cuda_expert_wgmma.cu); 0: never (tensor cores off, no sm_90a
  // kernel here, or CudaBackendOptions::expert_gemm "off"); 1: every expert
  // ("on", tests); k_expert_gemm_auto (-1): a threshold per weight type (expert_gemm_auto_min).
  int expert_gemm_min = 0;
  // The grouped GEMM (cuda_expert_wgmma.cu) takes IQ2_XXS and Q2_K weights as exact integer codes with the block scale
  // in the accumulation (one wgmma per 16 columns and x term instead of two); false: as f16 hi/lo splits like
  // the other types (CudaOptions::expert_gemm_codes).
  bool expert_gemm_codes = true;
  // bf16 terms of q and P in the tensor-core attention of `fast` ops (AttentionOp::fast; CudaOptions).
  int fast_attention_terms = 1;
  // Routed experts of batches of >= expert_group_min tokens grouped by expert (CudaOptions::expert_group_min).
  int64_t expert_group_min = 65;
  // Routed experts in host memory (MoeExpertsOp::slots) used by an op are first copied into GPU memory by one
  // wide copy kernel, then read there (CudaOptions::expert_gather); false: the expert kernels read them in place.
  bool expert_gather = true;
  // With expert_gather, ops of at most host_max_tokens tokens (decode steps) leave a share of their host
  // experts to the CPU (cuda_host_experts.cuh); nullptr: off (CudaOptions::cpu_experts, or no host experts).
  HostExpertRunner* host_experts = nullptr;
  // The backend's registered host memory (device-usable address -> host address); nullptr: none.
  const HostRanges* host_ranges = nullptr;
  int64_t host_max_tokens = 16;
  // Host experts that are not pinned (CudaOptions::stream_experts): ops using them stage them through the host
  // (cuda_expert_stream.cuh) instead of the gather's copy kernel; nullptr: every host expert is pinned.
  ExpertStreamRunner* expert_stream = nullptr;
  // Set by the backend around a moe_experts op whose layer's host experts were prefetched
  // (cuda_expert_prefetch.cuh): the op reads them there instead of gathering; nullptr: gather as usual.
  const PrefetchedExperts* prefetched = nullptr;
};

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Raises a kernel's dynamic shared-memory limit when it needs more than the
// default 48 KiB (`bytes` dynamic plus its `static_bytes` of __shared__ variables).
template <class Kernel>
void allow_smem(Kernel k, size_t bytes, size_t static_bytes = 0) {
  if (bytes + static_bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// ---------------------------------------------------------------------------
// Reductions. All are fixed-order for a fixed block size, so results never
// depend on the batch size or on scheduling.

constexpr unsigned k_full_mask = 0xffffffffu;

// Sum over the warp; the result is valid in lane 0 (tree: 16, 8, 4, 2, 1).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(k_full_mask, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_double(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(k_full_mask, v, o);
  return v;
}
// Max over the warp, NaN-ignoring like std::max(a, b) with a non-NaN a; result in every lane.
__device__ __forceinline__ float warp_max_all(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(k_full_mask, v, o));
  return v;
}

// Block-wide double sum, result broadcast to every thread. `red` holds >= 33
// doubles of shared memory; blockDim.x must be a multiple of 32. Contains
// __syncthreads: every thread of the block must call it.
__device__ __forceinline__ double block_sum_double(double v, double* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum_double(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double s = lane < n_warps ? red[lane] : 0.0;
    s = warp_sum_double(s);
    if (lane == 0) red[32] = s;
  }
  __syncthreads();
  double r = red[32];
  __syncthreads();  // red may be reused right after
  return r;
}

// Block-wide float sum, result broadcast (same structure as block_sum_double).
__device__ __forceinline__ float block_sum_float(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < n_warps ? red[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) red[32] = s;
  }
  __syncthreads();
  float r = red[32];
  __syncthreads();
  return r;
}

// ---------------------------------------------------------------------------
// Scalar conversions (device twins of core/float_conv.h). They are also
// host-callable so that tests/cuda/test_cuda_decode can check them bit for
// bit against the CPU code on a machine without a GPU.

#define DSV4_HD __host__ __device__ __forceinline__
// `#pragma unroll` for code that is also compiled for the host (GCC does not know the pragma).
#ifdef __CUDA_ARCH__
#define DSV4_UNROLL _Pragma("unroll")
#else
#define DSV4_UNROLL
#endif

DSV4_HD uint32_t bits_of(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
DSV4_HD float float_of(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
// a * b and a - b, each rounded to nearest: never fused into an FMA by nvcc
// (the host compiler targets x86-64 without FMA, so plain operators suffice there).
DSV4_HD float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DSV4_HD float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

DSV4_HD float f16_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
DSV4_HD float bf16_bits_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

// Round to bf16 (nearest even) and back; NaN becomes a quiet NaN, as on the host.
DSV4_HD float bf16_round_dev(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return float_of(((x >> 16) | 0x40u) << 16);
  x += 0x7fffu + ((x >> 16) & 1u);
  return float_of((x >> 16) << 16);
}

// 2^ceil(log2(x)) for finite x > 0.
DSV4_HD float pow2_ceil_dev(float x) {
  int e;
  float m = frexpf(x, &e);
  return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

// std::clamp(v, lo, hi) exactly (NaN passes through).
DSV4_HD float clamp_dev(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }

constexpr float k_fp8_max_dev = 448.0f;
constexpr float k_fp4_max_dev = 6.0f;

// Nearest E4M3FN value (ties to even), saturating at +-448.
DSV4_HD float fp8_e4m3_round_dev(float v) {
  float a = fabsf(v);
  if (!(a > 0.0f)) return v != v ? v : 0.0f * v;
  if (a >= k_fp8_max_dev) return copysignf(k_fp8_max_dev, v);
  int e;
  frexpf(a, &e);
  int q_exp = (e - 1 < -6) ? -9 : e - 1 - 3;
  float q = ldexpf(1.0f, q_exp);
  float r = rintf(a / q) * q;  // a / q is exact (q is a power of two); rint: ties to even
  if (r > k_fp8_max_dev) r = k_fp8_max_dev;
  return copysignf(r, v);
}

// One value of an FP8 block under its scale s: e4m3(clamp(v / s, -448, 448)) * s (the host's fp8_block_round
// per value; v / s is exact for a power-of-two s).
__device__ __forceinline__ float fp8_block_value_dev(float v, float s) {
  return __fmul_rn(fp8_e4m3_round_dev(clamp_dev(v / s, -k_fp8_max_dev, k_fp8_max_dev)), s);
}

// One value of an activation quantiser's block (core/act_quant.h) under the block's amax = max(1e-4,
// max_i |x_i|) (NaN values dropped, as std::max drops them): act_quant_row's operations per value; an
// infinite amax makes the block NaN. int8: INT8_32, else FP8_128.
// INT8_32 without a division or a libm call (a fused quantiser runs 32 blocks on one warp in series):
// s and fl(1 / s) from act_int8_block_scale, as act_quant_row computes them.
// One value of an INT8_32 block under its step (the block's scale and fl(1 / scale)).
__device__ __forceinline__ float act_int8_value_dev(float v, Int8Step st) {
  return __fmul_rn(clamp_dev(rintf(__fmul_rn(v, st.inv)), -127.0f, 127.0f), st.scale);
}
__device__ __forceinline__ float act_quant_value_dev(float v, float amax, bool int8) {
  if (isinf(amax)) return __int_as_float(0x7fc00000);
  if (!int8) return fp8_block_value_dev(v, pow2_ceil_dev(amax / k_fp8_max_dev));
  return act_int8_value_dev(v, act_int8_block_scale(amax));
}

// The same for K blocks at once, block k in register k across the warp (lane l holds y[k] = value l of
// block k; bit k of `in` clear for lanes past the row's end), quantised in place. The amax reductions
// run one shuffle stage of all K blocks at a time — K independent shuffles in flight rather than K chains
// of five dependent ones (a one-warp q norm with its 32 blocks in chains measured 7.3 us against 4.6 for
// the norm and a separate act_quant launch, H100). After them every lane holds every block's amax: with
// K > 1 lane k finds block k's step (act_int8_block_scale, ~90 instructions) and the warp broadcasts it —
// one scale computation per lane instead of K, the same operations per block, so the same bits. Every
// lane of the warp calls it.
template <int K>
__device__ __forceinline__ void warp_int8_32_quant_regs(float (&y)[K], uint32_t in) {
  static_assert(K >= 1 && K <= 32, "one block per lane at most");
  float a[K];
#pragma unroll
  for (int k = 0; k < K; ++k) a[k] = (in >> k) & 1u ? fmaxf(1e-4f, fabsf(y[k])) : 1e-4f;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int k = 0; k < K; ++k) a[k] = fmaxf(a[k], __shfl_xor_sync(k_full_mask, a[k], o));
  if constexpr (K == 1) {
    y[0] = act_quant_value_dev(y[0], a[0], true);
  } else {
    const int lane = static_cast<int>(threadIdx.x & 31);
    float mine = 1.0f;  // lanes >= K: any finite amax (their step is not read)
#pragma unroll
    for (int k = 0; k < K; ++k) mine = lane == k ? a[k] : mine;
    const Int8Step st = act_int8_block_scale(isinf(mine) ? 1.0f : mine);  // an infinite amax: NaN below
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const Int8Step sk{__shfl_sync(k_full_mask, st.scale, k), __shfl_sync(k_full_mask, st.inv, k)};
      y[k] = isinf(a[k]) ? __int_as_float(0x7fc00000) : act_int8_value_dev(y[k], sk);
    }
  }
}

// ActQuant::INT8_32 of one whole 32-value block held across a warp (lane l holds value l). Every lane of the
// warp calls it (shuffles).
__device__ __forceinline__ float warp_int8_32_quant(float v) {
  float y[1] = {v};
  warp_int8_32_quant_regs(y, 1u);
  return y[0];
}

// The scale s of a unit of an INT8_32 quantiser's output from the unit's largest |value| alone (core/act_quant.h:
// the quantiser's rule puts it in (127 s_p, 127 s]) and an inverse for its codes, c = rint(v inv): every
// v = c M 2^k with |c| <= 127, so v 2^-k = c M exactly and an approximate 1 / M (relative error ~2^-22) still
// rounds to c. A zero unit gets the floor's scale and codes 0; callers give a non-finite unit the NaN scale.
__device__ __forceinline__ Int8Step int8_codes_scale(float amax) {
  const Int8Scale sc = act_int8_scale(fminf(fmaxf(amax, 1e-4f), 3.0e38f));  // finite (an Inf unit: NaN scale)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(static_cast<float>(sc.M)));
  return {sc.value(), r * Int8Scale::pow2f(-sc.k)};
}

// Nearest E2M1 value, ties to the even code; saturates at +-6 (the storage
// codec's rounding, core/kv_rows.h; checked against fp4_e2m1_round by test_cuda_decode).
DSV4_HD float fp4_e2m1_round_dev(float v) { return kv_e2m1_value(kv_e2m1_code(v)); }

// Order-preserving key of a float: a > b <=> float_key(a) > float_key(b) for
// non-NaN floats; -0 maps to the key of +0 (they compare equal).
DSV4_HD uint32_t float_key(float f) {
  uint32_t u = bits_of(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// 1 / (1 + e^-x), as cpu::sigmoid.
__device__ __forceinline__ float sigmoid_dev(float x) { return 1.0f / (1.0f + expf(-x)); }

}  // namespace dsv4::cuda
