// Block-level row routines shared by the dense kernels (rms_norm, rope,
// quant_sim) and the compressor's row post-processing. One thread block works
// on one row; row pointers may be global or shared memory. Routines marked
// "block-uniform" contain __syncthreads and must be called by every thread of
// the block.
//
// Each routine repeats the float operations of its CPU twin
// (cpu::rms_norm_row, cpu::rope_row, cpu::quant_sim_row): double sum of
// squares, products rounded separately (no fused multiply-add where the CPU
// has none), identical butterflies and roundings, so results are
// bit-identical up to the sum-of-squares order (double, practically never
// visible in the float result) and sinf/cosf accuracy.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace dsv4::cuda {

// RoPE frequencies of a layer (rope_frequencies), passed by value to kernels.
struct RopeTable {
  static constexpr int k_max_pairs = 64;
  float omega[k_max_pairs];
  int n_rot = 0;
};
RopeTable make_rope_table(const RopeParams& p);  // host; asserts n_rot <= 128

// out[i] = x[i] * r * w[i] (or x[i] * r), r = 1/sqrt(mean(x^2) + eps) from a
// double sum of squares. out may alias x. `red`: >= 33 doubles of shared
// memory. Block-uniform.
// Thread k owns elements k, k + blockDim.x, ... and adds their squares in that
// order. Rows of up to k_norm_reg * blockDim.x elements (every norm of the
// model) are loaded into registers first, x and w with all loads in flight:
// the row is read once and the kernel is not a chain of dependent load
// latencies (a single-block norm of 4096 took ~10 us that way). Longer rows
// take the streaming loop; both give the same float operations.
constexpr int k_norm_reg = 16;
//
// q8 (optional, rows in registers only: d <= k_norm_reg * blockDim.x, which
// the callers check): also q8 = the result quantised as ActQuant::INT8_32 (a
// linear layer's input in `fast` numerics; q8 may alias out, which then gets
// only the quantised values).

// Stores a row's normed values held in registers: y[k] is element elem(k) of
// the row (present when elem(k) < d), and register k across a warp is one
// aligned 32-value block of it; with q8 also their INT8_32 quantisation
// (warp_int8_32_quant_regs: the quantiser's operations, bit-identical with an
// ActQuantOp over out). Every lane of the warp calls it.
template <int K, class Elem>
__device__ __forceinline__ void store_normed_regs(float* out, float* q8, float (&y)[K], int64_t d, Elem elem) {
  uint32_t in = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t i = elem(k);
    if (i < d) {
      in |= 1u << k;
      if (out != q8) out[i] = y[k];
    }
  }
  if (!q8) return;
  warp_int8_32_quant_regs(y, in);
#pragma unroll
  for (int k = 0; k < K; ++k)
    if ((in >> k) & 1u) q8[elem(k)] = y[k];
}

// The register path of block_rms_norm_row for a caller that already holds the
// row: v[k] = x[threadIdx.x + k * blockDim.x] and wv[k] = w[same] (any value
// past d; wv unused without w), d <= k_norm_reg * blockDim.x. Block-uniform.
__device__ __forceinline__ void block_rms_norm_regs(float* out, const float (&v)[k_norm_reg],
                                                    const float (&wv)[k_norm_reg], bool has_w, int64_t d, float eps,
                                                    double* red, float* q8 = nullptr) {
  const int64_t nt = blockDim.x;
  double ss = 0.0;
#pragma unroll
  for (int k = 0; k < k_norm_reg; ++k)
    if (threadIdx.x + k * nt < d) ss += static_cast<double>(v[k]) * static_cast<double>(v[k]);
  ss = block_sum_double(ss, red);  // also orders every read of x before the writes below (out may alias x)
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  float y[k_norm_reg];
#pragma unroll
  for (int k = 0; k < k_norm_reg; ++k) y[k] = has_w ? __fmul_rn(__fmul_rn(v[k], r), wv[k]) : __fmul_rn(v[k], r);
  // A warp's 32 threads hold one aligned block per k (blockDim.x a multiple of 32).
  store_normed_regs(out, q8, y, d, [&](int k) { return threadIdx.x + k * nt; });
}

__device__ __forceinline__ void block_rms_norm_row(float* out, const float* x, const float* w, int64_t d, float eps,
                                                   double* red, float* q8 = nullptr) {
  const int64_t nt = blockDim.x;
  if (d <= k_norm_reg * nt) {
    float v[k_norm_reg], wv[k_norm_reg];
#pragma unroll
    for (int k = 0; k < k_norm_reg; ++k) {
      const int64_t i = threadIdx.x + k * nt;
      v[k] = i < d ? x[i] : 0.0f;
      wv[k] = (w && i < d) ? w[i] : 1.0f;
    }
    block_rms_norm_regs(out, v, wv, w != nullptr, d, eps, red, q8);
    return;
  }
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < d; i += nt) {
    const double v = static_cast<double>(x[i]);
    ss += v * v;  // the product is exact in double, so a fused multiply-add changes nothing
  }
  ss = block_sum_double(ss, red);
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  DEVICE_CHECK(!q8);  // the register path only
  for (int64_t i = threadIdx.x; i < d; i += nt) out[i] = w ? __fmul_rn(__fmul_rn(x[i], r), w[i]) : __fmul_rn(x[i], r);
}

// Rotates pair j of a RoPE tail (tail = row + d - n_rot) by pos*omega_j (inverse: -pos*omega_j).
__device__ __forceinline__ void rope_pair(float* tail, int j, float omega, int32_t pos, bool inverse) {
  const float ang = __fmul_rn(static_cast<float>(pos), omega);
  const float c = cosf(ang);
  float s = sinf(ang);
  if (inverse) s = -s;
  const float a = tail[2 * j], b = tail[2 * j + 1];
  tail[2 * j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  tail[2 * j + 1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

// rope_row on one row: thread-parallel over pairs; no barrier inside (callers
// synchronise around it).
__device__ __forceinline__ void block_rope_row(float* x, int64_t d, const RopeTable& rt, int32_t pos, bool inverse) {
  float* tail = x + (d - rt.n_rot);
  for (int j = threadIdx.x; j < rt.n_rot / 2; j += blockDim.x) rope_pair(tail, j, rt.omega[j], pos, inverse);
}

// FP8_BF16: blocks of 64 over [0, n_quant): amax = max(|v|, 1e-4), scale =
// 2^ceil(log2(amax/448)), v = e4m3(clamp(v/scale)) * scale; then every value
// of the row to bf16. One warp per 64-block. No barrier inside.
__device__ __forceinline__ void block_fp8_sim_row(float* x, int64_t d, int n_quant) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int n_blocks = (n_quant + 63) / 64;
  for (int b = warp; b < n_blocks; b += n_warps) {
    const int b0 = 64 * b, b1 = min(b0 + 64, n_quant);
    const int i0 = b0 + lane, i1 = b0 + 32 + lane;
    const float v0 = i0 < b1 ? x[i0] : 0.0f, v1 = i1 < b1 ? x[i1] : 0.0f;
    float amax = 1e-4f;
    if (i0 < b1) amax = fmaxf(amax, fabsf(v0));
    if (i1 < b1) amax = fmaxf(amax, fabsf(v1));
    amax = warp_max_all(amax);
    const float scale = pow2_ceil_dev(amax / k_fp8_max_dev);
    if (i0 < b1) x[i0] = bf16_round_dev(fp8_block_value_dev(v0, scale));
    if (i1 < b1) x[i1] = bf16_round_dev(fp8_block_value_dev(v1, scale));
  }
  for (int64_t i = n_quant + threadIdx.x; i < d; i += blockDim.x) x[i] = bf16_round_dev(x[i]);
}

// HADAMARD_FP4: in-place orthonormal Hadamard transform (butterflies with
// strides 1, 2, 4, ..., then * 1/sqrt(d)), then blocks of 32: amax =
// max(|v|, 6*2^-126), scale = 2^ceil(log2(amax/6)), v = bf16(e2m1(clamp(v/scale)) * scale).
// d must be a power of two. Block-uniform.
__device__ __forceinline__ void block_hadamard_fp4_row(float* x, int64_t d) {
  for (int64_t h = 1; h < d; h *= 2) {
    __syncthreads();
    for (int64_t p = threadIdx.x; p < d / 2; p += blockDim.x) {
      const int64_t i = (p / h) * 2 * h + (p % h);
      const float a = x[i], b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
  }
  __syncthreads();
  const float s = 1.0f / sqrtf(static_cast<float>(d));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int64_t n_blocks = (d + 31) / 32;
  for (int64_t b = warp; b < n_blocks; b += n_warps) {
    const int64_t i = 32 * b + lane;
    const bool in = i < d;
    const float v = in ? __fmul_rn(x[i], s) : 0.0f;
    float amax = 6.0f * 0x1p-126f;
    if (in) amax = fmaxf(amax, fabsf(v));
    amax = warp_max_all(amax);
    const float scale = pow2_ceil_dev(amax / k_fp4_max_dev);
    if (in)
      x[i] = bf16_round_dev(__fmul_rn(fp4_e2m1_round_dev(clamp_dev(v / scale, -k_fp4_max_dev, k_fp4_max_dev)), scale));
  }
  __syncthreads();
}

// quant_sim_row on one row. Block-uniform (ends with a barrier).
__device__ __forceinline__ void block_quant_sim_row(float* x, int64_t d, KvQuantSim sim, int n_quant) {
  switch (sim) {
    case KvQuantSim::NONE: break;
    case KvQuantSim::FP8_BF16: block_fp8_sim_row(x, d, n_quant); break;
    case KvQuantSim::HADAMARD_FP4: block_hadamard_fp4_row(x, d); break;
  }
  __syncthreads();
}

}  // namespace dsv4::cuda
