// The split x of the decode experts' integer MMAs (cuda_expert_imma.cuh) with
// tensor cores on (CudaBackendOptions::tensor_cores, the default), where results
// need only agree with the CPU to f32 rounding (the same contract as the
// tensor-core tiles), and the IQ2_XXS code tables they decode with.
//
// Split x (per 256-value block B of x, i.e. 8 units u of 32; split_x_digits_kernel,
// once per op): e_B is chosen so that max_i |x_i| 2^e_B over the block lies in
// [2^29, 2^30); X_i = rint(x_i 2^e_B), |X_i| <= 2^30, written in balanced base-256 digits
//   X_i = 2^24 t_i + 65536 h_i + 256 m_i + l_i,  l, m, h in [-128, 127], |t| <= 64 (int8),
// so x_i = 2^-e_B X_i + r_i with |r_i| <= 2^-31 max|x| of the block (the only
// approximation: a value 2^-8 below its block's largest keeps ~22 bits, as the
// tiles' f16 hi + lo do; tested down to 1e-15 and with 1e4 among unit values).
// A weight unit whose values are c_j * s (c_j small integers, s a float scale) then gives
//   sum_j w_j x_j = s 2^-e (2^24 sum c_j t_j + 65536 sum c_j h_j + 256 sum c_j m_j + sum c_j l_j)
// with every inner sum exact in int32. One scale per 256 values (the weight
// block of IQ2_XXS and Q2_K) lets a block's unit sums add up in int32 before
// any float work. (A dp4a matvec with one scale per 32 values, 4 dp4a per 4
// weights, measured 45.9 us per decode step's experts vs 57.7 for the float
// decoders; the integer MMAs are faster still, see cuda_expert_imma.cuh.)
//
// IQ2_XXS codes: grid byte {8, 25, 43} = code {0, 1, 2} and a sign; 4 signed
// codes are one byte permute of the table words {8, 25, 43, 0} and
// {-8, -25, -43, 0} with the selector nibble code | sign << 2 per byte. The
// selector nibbles of a grid entry (8 codes) and of a sign index (8 signs in
// bit 2 of each nibble) come from two small shared-memory tables (IdotTables):
// one OR gives the 8 selectors of an 8-weight group.
//
// CPU reference: cpu::moe_experts via quant::dequantize_row (tests: ops_moe.cpp,
// k_thr_f32).
#pragma once

#include "backend/cuda/cuda_quant.cuh"

namespace dsv4::cuda {

// One 32-value unit of split x: the digit planes as 8 words of 4 int8 each
// (element j in byte j % 4 of word j / 4), the scale 2^-e of its 256-value
// block (NaN when the block holds a non-finite value: the dot product is then
// NaN). 144 bytes (16-byte aligned units).
struct XDigits {
  int32_t t[8], h[8], m[8], l[8];
  float scale;
  int32_t pad[3];
};
static_assert(sizeof(XDigits) == 144, "XDigits layout");

// dst[r * n_units + u] = the split of unit u of row r of x (rows x_stride
// floats apart); one warp per unit, one 256-thread block per 256-value block
// (n_units % 8 == 0: the callers' rows are whole IQ2_XXS / Q2_K blocks). A
// block holding a non-finite value gets the NaN scale in all 8 units.
// q8: x's values are first quantised as ActQuant::INT8_32 (a unit is one of
// its blocks; warp_int8_32_quant, the quantiser's operations): the split of
// the quantised x (`fast` numerics' mid vector), x itself left as it is.
// (static: a kernel defined in a header must not clash between the .cu files
// that include it.)
static __global__ void __launch_bounds__(256)
    split_x_digits_kernel(XDigits* __restrict__ dst, const float* __restrict__ x, int64_t x_stride, int64_t n_rows,
                          int64_t n_units, bool q8) {
  __shared__ float blk_max[8];
  __shared__ int blk_finite[8];
  pdl_enter();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t gu = static_cast<int64_t>(blockIdx.x) * 8 + warp;  // < n_rows * n_units: whole blocks
  const int64_t r = gu / n_units, u = gu % n_units;
  float v = x[r * x_stride + u * 32 + lane];
  if (q8) v = warp_int8_32_quant(v);
  bool finite = __all_sync(k_full_mask, isfinite(v));
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(k_full_mask, amax, o));
  if (lane == 0) {
    blk_max[warp] = amax;
    blk_finite[warp] = finite;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    amax = fmaxf(amax, blk_max[i]);
    finite = finite && blk_finite[i] != 0;
  }
  // e: amax 2^e in [2^29, 2^30) (frexp: amax = f 2^E, f in [0.5, 1)); at most
  // 126 so that 2^e and 2^-e are normal floats (blocks below 2^-97 keep fewer bits).
  // (amax is NaN-free: fmaxf drops NaN; a non-finite block gets the NaN scale.)
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
  XDigits& d = dst[gu];
  if ((lane & 3) == 0) {
    d.t[lane >> 2] = wt;
    d.h[lane >> 2] = wh;
    d.m[lane >> 2] = wm;
    d.l[lane >> 2] = wl;
  }
  if (lane == 0) d.scale = finite ? __int_as_float((127 - e) << 23) : __int_as_float(0x7fc00000);
}

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

// The weight types of the integer path.
template <GgmlType T>
constexpr bool idot_type() {
  return T == GgmlType::IQ2_XXS || T == GgmlType::Q2_K;
}

}  // namespace dsv4::cuda
