// The tensor-core weight tile on int8 MMAs, for x from an INT8_32 activation
// quantiser (`fast` numerics: MatmulOp::x_quant, MoeExpertsOp::x_quant and
// mid_quant; CudaContext::int8_tiles). Every (token, 32-value unit) of such an
// x is q_j s with |q_j| <= 127 and one scale s, and every weight unit of the types below is
// (unit scale) x (small integer code) [- min], so one mma.sync.m16n8k32 s8 x s8
// -> s32 gives a unit's 16 x 8 dot products of codes exactly in int32, where
// the f16 tile (cuda_mma.cuh, mma_tile) runs four m16n8k16 (x's f16 hi and lo
// terms, two k-steps). The codes decode straight into int8 bytes (no f16
// pairs), and x's shared copy is 32 bytes per (token, unit) instead of 128.
//
//   out(r, tt) = sum_u [ sc(r, u) s(tt, u) D(r, tt, u) - min terms ],
//   D(r, tt, u) = sum_j c(r, u, j) q(tt, u, j)  (int32, exact)
//
// Codes (A's int8 bytes, in the f16 tile's fragment positions: mma_pos_of_elem):
//   Q8_0     c = q (int8)                         sc = d
//   IQ2_XXS  c = +-grid byte (8, 25 or 43)         sc = d (0.5 + ls) / 4
//   Q4_K     c = q (0..15)                        sc = d * its 6-bit scale; min m1 * sum(x) per unit
//   Q2_K     c = q (0..3) * the 16-element sub-block's 4-bit scale (<= 45: the two sub-blocks' scales fold
//            into the codes)                      sc = d; mins dmin m_s * sum(x over sub-block s)
//   MXFP4    c = 2 * the E2M1 value (0, +-1, 2, 3, 4, 6, 8, 12)   sc = 2^(e - 127) / 2
// F16 keeps the f16 tile. |D| <= 32 * 127 * 127 < 2^24, so float(D)
// is exact and each unit costs one f32 FMA per output, as in the f16 tile.
// Against the CPU's f32 dot products: within f32 rounding of the unit sums
// (test_cuda_ops at k_thr_f32); not bitwise the f16 tile, whose MMAs sum a
// unit's products in truncating f32 accumulators.
//
// The split x (mma_split_x_i8_kernel, once per matmul or expert matrix), per
// (row, unit): the 32 codes in fragment order (quad lane t's B fragment is
// bytes 8t..8t+7) and float4 {s, sum of elements 0..15, of 16..31, of 0..31}
// (the min terms' sums of x, as mma_split_x). The codes are recovered from x
// itself, as the int8 matvec does (int8_codes_scale: the quantiser's scale s
// from the unit's largest |x|; every x / s an integer of magnitude <= 127) —
// the x_quant promise is all the kernel needs. A unit
// holding Inf or NaN gets the scale NaN (its dot products are NaN).
//
// CPU reference: cpu::matmul / cpu::moe_experts; host check of the decoders:
// test_cuda_decode (check_mma_codes_i8).
#pragma once

#include "backend/cuda/cuda_mma.cuh"

namespace dsv4::cuda {

// Bytes of x's 4 lanes' worth of IQ2_XXS grid bytes w with the signs of the low 4
// bits of nib applied (bit i negates byte i): B = bit i at bit 8i (nib times
// 0x00204081 puts bit i at 8i, the other shifted copies on no bit 8i and
// without carries), M = 0xFF in the negated bytes, and (w ^ M) + B = -w there
// (~w + 1 stays within the byte: w >= 8).
DSV4_HD uint32_t iq2_signed_bytes(uint32_t w, uint32_t nib) {
  const uint32_t b = ((nib & 15u) * 0x00204081u) & 0x01010101u;
  return (w ^ (b * 0xFFu)) + b;
}

// The int8 codes of quad lane t for one weight row and unit u from MmaCodes<T>'s
// raw bytes (loaded by MmaCodes<T>::load, in unit order): a[0] = fragment
// positions 8t..8t+3, a[1] = 8t+4..8t+7 (byte i = position 8t + 4s + i), sc
// the unit's scale, mn the min terms (kMins = 1: mn[0] for the whole unit; 2:
// one per 16-element sub-block).
template <GgmlType T>
struct MmaCodesI8;

template <>
struct MmaCodesI8<GgmlType::Q8_0> {
  static constexpr int kMins = 0;
  using Raw = MmaCodes<GgmlType::Q8_0>::Raw;
  DSV4_HD static void decode(const Raw& r, int64_t, int, uint32_t (&a)[2], float& sc, float (&)[2], const MmaTables&) {
    sc = f16_bits_to_f32(r.d);
    a[0] = r.q[0];
    a[1] = r.q[1];
  }
};

template <>
struct MmaCodesI8<GgmlType::IQ2_XXS> {
  static constexpr int kMins = 0;
  using Raw = MmaCodes<GgmlType::IQ2_XXS>::Raw;
  DSV4_HD static void decode(const Raw& r, int64_t, int t, uint32_t (&a)[2], float& sc, float (&)[2],
                             const MmaTables& tab) {
    sc = mul_rn(mul_rn(f16_bits_to_f32(r.d), 0.5f + static_cast<float>(r.wb >> 28)), 0.25f);
    const uint2 g = tab.grid[r.grid_idx];
    const uint32_t sg = iq2_sign_bits((r.wb >> (7 * t)) & 127u);
    a[0] = iq2_signed_bytes(g.x, sg);
    a[1] = iq2_signed_bytes(g.y, sg >> 4);
  }
};

template <>
struct MmaCodesI8<GgmlType::Q4_K> {
  static constexpr int kMins = 1;
  using Raw = MmaCodes<GgmlType::Q4_K>::Raw;
  DSV4_HD static void decode(const Raw& r, int64_t u, int, uint32_t (&a)[2], float& sc, float (&mn)[2],
                             const MmaTables&) {
    const int j = static_cast<int>(u & 7);
    int scv, m;
    q4k_scale_min(j, r.s[0], r.s[1], r.s[2], scv, m);
    sc = mul_rn(f16_bits_to_f32(static_cast<uint16_t>(r.dd & 0xffffu)), static_cast<float>(scv));
    mn[0] = mul_rn(f16_bits_to_f32(static_cast<uint16_t>(r.dd >> 16)), static_cast<float>(m));
    const int shift = (j & 1) * 4;
    a[0] = (r.q.x >> shift) & 0x0F0F0F0Fu;
    a[1] = (r.q.y >> shift) & 0x0F0F0F0Fu;
  }
};

template <>
struct MmaCodesI8<GgmlType::Q2_K> {
  static constexpr int kMins = 2;
  using Raw = MmaCodes<GgmlType::Q2_K>::Raw;
  DSV4_HD static void decode(const Raw& r, int64_t u, int, uint32_t (&a)[2], float& sc, float (&mn)[2],
                             const MmaTables&) {
    const int sh = 2 * static_cast<int>(u & 3);
    sc = f16_bits_to_f32(static_cast<uint16_t>(r.dd & 0xffffu));
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(r.dd >> 16));
    DSV4_UNROLL
    for (int s = 0; s < 2; ++s) {
      const uint32_t b = s == 0 ? (r.scb & 0xffu) : (r.scb >> 8);
      a[s] = ((r.w[s] >> sh) & 0x03030303u) * (b & 0x0Fu);  // <= 45 per byte: no carries
      mn[s] = mul_rn(dmin, static_cast<float>(b >> 4));
    }
  }
};

// The int8 values 2 v of four E2M1 codes (one per byte, in bits 0..3: sign, then a 3-bit magnitude index
// m): |2 v| = {0, 1, 2, 3, 4, 6, 8, 12}[m], one byte permute of that table with the four indices as its
// selector nibbles (x | x >> 4 packs bytes 0, 1 and 2, 3 into bytes 0 and 2, the permute's inner selector
// brings byte 2 next to byte 0); then the signs as iq2_signed_bytes applies them, only where m != 0 (the
// +-0 codes stay 0: (x + 7) has bit 3 set iff x != 0, no carries), so no byte carries into the next.
DSV4_HD uint32_t mxfp4_i8_bytes(uint32_t nib) {
  const uint32_t x = nib & 0x07070707u;
  const uint32_t mag = prmt(0x03020100u, 0x0C080604u, prmt(x | (x >> 4), 0u, 0x0020u));
  const uint32_t b = (nib >> 3) & ((x + 0x07070707u) >> 3) & 0x01010101u;
  return (mag ^ (b * 0xFFu)) + b;
}

// MXFP4: quad lane t's code bytes 4t .. 4t + 3 (MmaCodes<MXFP4>'s raw words): low nibbles = positions
// 8t .. 8t + 3 (elements 4t + i), high nibbles = 8t + 4 .. (16 + 4t + i); the codes are twice the E2M1
// values, so the unit scale is 2^(e - 127) / 2 (exact; e = 0: the subnormal 2^-128).
template <>
struct MmaCodesI8<GgmlType::MXFP4> {
  static constexpr int kMins = 0;
  using Raw = MmaCodes<GgmlType::MXFP4>::Raw;
  DSV4_HD static void decode(const Raw& r, int64_t, int, uint32_t (&a)[2], float& sc, float (&)[2], const MmaTables&) {
    sc = mul_rn(mxfp4_scale(r.e), 0.5f);
    const uint32_t q = funnel_r(r.w0, r.w1, r.sh);
    a[0] = mxfp4_i8_bytes(q);
    a[1] = mxfp4_i8_bytes(q >> 4);
  }
};

// The weight types of the int8 tile.
template <GgmlType T>
constexpr bool mma_i8_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::IQ2_XXS || T == GgmlType::Q4_K || T == GgmlType::Q2_K ||
         T == GgmlType::MXFP4;
}

// ---- x's codes, split once per matmul: per (row, unit) 32 bytes (MmaX::q, two uint4 per unit) and the
// float4 {s, sums} (MmaX::s).
inline size_t mma_split_i8_bytes(int64_t rows, int64_t units) { return static_cast<size_t>(rows * units) * (32 + 16); }

// One warp per (row, unit), lane = element: x[row * x_stride + 32 unit + lane].
template <bool SubBlock>
__global__ void __launch_bounds__(256)
    mma_split_x_i8_kernel(const float* __restrict__ x, int64_t x_stride, int64_t rows, int64_t units,
                          int8_t* __restrict__ q, float4* __restrict__ s) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  int64_t pr;
  float v;
  if (!mma_split_unit(x, x_stride, rows, units, pr, v)) return;
  const bool finite = __all_sync(k_full_mask, isfinite(v));
  const Int8Step sc = int8_codes_scale(warp_max_all(fabsf(v)));
  const int c = finite ? __float2int_rn(__fmul_rn(v, sc.inv)) : 0;
  q[pr * 32 + (SubBlock ? mma_pos_of_elem<GgmlType::Q2_K>(lane) : lane)] = static_cast<int8_t>(c);
  mma_split_sums(s, pr, v, finite ? sc.scale : __int_as_float(0x7fc00000));
}

// Splits rows x [rows][x_stride] (the first `units` units of each) into buffer buf
// (mma_split_i8_bytes(rows, units) bytes, 16-byte aligned) in T's fragment order.
template <GgmlType T>
MmaX mma_split_x_i8(cudaStream_t stream, const float* x, int64_t x_stride, int64_t rows, int64_t units, void* buf) {
  MmaX r;
  r.units = units;
  r.q = static_cast<const uint4*>(buf);
  r.s = reinterpret_cast<const float4*>(static_cast<uint8_t*>(buf) + static_cast<size_t>(rows * units) * 32);
  const int64_t pairs = rows * units;
  if (pairs == 0) return r;
  launch_kernel(mma_split_x_i8_kernel<mma_subblock_order<T>()>, static_cast<unsigned>((pairs + 7) / 8), 256, 0, stream,
                x, x_stride, rows, units, static_cast<int8_t*>(buf), const_cast<float4*>(r.s));
  return r;
}

}  // namespace dsv4::cuda
