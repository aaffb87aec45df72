// Integer dot products of IQ2_XXS / Q2_K weight units with a digit-split x:
// the decode (one token per assignment) expert matvecs with tensor cores on
// (CudaBackendOptions::tensor_cores, the default), where results need only agree
// with the CPU to f32 rounding (the same contract as the tensor-core tiles).
//
// Split x (per 32-value unit u of x; split_x_digits_kernel, once per op):
// e_u is chosen so that max_i |x_i| 2^e_u lies in [2^29, 2^30);
// X_i = rint(x_i 2^e_u), |X_i| <= 2^30, written in balanced base-256 digits
//   X_i = 2^24 t_i + 65536 h_i + 256 m_i + l_i,  l, m, h in [-128, 127], |t| <= 64 (int8),
// so x_i = 2^-e_u X_i + r_i with |r_i| <= 2^-30 max|x| of the unit (the only
// approximation: a value 2^-8 below its unit's largest keeps ~22 bits, as the
// tiles' f16 hi + lo do; tested down to 1e-15 and with 1e4 among unit values). A weight unit whose values are c_j * s (c_j small
// integers, s a float scale) then gives
//   sum_j w_j x_j = s 2^-e (2^24 sum c_j t_j + 65536 sum c_j h_j + 256 sum c_j m_j + sum c_j l_j)
// with every inner sum exact in int32 (dp4a: 4 int8 products per instruction,
// 4 per 4 weights) and the float work once per 16 or 32 weights.
// Why: the float decoders issue ~8.6 instructions per IQ2_XXS weight (Nsight
// Compute, 2026-12-01, all overheads included) and the decode experts were
// issue-bound at IPC ~3; with this path a Flash decode step's experts take
// 45.9 us instead of 57.7 (bench_cuda_ops, one H200). A first version that split
// x in every block (3 digits) issued nearly as many instructions and was slower.
//
// IQ2_XXS codes: grid byte {8, 25, 43} = code {0, 1, 2} and a sign; 4 signed
// codes are one byte permute of the table words {8, 25, 43, 0} and
// {-8, -25, -43, 0} with the selector nibble code | sign << 2 per byte. The
// selector nibbles of a grid entry (8 codes) and of a sign index (8 signs in
// bit 2 of each nibble) come from two small shared-memory tables (IdotTables):
// one OR gives the 8 selectors of an 8-weight group.
// Q2_K codes: q in 0..3 (a shift and a mask per 4 weights); the min term uses
// the unit's f32 sums of x over each 16-element sub-block.
//
// CPU reference: cpu::moe_experts via quant::dequantize_row (tests: ops_moe.cpp,
// k_thr_f32).
#pragma once

#include "backend/cuda/cuda_quant.cuh"

namespace dsv4::cuda {

// One 32-value unit of split x: the digit planes as 8 words of 4 int8 each
// (element j in byte j % 4 of word j / 4), the scale 2^-e (NaN when the unit
// holds a non-finite value: the dot product is then NaN), and sum16[g] = the
// f32 sum of x over elements 16g .. 16g + 15 (Q2_K's min term). 144 bytes: a
// quarter warp's 16-byte shared loads of consecutive units hit distinct banks.
struct XDigits {
  int32_t t[8], h[8], m[8], l[8];
  float scale;
  float sum16[2];
  int32_t pad;
};
static_assert(sizeof(XDigits) == 144, "XDigits layout");

// dst[r * n_units + u] = the split of unit u of row r of x (rows x_stride
// floats apart); one warp per unit, 8 per 256-thread block. (static: a kernel
// defined in a header must not clash between the .cu files that include it.)
static __global__ void __launch_bounds__(256) split_x_digits_kernel(XDigits* __restrict__ dst, const float* __restrict__ x,
                                                              int64_t x_stride, int64_t n_rows, int64_t n_units) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t gu = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (gu >= n_rows * n_units) return;
  const int64_t r = gu / n_units, u = gu % n_units;
  const float v = x[r * x_stride + u * 32 + lane];
  const bool finite = __all_sync(k_full_mask, isfinite(v));
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(k_full_mask, amax, o));
  // e: amax 2^e in [2^29, 2^30) (frexp: amax = f 2^E, f in [0.5, 1)); at most
  // 126 so that 2^e and 2^-e are normal floats (units below 2^-97 keep fewer bits).
  int E = 0;
  frexpf(amax, &E);
  const int e = amax > 0.0f ? min(30 - E, 126) : 0;
  const int32_t X = finite ? __float2int_rn(v * __int_as_float((127 + e) << 23)) : 0;  // exact scaling, one rounding
  // Balanced digits: X - l is a multiple of 256, and so on.
  const int32_t l = (X << 24) >> 24;
  const int32_t x1 = (X - l) >> 8;
  const int32_t m = (x1 << 24) >> 24;
  const int32_t x2 = (x1 - m) >> 8;
  const int32_t h = (x2 << 24) >> 24;
  const int32_t t = (x2 - h) >> 8;
  // Pack 4 lanes' bytes per word: lane j's byte goes to word j / 4, byte j % 4.
  auto pack = [&](int32_t d) {
    uint32_t w = static_cast<uint32_t>(d) & 0xFFu;
    w |= (static_cast<uint32_t>(__shfl_down_sync(k_full_mask, d, 1)) & 0xFFu) << 8;
    w |= (static_cast<uint32_t>(__shfl_down_sync(k_full_mask, d, 2)) & 0xFFu) << 16;
    w |= static_cast<uint32_t>(__shfl_down_sync(k_full_mask, d, 3)) << 24;
    return static_cast<int32_t>(w);
  };
  const int32_t wt = pack(t), wh = pack(h), wm = pack(m), wl = pack(l);
  float s = v;
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) s += __shfl_xor_sync(k_full_mask, s, o);  // within each half warp
  XDigits& d = dst[gu];
  if ((lane & 3) == 0) {
    d.t[lane >> 2] = wt;
    d.h[lane >> 2] = wh;
    d.m[lane >> 2] = wm;
    d.l[lane >> 2] = wl;
  }
  if ((lane & 15) == 0) d.sum16[lane >> 4] = s;
  if (lane == 0) d.scale = finite ? __int_as_float((127 - e) << 23) : __int_as_float(0x7fc00000);
}

// The block copies n_units XDigits (global, 16-byte aligned) to shared memory;
// every thread calls it, the caller synchronises.
__device__ __forceinline__ void block_copy_digits(XDigits* dst, const XDigits* src, int64_t n_units) {
  const int64_t n4 = n_units * static_cast<int64_t>(sizeof(XDigits) / 16);
  for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) reinterpret_cast<int4*>(dst)[i] = reinterpret_cast<const int4*>(src)[i];
}

// A lane's unit of split x in registers.
struct XDigitRegs {
  int32_t t[8], h[8], m[8], l[8];
  float scale;
  float sum16[2];
  __device__ __forceinline__ void load(const XDigits& d) {
    auto ld8 = [](const int32_t* p, int32_t* r) {
#pragma unroll
      for (int i = 0; i < 8; i += 4) {
        const int4 a = *reinterpret_cast<const int4*>(p + i);
        r[i] = a.x, r[i + 1] = a.y, r[i + 2] = a.z, r[i + 3] = a.w;
      }
    };
    ld8(d.t, t);
    ld8(d.h, h);
    ld8(d.m, m);
    ld8(d.l, l);
    const float4 s = *reinterpret_cast<const float4*>(&d.scale);
    scale = s.x;
    sum16[0] = s.y;
    sum16[1] = s.z;
  }
};

// Digit sums of 4 int8 codes (word q) with x words i: T += q . t_i etc.
struct DigitAcc {
  int32_t T = 0, H = 0, M = 0, L = 0;
  __device__ __forceinline__ void add(uint32_t q, const XDigitRegs& x, int i) {
    T = __dp4a(static_cast<int>(q), x.t[i], T);
    H = __dp4a(static_cast<int>(q), x.h[i], H);
    M = __dp4a(static_cast<int>(q), x.m[i], M);
    L = __dp4a(static_cast<int>(q), x.l[i], L);
  }
  // 2^24 T + 65536 H + 256 M + L as a float (|T|, |H|, |M|, |L| < 2^24: exact
  // conversions and power-of-two scalings; three roundings).
  __device__ __forceinline__ float value() const {
    const float th = __fmaf_rn(static_cast<float>(T), 16777216.0f, static_cast<float>(H) * 65536.0f);
    return __fadd_rn(__fmaf_rn(static_cast<float>(M), 256.0f, th), static_cast<float>(L));
  }
};

// IQ2_XXS selector tables in shared memory: grid_sel[k] = the 8 codes of grid
// entry k as nibbles (nibble j = code of byte j), sign_sel[s] = the 8 signs of
// sign index s (with its parity bit 7) in bit 2 of each nibble.
struct IdotTables {
  uint32_t grid_sel[256];
  uint32_t sign_sel[128];
};

// Fills t from the IQ2_XXS grid (global memory); every thread of the block
// calls it, the caller synchronises.
__device__ __forceinline__ void block_idot_tables(IdotTables& t, const QuantTables& tab) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) {
    const uint64_t g = tab.iq2_grid[i];
    uint32_t sel = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = static_cast<uint32_t>(g >> (8 * j)) & 0xFFu;
      sel |= (b == 8u ? 0u : b == 25u ? 1u : 2u) << (4 * j);
    }
    t.grid_sel[i] = sel;
  }
  for (int i = threadIdx.x; i < 128; i += blockDim.x) {
    const uint32_t s = iq2_sign_bits(static_cast<uint32_t>(i));
    uint32_t sel = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sel |= ((s >> j) & 1u) << (4 * j + 2);
    t.sign_sel[i] = sel;
  }
}

// The 4 signed IQ2_XXS codes (int8 bytes) of the selector nibbles in the low
// 16 bits of sel: one byte permute of {8, 25, 43, 0} and {-8, -25, -43, 0}.
// (prmt directly: __byte_perm masks the selector with 0x7777 first, an extra
// instruction; the nibbles here never have bit 3 set.)
__device__ __forceinline__ uint32_t signed_codes(uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(0x002B1908u), "r"(0x00D5E7F8u), "r"(sel));
  return r;
}

template <GgmlType T>
struct UnitIdot;

// IQ2_XXS unit l (0..31) of a staged chunk (4 blocks of 66 bytes): block l / 8,
// group l % 8; dot = db 2^-e sum(c_j X_j), db = d (0.5 + ls) 0.25 as the decoder.
template <>
struct UnitIdot<GgmlType::IQ2_XXS> {
  __device__ __forceinline__ static float dot(const uint8_t* chunk, int l, const XDigitRegs& x, const IdotTables& t) {
    const uint16_t* blk = reinterpret_cast<const uint16_t*>(chunk + (l >> 3) * 66);
    const uint16_t* g = blk + 1 + 4 * (l & 7);
    const uint32_t wa = static_cast<uint32_t>(g[0]) | (static_cast<uint32_t>(g[1]) << 16);
    const uint32_t wb = static_cast<uint32_t>(g[2]) | (static_cast<uint32_t>(g[3]) << 16);
    const float db = __fmul_rn(__fmul_rn(f16_bits_to_f32(blk[0]), 0.5f + static_cast<float>(wb >> 28)), 0.25f);
    DigitAcc acc;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t sel = t.grid_sel[(wa >> (8 * k)) & 0xFFu] | t.sign_sel[(wb >> (7 * k)) & 127u];
      acc.add(signed_codes(sel), x, 2 * k);
      acc.add(signed_codes(sel >> 16), x, 2 * k + 1);
    }
    return db * (acc.value() * x.scale);
  }
};

// Q2_K unit v = l % 8 of block l / 8 (84 bytes): elements 32v .. 32v + 31 =
// sub-blocks 2v, 2v + 1; h = v / 4, s = v % 4: element i has code bits 2s of
// qs[32h + i]. dot = d 2^-e sum_g sc_g sum c X - dmin sum_g m_g sum16_g.
template <>
struct UnitIdot<GgmlType::Q2_K> {
  template <class Tables>
  __device__ __forceinline__ static float dot(const uint8_t* chunk, int l, const XDigitRegs& x, const Tables&) {
    const uint8_t* blk = chunk + (l >> 3) * 84;
    const int v = l & 7, sh = 2 * (v & 3);
    const uint32_t dd = *reinterpret_cast<const uint32_t*>(blk + 80);
    const float d = f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu));
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(dd >> 16));
    const uint32_t sc = *reinterpret_cast<const uint16_t*>(blk + 2 * v);  // scales[2v] | scales[2v+1] << 8
    const uint32_t* q = reinterpret_cast<const uint32_t*>(blk + 16 + 32 * (v >> 2));
    DigitAcc a0, a1;
#pragma unroll
    for (int i = 0; i < 4; ++i) a0.add((q[i] >> sh) & 0x03030303u, x, i);
#pragma unroll
    for (int i = 4; i < 8; ++i) a1.add((q[i] >> sh) & 0x03030303u, x, i);
    const int32_t s0 = static_cast<int32_t>(sc & 0x0Fu), s1 = static_cast<int32_t>((sc >> 8) & 0x0Fu);
    DigitAcc a;  // sc_0 * (sums of sub-block 0) + sc_1 * (sub-block 1), exact: |sums| < 2^13
    a.T = s0 * a0.T + s1 * a1.T;
    a.H = s0 * a0.H + s1 * a1.H;
    a.M = s0 * a0.M + s1 * a1.M;
    a.L = s0 * a0.L + s1 * a1.L;
    const float mins = __fmaf_rn(static_cast<float>((sc >> 4) & 0x0Fu), x.sum16[0], static_cast<float>(sc >> 12) * x.sum16[1]);
    return __fmaf_rn(d, a.value() * x.scale, -(dmin * mins));
  }
};

template <GgmlType T>
constexpr bool idot_type() {
  return T == GgmlType::IQ2_XXS || T == GgmlType::Q2_K;
}

// Dot products of R staged weight rows with the split x (xd: the block's
// XDigits; tab: IdotTables for IQ2_XXS, unused for Q2_K); sums[i] valid in lane 0 (rows past the last repeat rows[0], as in
// warp_rows_dot). Per row: lane l sums its units l, l + 32, ... in f32, then
// warp_sum. Every lane of the warp must call it.
template <GgmlType T, int R, int S, class Tables, class OnIssued>
__device__ __forceinline__ void warp_rows_idot(const uint8_t* const (&rows)[R], int64_t n_units, const XDigits* xd, int lane,
                                               const Tables& tab, typename UnitStaging<T>::Vec* stage, float (&sums)[R],
                                               OnIssued&& on_issued) {
  static_assert(idot_type<T>(), "integer dot products for IQ2_XXS and Q2_K");
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  warp_rows_staged<T, R, S>(rows, n_units, lane, stage, on_issued, [&](int64_t u, auto&& row_buf) {
    XDigitRegs x;
    x.load(xd[u]);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += UnitIdot<T>::dot(row_buf(r), lane, x, tab);
  });
#pragma unroll
  for (int i = 0; i < R; ++i) sums[i] = warp_sum(acc[i]);
}

}  // namespace dsv4::cuda
