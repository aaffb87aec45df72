// KV state rows in their storage format on the device: F32, or the compact
// KV_FP8 / KV_FP4 rows of core/kv_rows.h (layouts and maths there). The CPU
// reference is cpu::kv_row_store / kv_row_load (cpu_kv_rows.cpp), which call
// the same scalar codecs, so packed bytes and unpacked floats are bit-identical.
//
//   block_store_kv_row  a thread block packs one row: a warp per scale block
//                       (64 FP8 dims: 2 per lane; 32 FP4 dims: 1 per lane,
//                       neighbours' nibbles joined by a shuffle), warp max of
//                       |v| for the scale; the RoPE tail and padding by thread.
//   warp_load_kv_row    a warp unpacks one row into f32 (shared memory in the
//                       attention and indexer kernels): 4 codes per 32-bit
//                       load, F32 rows by float4.
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "core/kv_rows.h"

namespace dsv4::cuda {

// Host: asserts that t is a KV state tensor in a supported format and width.
inline void check_kv_rows(const Tensor& t, const char* op) {
  const int64_t d = t.ne[0];
  const bool ok = (t.type == GgmlType::F32) || (t.type == GgmlType::KV_FP8 && kv_fp8_width_ok(d)) ||
                  (t.type == GgmlType::KV_FP4 && kv_fp4_width_ok(d));
  DSV4_ASSERT(ok, "%s: KV rows of type %s and width %lld unsupported", op, ggml_type_name(t.type),
              static_cast<long long>(d));
}

// Row r of a KV state tensor (any of the three formats).
__device__ __forceinline__ uint8_t* kv_row_ptr(void* base, GgmlType type, int64_t d, int64_t r) {
  const int64_t bytes = type == GgmlType::F32      ? 4 * d
                        : type == GgmlType::KV_FP8 ? kv_fp8_row_bytes(d)
                                                   : kv_fp4_row_bytes(d);
  return static_cast<uint8_t*>(base) + r * bytes;
}
__device__ __forceinline__ const uint8_t* kv_row_ptr(const void* base, GgmlType type, int64_t d, int64_t r) {
  return kv_row_ptr(const_cast<void*>(base), type, d, r);
}

// dst (a row in `type`'s format) = x[0, d). Every thread of the block must call it; no barrier inside.
__device__ __forceinline__ void block_store_kv_row(uint8_t* dst, const float* x, int64_t d, GgmlType type) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  if (type == GgmlType::F32) {
    float* o = reinterpret_cast<float*>(dst);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) o[i] = x[i];
  } else if (type == GgmlType::KV_FP8) {
    const int64_t n = kv_fp8_nope(d);
    for (int64_t b = warp; b < n / k_kv_fp8_block; b += n_warps) {
      const float v0 = x[64 * b + lane], v1 = x[64 * b + 32 + lane];
      const uint8_t s = kv_fp8_block_scale(warp_max_all(fmaxf(fabsf(v0), fabsf(v1))));
      const float scale = kv_scale_value(s);
      dst[64 * b + lane] = kv_fp8_encode(v0, scale);
      dst[64 * b + 32 + lane] = kv_fp8_encode(v1, scale);
      if (lane == 0) dst[kv_fp8_scale_offset(d) + b] = s;
    }
    uint16_t* tail = reinterpret_cast<uint16_t*>(dst + kv_fp8_tail_offset(d));
    for (int j = threadIdx.x; j < k_kv_rope_dims; j += blockDim.x) tail[j] = kv_bf16_code(x[n + j]);
    for (int64_t i = kv_fp8_scale_offset(d) + n / k_kv_fp8_block + threadIdx.x; i < kv_fp8_row_bytes(d);
         i += blockDim.x)
      dst[i] = 0;
  } else {  // KV_FP4
    for (int64_t b = warp; b < d / k_kv_fp4_block; b += n_warps) {
      const float v = x[32 * b + lane];
      const uint8_t s = kv_fp4_block_scale(warp_max_all(fabsf(v)));
      const uint8_t c = kv_fp4_encode(v, kv_scale_value(s));
      const uint8_t hi = static_cast<uint8_t>(__shfl_down_sync(k_full_mask, c, 1));
      if ((lane & 1) == 0) dst[(32 * b + lane) / 2] = static_cast<uint8_t>(c | (hi << 4));
      if (lane == 0) dst[kv_fp4_scale_offset(d) + b] = s;
    }
  }
}

// dst[0, d) = the row at src. Every lane of the warp must call it; no sync inside.
// KV_FP8 stores float4s: dst 16-byte aligned.
__device__ __forceinline__ void warp_load_kv_row(float* dst, const uint8_t* src, int64_t d, GgmlType type) {
  const int lane = threadIdx.x & 31;
  if (type == GgmlType::F32) {
    const float* s = reinterpret_cast<const float*>(src);
    for (int64_t e = lane; e < d; e += 32) dst[e] = s[e];
  } else if (type == GgmlType::KV_FP8) {
    const int64_t n = kv_fp8_nope(d);
    const uint8_t* scales = src + kv_fp8_scale_offset(d);
    for (int64_t e = 4 * lane; e < n; e += 128) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(src + e);
      const float scale = kv_scale_value(scales[e / k_kv_fp8_block]);
      float4 o;
      o.x = kv_e4m3_value(static_cast<uint8_t>(w)) * scale;
      o.y = kv_e4m3_value(static_cast<uint8_t>(w >> 8)) * scale;
      o.z = kv_e4m3_value(static_cast<uint8_t>(w >> 16)) * scale;
      o.w = kv_e4m3_value(static_cast<uint8_t>(w >> 24)) * scale;
      *reinterpret_cast<float4*>(dst + e) = o;
    }
    const uint32_t* tail = reinterpret_cast<const uint32_t*>(src + kv_fp8_tail_offset(d));
    for (int j = lane; j < k_kv_rope_dims / 2; j += 32) {
      const uint32_t w = tail[j];
      dst[n + 2 * j] = kv_bf16_value(static_cast<uint16_t>(w));
      dst[n + 2 * j + 1] = kv_bf16_value(static_cast<uint16_t>(w >> 16));
    }
  } else {  // KV_FP4: byte j holds dims 2j, 2j+1
    const uint8_t* scales = src + kv_fp4_scale_offset(d);
    for (int64_t j = 4 * lane; j < d / 2; j += 128) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(src + j);
      const float scale = kv_scale_value(scales[2 * j / k_kv_fp4_block]);
#pragma unroll
      for (int q = 0; q < 8; ++q) dst[2 * j + q] = kv_e2m1_value(static_cast<uint8_t>((w >> (4 * q)) & 15u)) * scale;
    }
  }
}

}  // namespace dsv4::cuda
