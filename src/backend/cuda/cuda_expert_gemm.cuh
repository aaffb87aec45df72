// The prefill experts as a grouped GEMM that decodes each weight chunk once per
// plan tile of up to 128 assignments (docs/design-notes/moe-grouped-gemm.md): the
// pieces shared by its kernel (cuda_expert_wgmma.cu, wgmma on sm_90a) — the
// exact hi/lo splits of weights and x, the per-row scale bounds, the unit
// decoders that write the stage — and its launcher's interface.
//
//   out[a, r] = sum_c W_e(a)[r, c] x[a / x_div, c]     for the assignments a of one plan tile
//
// Exact splits, as the cuBLAS path (cuda_gemm.cu): a decoded weight w is scaled
// by 2^e_r per weight row and an x value by 2^e_t per input row (token), each
// split into f16 hi + lo (~22 bits), and the block accumulates
// w_hi x_hi + w_lo x_hi + w_hi x_lo over the whole row on tensor cores (f32
// accumulators); the epilogue multiplies by 2^-(e_r + e_t). No per-unit scale
// work: the codes' scales are in the decoded weights (2^e_r is folded into the
// block scales: WeightUnit<T>::decode's factor, exact). e_r comes from an upper
// bound of |w| over the row read from the block headers only (RowBound: the
// scales, not the codes), so that the row's largest |w| 2^e_r < 2^15 (f16
// range); e_t from the row's largest |x| (expert_gemm_split_x_kernel).
// Integer codes (IQ2_XXS; CudaContext::expert_gemm_codes, the default): w = (d / 8) c with
// the code c = +-(2 ls + 1) grid_j an integer below 2^11, exact in f16 as it
// is; the block accumulates c x_hi (+ c x_lo when x is not exact) per chunk,
// every product exact, and adds the chunk's sums times each row's d / 8 (one
// rounded f32 FMA per chunk, in place of the slice addition below; e_r = 0).
// One wgmma per 16 columns and x term where the split takes two, and no lo
// half to decode and store. Q2_K the same way: w = d sc_j q - dmin m_j with the
// code sc_j q <= 45 and the row scale d; the mins' part of a chunk is one more
// k16 product of the rows' -16 dmin m_j / d with the tokens' sub-block sums / 16
// (both f16 hi/lo, ~22 bits; EgChunk<Q2_K>::put_codes).
// Tensor-core f32 accumulation truncates (cuda_gemm.cu): each slice of
// k_wg_slice_chunks chunks (cuda_expert_wgmma.cu: one) accumulates into fresh registers that are then added
// to the block's accumulators with one rounded f32 addition.
// The same GEMM on ldmatrix + mma.sync (operands through registers) measured
// slower than the tile of cuda_mma.cuh (docs/design-notes/moe-grouped-gemm.md).
//
// CPU reference: cpu::moe_experts (quant::dequantize_row + f32 dot products).
#pragma once

#include <cuda_fp16.h>

#include "backend/cuda/cuda_expert_rows.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace dsv4::cuda {

constexpr int k_eg_rows = 128;  // weight rows per block
constexpr int k_eg_bk = 64;     // columns per chunk: 2 units of 32

template <GgmlType T>
constexpr bool expert_gemm_type() {
  return T == GgmlType::Q8_0 || T == GgmlType::Q2_K || T == GgmlType::Q4_K || T == GgmlType::IQ2_XXS;
}
// Types whose weights the GEMM can also take as exact f16 integer codes with one scale per 256-value block
// and row (CudaContext::expert_gemm_codes; EgChunk<T>::put_codes): IQ2_XXS, w = (d / 8) (2 ls + 1) grid_j sign_j, the
// code (2 ls + 1) grid_j <= 31 * 43 = 1333 (11 bits, exact in f16); Q2_K, the code sc_j q <= 45 with the
// mins apart (below).
template <GgmlType T>
constexpr bool expert_gemm_codes_type() {
  return T == GgmlType::IQ2_XXS || T == GgmlType::Q2_K;
}
// Q2_K as codes (w = d sc_j q - dmin m_j, j the 16-column sub-block): the chunk's sums are
// d sum_k (sc_j q_k) x_k - dmin sum_j m_j S_j with S_j = sum of x over sub-block j, so the consumers need
// each token's sub-block sums (the gather's sums); EgChunk<Q2_K>::put_codes has the layout.
constexpr bool expert_gemm_codes_need_sums(GgmlType t) { return t == GgmlType::Q2_K; }
// Whether the gather must write the sub-block sums for a launch on weights of type t (codes_on:
// CudaContext::expert_gemm_codes).
constexpr bool expert_gemm_sums(GgmlType t, bool codes_on) { return codes_on && expert_gemm_codes_need_sums(t); }

// An upper bound of |w| over the blocks j = first, first + step, ... of a row,
// from the block headers only.
template <GgmlType T>
struct RowBound;
template <>
struct RowBound<GgmlType::Q8_0> {  // 34-byte blocks of 32: |d q| <= |d| 128
  __device__ static float partial(const uint8_t* row, int64_t n_units, int first, int step) {
    float m = 0.0f;
    for (int64_t j = first; j < n_units; j += step)
      m = fmaxf(m, fabsf(f16_bits_to_f32(ld(reinterpret_cast<const uint16_t*>(row + j * 34)))) * 128.0f);
    return m;
  }
};
template <>
struct RowBound<GgmlType::Q2_K> {  // 84-byte blocks of 256: |d sc q - dmin m| <= |d| 45 + |dmin| 15
  __device__ static float partial(const uint8_t* row, int64_t n_units, int first, int step) {
    float m = 0.0f;
    for (int64_t j = first; j < n_units / 8; j += step) {
      const uint32_t dd = ld(reinterpret_cast<const uint32_t*>(row + j * 84 + 80));
      m = fmaxf(m, fabsf(f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu))) * 45.0f +
                       fabsf(f16_bits_to_f32(static_cast<uint16_t>(dd >> 16))) * 15.0f);
    }
    return m;
  }
};
template <>
struct RowBound<GgmlType::Q4_K> {  // 144-byte blocks of 256: |d sc q - dmin m| <= |d| 63 15 + |dmin| 63
  __device__ static float partial(const uint8_t* row, int64_t n_units, int first, int step) {
    float m = 0.0f;
    for (int64_t j = first; j < n_units / 8; j += step) {
      const uint32_t dd = ld(reinterpret_cast<const uint32_t*>(row + j * 144));
      m = fmaxf(m, fabsf(f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu))) * 945.0f +
                       fabsf(f16_bits_to_f32(static_cast<uint16_t>(dd >> 16))) * 63.0f);
    }
    return m;
  }
};
template <>
struct RowBound<GgmlType::IQ2_XXS> {  // 66-byte blocks of 256: |d (0.5 + ls) 0.25 grid| <= |d| 3.875 43
  __device__ static float partial(const uint8_t* row, int64_t n_units, int first, int step) {
    float m = 0.0f;
    for (int64_t j = first; j < n_units / 8; j += step)
      m = fmaxf(m, fabsf(f16_bits_to_f32(ld(reinterpret_cast<const uint16_t*>(row + j * 66)))) * 166.625f);
    return m;
  }
};

// x rows [n][x_stride] -> xh, xl [n][cols] f16 (hi, lo of x 2^e_t) and e_t [n];
// one 256-thread block per row. xl null: x is exact in f16 (an activation quantiser's output), no lo halves.
static __global__ void __launch_bounds__(256)
    expert_gemm_split_x_kernel(const float* __restrict__ x, int64_t x_stride, int64_t cols, __half* __restrict__ xh,
                               __half* __restrict__ xl, int* __restrict__ tok_exp) {
  pdl_enter();
  __shared__ float red[33];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * x_stride;
  float m = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
  const int e = split_exponent(block_max_nonneg(m, red));
  if (threadIdx.x == 0) tok_exp[t] = e;
  uint32_t* h2 = reinterpret_cast<uint32_t*>(xh + t * cols);
  uint32_t* l2 = reinterpret_cast<uint32_t*>(xl + t * cols);
  for (int64_t c = 2 * threadIdx.x; c < cols; c += 2 * blockDim.x) {
    __half h0, l0, h1, l1;
    split_f16(ldexpf(xr[c], e), h0, l0);
    split_f16(ldexpf(xr[c + 1], e), h1, l1);
    h2[c / 2] = half2_bits(h0, h1);
    if (xl) l2[c / 2] = half2_bits(l0, l1);
  }
}

// Offset (halves) of element (r, k) of a chunk (rows x 64 columns) in the core-matrix layout that wgmma reads
// without swizzling: 8x8 cores of 16-byte rows, row-group-major (a group of 8 rows is 1 KiB, its 8 cores in
// column order). Weight rows and tokens alike.
__host__ __device__ constexpr int eg_core_off(int r, int k) {
  return ((r >> 3) * 8 + (k >> 3)) * 64 + (r & 7) * 8 + (k & 7);
}

// hi = f16(a), lo = f16(a - hi) for two values, packed (low half: a): split_f16's bits.
__device__ __forceinline__ void eg_split2(float a, float b, uint32_t& h, uint32_t& l) {
  const __half2 hh = __floats2half2_rn(a, b);
  const float2 hf = __half22float2(hh);
  const __half2 ll = __floats2half2_rn(a - hf.x, b - hf.y);
  h = *reinterpret_cast<const uint32_t*>(&hh);
  l = *reinterpret_cast<const uint32_t*>(&ll);
}

// Offset (halves) of element (r, k < 16) of a chunk's 16-column sums block (Q2_K codes: the mins' A and
// B operands, EgChunk<Q2_K>::put_codes): the same 8x8 cores, two per row group (a group is 256 bytes).
__host__ __device__ constexpr int eg_sums_off(int r, int k) {
  return ((r >> 3) * 2 + (k >> 3)) * 64 + (r & 7) * 8 + (k & 7);
}
constexpr int k_eg_sums_k = 16;  // columns of a chunk's sums block (one k16 wgmma)

// The split x of the big plan tiles, gathered into the stage layout so that one bulk copy per chunk fills a
// stage (cuda_expert_wgmma.cu). Tile z (big[z] = {expert, first list index, nt, P}, P a multiple of 8 from the
// plan) owns r8 = round_up(nt, 8) token rows at xth / xtl + P cols halves, chunk-major: chunk c at + c r8 64,
// its element (t, k) at eg_core_off(t, k); rows nt..r8-1 are zeros. With sums (expert_gemm_sums) it also
// writes the tokens' sums blocks at xts + P cols / 4: chunk c at + c r8 16, token t's 16 halves at
// eg_sums_off(t, k) = (S0h, S0l, S0h, S1h, S1l, S1h, .., S3l, S3h, 0, 0, 0, 0) with S_j = 2^-4 sum of
// (xh + xl) over the chunk's sub-block j (16 columns; 2^-4 keeps 16 values below 2^15 in f16 range) as
// hi + lo (EgChunk<Q2_K>::put_codes pairs them with the rows' A). Grid (cols / 64, max big tiles), 256
// threads; blocks past n_big exit. xl null (x exact): xtl is not written, the sums are of xh.
static __global__ void __launch_bounds__(256)
    expert_gemm_gather_x_kernel(const __half* __restrict__ xh, const __half* __restrict__ xl, int64_t cols,
                                const int32_t* __restrict__ list, const int4* __restrict__ big,
                                const int32_t* __restrict__ n_big, int x_div, __half* __restrict__ xth,
                                __half* __restrict__ xtl, __half* __restrict__ xts) {
  pdl_enter();
  if (static_cast<int>(blockIdx.y) >= *n_big) return;
  const int4 td = big[blockIdx.y];
  const int nt = td.z, r8 = (nt + 7) & ~7, c = static_cast<int>(blockIdx.x);
  const int64_t base = static_cast<int64_t>(td.w) * cols + static_cast<int64_t>(c) * r8 * 64;
  // (hi, then lo, token, 16-byte vector): 8 vectors per row; then the sums: 1 per token
  const int n_hl = (xl ? 16 : 8) * r8, n_vec = n_hl + (xts ? r8 : 0);
  for (int i = threadIdx.x; i < n_vec; i += blockDim.x) {
    const bool sm = i >= n_hl;
    const int hl = i >= 8 * r8, j = i - (sm ? n_hl : hl ? 8 * r8 : 0), t = sm ? j : j >> 3, v = j & 7;
    const int64_t row = t < nt ? list[td.y + t] / x_div : -1;
    if (sm) {
      uint32_t w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      if (row >= 0) {
        const uint4* src = reinterpret_cast<const uint4*>(xh + row * cols + c * 64);
        const uint4* srl = xl ? reinterpret_cast<const uint4*>(xl + row * cols + c * 64) : nullptr;
        uint32_t hs[2], ls[2];
#pragma unroll
        for (int sb = 0; sb < 4; sb += 2) {
          float s[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            s[h] = 0.0f;
#pragma unroll
            for (int q = 0; q < 2; ++q) {
              const uint4 u = src[2 * (sb + h) + q], ul = srl ? srl[2 * (sb + h) + q] : make_uint4(0, 0, 0, 0);
              const uint32_t uw[4] = {u.x, u.y, u.z, u.w}, lw[4] = {ul.x, ul.y, ul.z, ul.w};
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&uw[e]));
                const float2 g = __half22float2(*reinterpret_cast<const __half2*>(&lw[e]));
                s[h] += (f.x + g.x) + (f.y + g.y);
              }
            }
          }
          eg_split2(s[0] * 0.0625f, s[1] * 0.0625f, hs[sb / 2], ls[sb / 2]);  // (S_sb, S_sb+1) hi, lo
        }
        // (S0h, S0l), (S0h, S1h), (S1l, S1h), (S2h, S2l), (S2h, S3h), (S3l, S3h), 0, 0
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const uint32_t h0 = hs[p] & 0xFFFFu, h1 = hs[p] >> 16, l0 = ls[p] & 0xFFFFu, l1 = ls[p] >> 16;
          w[3 * p] = h0 | (l0 << 16);
          w[3 * p + 1] = h0 | (h1 << 16);
          w[3 * p + 2] = l1 | (h1 << 16);
        }
      }
      __half* dst = xts + static_cast<int64_t>(td.w) * (cols / 4) + static_cast<int64_t>(c) * r8 * k_eg_sums_k;
      *reinterpret_cast<uint4*>(dst + eg_sums_off(t, 0)) = make_uint4(w[0], w[1], w[2], w[3]);
      *reinterpret_cast<uint4*>(dst + eg_sums_off(t, 8)) = make_uint4(w[4], w[5], w[6], w[7]);
      continue;
    }
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row >= 0) val = *reinterpret_cast<const uint4*>((hl ? xl : xh) + row * cols + c * 64 + v * 8);
    *reinterpret_cast<uint4*>((hl ? xtl : xth) + base + eg_core_off(t, 8 * v)) = val;
  }
}

constexpr int k_eg_stages = 3;
// IQ2_XXS lookups, kept narrow (a producer's random 16-byte table reads cost ~3x the shared-memory
// wavefronts of 8- and 4-byte ones): iq2_sel[g] = the prmt selectors of grid entry g's element pairs
// (0, 1), (2, 3) in x's low and high 16 bits and (4, 5), (6, 7) in y's; iq2_sign[i] = sign index i's 8
// signs (with the parity bit) as bits 15 - j (element 2j) and 31 - j (element 2j + 1), so that
// (sign << j) & 0x80008000 is pair j's f16 sign mask.
struct EgTables {
  uint2 iq2_sel[256];
  uint32_t iq2_sign[128];
};
// 2^e as a float (e in f32's normal exponent range; RowBound's bounds keep it
// within [-10, 50] for every finite block scale).
__device__ __forceinline__ float eg_pow2(int e) { return __int_as_float((min(max(e, -126), 127) + 127) << 23); }

// One 32-element unit of a weight row, decoded with the scale factor s and
// written to shared memory as hi (dh) and lo (dl) halves, in two
// steps so that a producer can issue the next chunk's global loads before it
// decodes this one: a loader reads the unit's bytes into registers (Raw: the
// generic load() below, or EgChunk's for the types whose units share bytes),
// put() decodes and stores them as four 16-byte vectors of 8 elements, vector v at
// dh + vs v (vs = 8: a plain row; 64: the wgmma core-matrix layout).
// Generic: Raw is the address; put() runs WeightUnit<T>::decode and splits its
// floats two at a time.
template <GgmlType T>
struct EgUnit {
  struct Raw {
    const uint8_t* row;
    int64_t u;
  };
  __device__ static void tables(EgTables&, const QuantTables&, int, int) {}
  __device__ __forceinline__ static Raw load(const uint8_t* row, int64_t u) { return {row, u}; }
  __device__ __forceinline__ static void put(const Raw& r, float s, const QuantTables& tab, const EgTables&,
                                             uint16_t* dh, uint16_t* dl, int vs) {
    float v[32];
    WeightUnit<T>::decode(r.row, r.u, v, tab, s);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t h[4], l[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) eg_split2(v[8 * q + 2 * j], v[8 * q + 2 * j + 1], h[j], l[j]);
      *reinterpret_cast<uint4*>(dh + vs * q) = make_uint4(h[0], h[1], h[2], h[3]);
      *reinterpret_cast<uint4*>(dl + vs * q) = make_uint4(l[0], l[1], l[2], l[3]);
    }
  }
};

// Wide loads (a producer's row in 16-byte aligned pieces; EgChunk<T>::load's `wide`: rows 16-byte aligned,
// their byte count a multiple of 16): v holds three aligned 16-byte pieces (v[4 i .. 4 i + 3] = bytes
// 16 i .. 16 i + 15), w[i] = bytes m + 4 i .. m + 4 i + 3 for an even m <= 14 (bytes past v read as 0). The
// word shift m / 4 is two selects per word, the half-word one a funnel shift.
template <int N>
__device__ __forceinline__ void eg_words_at(const uint32_t (&v)[12], uint32_t m, uint32_t (&w)[N]) {
  static_assert(N <= 11, "words within the three pieces");
  uint32_t t[12];
#pragma unroll
  for (int i = 0; i < 12; ++i) t[i] = (m & 8u) ? (i + 2 < 12 ? v[i + 2] : 0u) : v[i];
#pragma unroll
  for (int i = 0; i < 12; ++i) t[i] = (m & 4u) ? (i + 1 < 12 ? t[i + 1] : 0u) : t[i];
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(t[i], t[i + 1], 8u * (m & 3u));
}
// The three aligned 16-byte pieces that hold byte s and the 47 - (s % 16) bytes after it, and s % 16.
__device__ __forceinline__ uint32_t eg_load_pieces(const uint8_t* s, uint32_t (&v)[12]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(s) & ~static_cast<uintptr_t>(15);
  const uint4* p = reinterpret_cast<const uint4*>(a);
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    const uint4 q = ld(p + i);
    v[4 * i] = q.x;
    v[4 * i + 1] = q.y;
    v[4 * i + 2] = q.z;
    v[4 * i + 3] = q.w;
  }
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(s) - a);
}

// One 64-column chunk (two units, 2c and 2c + 1) of a weight row: load() reads its bytes into registers,
// put() decodes both units as EgUnit<T>::put does. Generic: two units, each loaded on its own; types whose
// units share bytes or headers specialise it to load them once (a producer's global loads are one row per
// thread, so each costs a shared-memory wavefront per thread: their count bounds the grouped GEMM). prev:
// the chunk this thread loaded before, whose bytes a chunk may reuse when adj (prev is chunk c - 1 of the
// same row).
template <GgmlType T>
struct EgUnits {
  typename EgUnit<T>::Raw u0, u1;
  __device__ __forceinline__ void put(float s, const QuantTables& tab, const EgTables& et, uint16_t* dh, uint16_t* dl,
                                      int vs) const {
    EgUnit<T>::put(u0, s, tab, et, dh, dl, vs);
    EgUnit<T>::put(u1, s, tab, et, dh + 4 * vs, dl + 4 * vs, vs);
  }
};
template <GgmlType T>
struct EgChunk : EgUnits<T> {
  __device__ __forceinline__ static EgChunk load(const uint8_t* row, int64_t c, const EgChunk&, bool, bool) {
    return {{EgUnit<T>::load(row, 2 * c), EgUnit<T>::load(row, 2 * c + 1)}};
  }
};

// Codes with few values per scale: the unit's possible weights are decoded and
// split once (the same float expressions as WeightUnit<T>::decode, so the same
// bits as splitting every decoded weight), kept as 4 halves in two registers,
// and each pair of elements picks its two halves with one byte permute (prmt):
// for element codes c0, c1 in 0..3 the selector nibbles are 2c0, 2c0+1, 2c1,
// 2c1+1. For codes in the bytes of a word q (values 0..3), q * 0x22 + 0x10101010
// holds the selectors of elements (0, 1) in its low and (2, 3) in its high 16 bits.
__device__ __forceinline__ uint32_t eg_sel4(uint32_t codes) { return codes * 0x22u + 0x10101010u; }
__device__ __forceinline__ uint32_t eg_pick(const uint32_t (&t)[2], uint32_t sel) {
  return __byte_perm(t[0], t[1], sel);
}

// Q2_K: per 16-element sub-block 4 weights (code q = 0..3): (d sc) q - dmin m.
// Unit v (0..7) of a 256-block: scales[2v], scales[2v+1], and bits 2(v % 4)..
// of the 32 code bytes qs[32 (v / 4) ..] (WeightUnit<Q2_K>).
template <>
struct EgUnit<GgmlType::Q2_K> {
  struct Raw {
    uint32_t dd, sc, shift;
    uint32_t q[8];
  };
  __device__ static void tables(EgTables&, const QuantTables&, int, int) {}
  __device__ __forceinline__ static void put(const Raw& r, float scale, const QuantTables&, const EgTables&,
                                             uint16_t* dh, uint16_t* dl, int vs) {
    const float d = f16_bits_to_f32(static_cast<uint16_t>(r.dd & 0xffffu)) * scale;
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(r.dd >> 16)) * scale;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t scb = (r.sc >> (8 * k)) & 0xffu;
      const float dls = d * static_cast<float>(scb & 0x0F);
      const float ml = dmin * static_cast<float>(scb >> 4);
      uint32_t th[2], tl[2];
      eg_split2(sub_rn(mul_rn(dls, 0.0f), ml), sub_rn(mul_rn(dls, 1.0f), ml), th[0], tl[0]);
      eg_split2(sub_rn(mul_rn(dls, 2.0f), ml), sub_rn(mul_rn(dls, 3.0f), ml), th[1], tl[1]);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        uint32_t hv[4], lv[4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t sel = eg_sel4((r.q[4 * k + 2 * m + i] >> r.shift) & 0x03030303u);
          hv[2 * i] = eg_pick(th, sel);
          hv[2 * i + 1] = eg_pick(th, sel >> 16);
          lv[2 * i] = eg_pick(tl, sel);
          lv[2 * i + 1] = eg_pick(tl, sel >> 16);
        }
        *reinterpret_cast<uint4*>(dh + vs * (2 * k + m)) = make_uint4(hv[0], hv[1], hv[2], hv[3]);
        *reinterpret_cast<uint4*>(dl + vs * (2 * k + m)) = make_uint4(lv[0], lv[1], lv[2], lv[3]);
      }
    }
  }
  // The code path (EgChunk<Q2_K>::put_codes): the unit's weights without their mins as f16 sc_j q f (f a power
  // of two or 0: exact), written to dh only.
  __device__ __forceinline__ static void put_codes(const Raw& r, float f, uint16_t* dh, int vs) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float s = static_cast<float>((r.sc >> (8 * k)) & 0x0Fu) * f;
      const __half2 t01 = __floats2half2_rn(0.0f, s), t23 = __floats2half2_rn(2.0f * s, 3.0f * s);
      const uint32_t th[2] = {*reinterpret_cast<const uint32_t*>(&t01), *reinterpret_cast<const uint32_t*>(&t23)};
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        uint32_t hv[4];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint32_t sel = eg_sel4((r.q[4 * k + 2 * m + i] >> r.shift) & 0x03030303u);
          hv[2 * i] = eg_pick(th, sel);
          hv[2 * i + 1] = eg_pick(th, sel >> 16);
        }
        *reinterpret_cast<uint4*>(dh + vs * (2 * k + m)) = make_uint4(hv[0], hv[1], hv[2], hv[3]);
      }
    }
  }
};

// Q2_K chunk c: units 2c, 2c + 1 (v = 2 (c % 4) + i of block c / 4) read the same 32 code bytes (their
// 2-bit fields 2 (v % 4)) and adjacent scale bytes: loaded once, 10 loads instead of the units' 20; an odd
// chunk shares its code bytes and d, dmin with the chunk before it (fields 4 and 6 of the same bytes) and
// reads only its scale word (adj: prev is that chunk). Not `wide`: the code bytes as three aligned 16-byte
// pieces (4-5 loads a pair) made the down kernel slower (4.03 -> 4.36 M cycles, H100; moe-grouped-gemm.md).
template <>
struct EgChunk<GgmlType::Q2_K> : EgUnits<GgmlType::Q2_K> {
  __device__ __forceinline__ static EgChunk load(const uint8_t* row, int64_t c, const EgChunk& prev, bool adj, bool) {
    const uint8_t* blk = row + (c >> 2) * 84;
    const int v0 = 2 * static_cast<int>(c & 3);
    EgChunk r;
    const uint32_t sc = ld(reinterpret_cast<const uint32_t*>(blk + 2 * v0));  // scale bytes 2 v0 .. 2 v0 + 3
    if ((c & 1) && adj) {
      r.u0 = prev.u0;
    } else {
      r.u0.dd = ld(reinterpret_cast<const uint32_t*>(blk + 80));
      const uint32_t* q = reinterpret_cast<const uint32_t*>(blk + 16 + 32 * (v0 >> 2));
#pragma unroll
      for (int i = 0; i < 8; ++i) r.u0.q[i] = ld(q + i);
    }
    r.u0.sc = sc & 0xFFFFu;
    r.u0.shift = 2 * (v0 & 3);
    r.u1 = r.u0;
    r.u1.sc = sc >> 16;
    r.u1.shift = r.u0.shift + 2;
    return r;
  }
  // The code path. Per row and chunk (one 256-column block: d, dmin; the sub-blocks j = 0..3 of 16
  // columns, u0's two and u1's two, scales sc_j and mins m_j)
  //   sum_k w_k x_k = sigma (sum_k c_k x_k + sum_j A_j S_j),  c_k = sc_j q_k d / sigma,  A_j = -16 dmin m_j / sigma
  // with S_j 2^-4 times the sum of x over sub-block j (the gather's sums). sigma = d 2^e with the least
  // e >= 0 that keeps |A| <= 2^14 in f16 range (e = 0 unless |dmin| 240 > 2^14 |d|), so c = sc_j q 2^-e, an
  // integer <= 45 times a power of two: exact in f16 (for e <= 24; beyond, c x is below 2^-24 of the min
  // term); d = 0: sigma from dmin, c = 0. The codes go to dh (4 vectors per unit as put()), the row's A to
  // dm (its row of a sums block, eg_sums_off: (A0h, A0h, A0l, A1h, A1h, A1l, .., A3l, 0, 0, 0, 0), paired
  // with the gather's (S0h, S0l, S0h, ..) to A_j S_j to ~22 bits); sigma is returned (the consumers'
  // per-chunk row scale, as IQ2_XXS's d / 8).
  __device__ __forceinline__ float put_codes(const EgTables&, uint16_t* dh, int vs, uint16_t* dm) const {
    using U = EgUnit<GgmlType::Q2_K>;
    const float d = f16_bits_to_f32(static_cast<uint16_t>(u0.dd & 0xffffu));
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(u0.dd >> 16));
    const float over = fabsf(dmin) * 240.0f / (16384.0f * fabsf(d));  // > 1: A out of range with sigma = d
    int e = 0;
    if (over > 1.0f && d != 0.0f) frexpf(over, &e);  // over <= 2^e
    const float sig = d != 0.0f ? ldexpf(d, e) : (dmin != 0.0f ? fabsf(dmin) * (240.0f / 16384.0f) : 1.0f);
    const float f = d != 0.0f ? ldexpf(1.0f, -e) : 0.0f;
    U::put_codes(u0, f, dh, vs);
    U::put_codes(u1, f, dh + 4 * vs, vs);
    const float a = -16.0f * dmin / sig;
    uint32_t h[2], l[2];
    eg_split2(static_cast<float>((u0.sc >> 4) & 0x0Fu) * a, static_cast<float>((u0.sc >> 12) & 0x0Fu) * a, h[0], l[0]);
    eg_split2(static_cast<float>((u1.sc >> 4) & 0x0Fu) * a, static_cast<float>((u1.sc >> 12) & 0x0Fu) * a, h[1], l[1]);
    uint32_t w[6];
#pragma unroll
    for (int p = 0; p < 2; ++p) {  // sub-blocks 2 p, 2 p + 1
      const uint32_t h0 = h[p] & 0xFFFFu, h1 = h[p] >> 16, l0 = l[p] & 0xFFFFu, l1 = l[p] >> 16;
      w[3 * p] = h0 | (h0 << 16);
      w[3 * p + 1] = l0 | (h1 << 16);
      w[3 * p + 2] = h1 | (l1 << 16);
    }
    *reinterpret_cast<uint4*>(dm) = make_uint4(w[0], w[1], w[2], w[3]);
    *reinterpret_cast<uint4*>(dm + 64) = make_uint4(w[4], w[5], 0u, 0u);  // the next core along K
    return sig;
  }
};

// Q4_K chunk c: units 2c, 2c + 1 are sub-blocks j = 2 (c % 4), j + 1 of block c / 4 (144 bytes: d, dmin, the
// 12 scale bytes, 128 code bytes), the low and high nibbles of the same 32 code bytes at 16 + 32 (c % 4); the
// block's first 16 bytes (d, dmin, scales) are one 16-byte load, read again only where prev is not chunk c - 1
// of the same block (adj). 2-3 loads per chunk instead of the units' 12 (WeightUnit<Q4_K>::decode reads
// d, dmin and the three scale words per unit). put() computes the floats as that decode does (the same bits).
// Rows of Q4_K are whole 16-byte pieces (144 bytes a block), as the decoder's 16-byte code loads assume.
template <>
struct EgChunk<GgmlType::Q4_K> {
  uint4 hdr;      // d, dmin (x), the scale words (y, z, w)
  uint32_t q[8];  // the chunk's 32 code bytes
  int j0;         // its first sub-block
  __device__ __forceinline__ static EgChunk load(const uint8_t* row, int64_t c, const EgChunk& prev, bool adj, bool) {
    const uint8_t* blk = row + (c >> 2) * 144;
    EgChunk r;
    r.hdr = (c & 3) != 0 && adj ? prev.hdr : ld(reinterpret_cast<const uint4*>(blk));
    const uint4* q = reinterpret_cast<const uint4*>(blk + 16 + 32 * (c & 3));
    const uint4 a = ld(q), b = ld(q + 1);
    r.q[0] = a.x, r.q[1] = a.y, r.q[2] = a.z, r.q[3] = a.w, r.q[4] = b.x, r.q[5] = b.y, r.q[6] = b.z, r.q[7] = b.w;
    r.j0 = 2 * static_cast<int>(c & 3);
    return r;
  }
  __device__ __forceinline__ void put(float s, const QuantTables&, const EgTables&, uint16_t* dh, uint16_t* dl,
                                      int vs) const {
    const float d = f16_bits_to_f32(static_cast<uint16_t>(hdr.x & 0xffffu)) * s;
    const float dmin = f16_bits_to_f32(static_cast<uint16_t>(hdr.x >> 16)) * s;
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // unit 2c + i: sub-block j0 + i, nibble i
      int sc, m;
      q4k_scale_min(j0 + i, hdr.y, hdr.z, hdr.w, sc, m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
#pragma unroll
      for (int v = 0; v < 4; ++v) {  // 8 elements: code words 2 v, 2 v + 1
        uint32_t h[4], l[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t word = q[2 * v + (k >> 1)];
          const int b0 = 16 * (k & 1);
          const float q0 = static_cast<float>((word >> (b0 + 4 * i)) & 0x0Fu);
          const float q1 = static_cast<float>((word >> (b0 + 8 + 4 * i)) & 0x0Fu);
          eg_split2(sub_rn(mul_rn(d1, q0), m1), sub_rn(mul_rn(d1, q1), m1), h[k], l[k]);
        }
        *reinterpret_cast<uint4*>(dh + vs * (4 * i + v)) = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4*>(dl + vs * (4 * i + v)) = make_uint4(l[0], l[1], l[2], l[3]);
      }
    }
  }
};

// IQ2_XXS: per 32-element unit 3 magnitudes (grid bytes 8, 25, 43 -> index
// byte >> 4 = 0, 1, 2) and a sign per element (bit 15 / 31 of a pair's word,
// flipped by xor: f16 rounding is symmetric, so hi and lo of -w are -hi, -lo).
// tables(): iq2_sel[g] = the selectors of grid entry g's 4 pairs, iq2_sign[i] =
// the sign masks of sign index i's 4 pairs (threads p = 0..n-1 of the producers).
template <>
struct EgUnit<GgmlType::IQ2_XXS> {
  struct Raw {
    uint32_t d, wa, wb;
  };
  __device__ static void tables(EgTables& et, const QuantTables& tab, int p, int n) {
    for (int i = p; i < 256; i += n) {
      const uint64_t grid = tab.iq2_grid[i];
      et.iq2_sel[i] = make_uint2(eg_sel4((static_cast<uint32_t>(grid) >> 4) & 0x0F0F0F0Fu),
                                 eg_sel4((static_cast<uint32_t>(grid >> 32) >> 4) & 0x0F0F0F0Fu));
    }
    for (int i = p; i < 128; i += n) {
      const uint32_t sg = iq2_sign_bits(static_cast<uint32_t>(i));
      uint32_t m = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) m |= (((sg >> (2 * j)) & 1u) << (15 - j)) | (((sg >> (2 * j + 1)) & 1u) << (31 - j));
      et.iq2_sign[i] = m;
    }
  }
  // The 8 elements k of a unit (grid index byte k of wa, sign index k of wb) from the two-half table th as
  // f16 pairs with their signs: one 16-byte vector.
  __device__ __forceinline__ static uint4 pick8(const uint32_t (&th)[2], uint32_t wa, uint32_t wb, int k,
                                                const EgTables& et) {
    const uint2 sel = et.iq2_sel[(wa >> (8 * k)) & 0xFFu];
    const uint32_t sg = et.iq2_sign[(wb >> (7 * k)) & 127u];
    constexpr uint32_t m = 0x80008000u;
    return make_uint4(eg_pick(th, sel.x) ^ (sg & m), eg_pick(th, sel.x >> 16) ^ ((sg << 1) & m),
                      eg_pick(th, sel.y) ^ ((sg << 2) & m), eg_pick(th, sel.y >> 16) ^ ((sg << 3) & m));
  }
  // The code path (CudaContext::expert_gemm_codes): the unit's 32 weights as the f16 integers
  // +-(2 ls + 1) grid_j (exact), written to dh only (4 vectors, vs apart as in put()), and its block's
  // scale d / 8, which the consumers apply to each chunk's sums (w = c d / 8 exactly, as decode's
  // d (0.5 + ls) 0.25 grid_j: every factor and product fits f32's 24 bits).
  __device__ __forceinline__ static float code_scale(const Raw& r) {
    return f16_bits_to_f32(static_cast<uint16_t>(r.d)) * 0.125f;
  }
  __device__ __forceinline__ static void put_codes(const Raw& r, const EgTables& et, uint16_t* dh, int vs) {
    const float f = static_cast<float>((r.wb >> 27) | 1u);  // 2 ls + 1
    const __half2 c01 = __floats2half2_rn(8.0f * f, 25.0f * f), c2 = __floats2half2_rn(43.0f * f, 0.0f);
    const uint32_t th[2] = {*reinterpret_cast<const uint32_t*>(&c01), *reinterpret_cast<const uint32_t*>(&c2)};
#pragma unroll
    for (int k = 0; k < 4; ++k) *reinterpret_cast<uint4*>(dh + vs * k) = pick8(th, r.wa, r.wb, k, et);
  }
  __device__ __forceinline__ static void put(const Raw& r, float s, const QuantTables&, const EgTables& et,
                                             uint16_t* dh, uint16_t* dl, int vs) {
    const float d = f16_bits_to_f32(static_cast<uint16_t>(r.d)) * s;
    const float db = mul_rn(mul_rn(d, 0.5f + static_cast<float>(r.wb >> 28)), 0.25f);
    const float ndb = -db * 8388608.0f;
    // WeightUnit<IQ2_XXS>::decode's fma(db, 2^23 + b, -db 2^23) for b = 8, 25, 43 (and 0: unused).
    uint32_t th[2], tl[2];
    eg_split2(__fmaf_rn(db, __uint_as_float(0x4B000008u), ndb), __fmaf_rn(db, __uint_as_float(0x4B000019u), ndb), th[0],
              tl[0]);
    eg_split2(__fmaf_rn(db, __uint_as_float(0x4B00002Bu), ndb), 0.0f, th[1], tl[1]);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      *reinterpret_cast<uint4*>(dh + vs * k) = pick8(th, r.wa, r.wb, k, et);
      *reinterpret_cast<uint4*>(dl + vs * k) = pick8(tl, r.wa, r.wb, k, et);
    }
  }
};
// IQ2_XXS chunk c: units 2c, 2c + 1 are the 16 bytes at 2 + 16 (c % 4) of block c / 4 (after its f16 d),
// read as 4 words from the 4-byte boundary at or below them and, when they start 2 bytes past one (rows of
// an odd number of blocks, or even blocks), the 2 bytes after those words (never past the block); d is
// read by the block's first chunk and where prev is not chunk c - 1 (adj): 5-6 loads instead of the units' 10.
// wide (rows in aligned 16-byte pieces): an even chunk loads its pair's bytes, 34 from 16 (c % 4) in the
// block (d and the pair's 32 code bytes when c % 4 = 0; chunk c - 1's last 2 bytes and the pair's when 2, then
// d on its own) as three 16-byte pieces, and keeps chunk c + 1's 16 in nx; the odd chunk after it (adj) takes
// them: 3-4 loads per chunk pair instead of 10-12 (each a wavefront per row in L1).
template <>
struct EgChunk<GgmlType::IQ2_XXS> : EgUnits<GgmlType::IQ2_XXS> {
  using U = EgUnit<GgmlType::IQ2_XXS>;
  uint32_t nx[4];  // wide, even chunk: chunk c + 1's code words
  __device__ __forceinline__ static EgChunk load(const uint8_t* row, int64_t c, const EgChunk& prev, bool adj,
                                                 bool wide) {
    if (wide && (c & 1) && adj)
      return {{U::Raw{prev.u0.d, prev.nx[0], prev.nx[1]}, U::Raw{prev.u0.d, prev.nx[2], prev.nx[3]}}, {}};
    const uint8_t* blk = row + (c >> 2) * 66;
    if (wide && !(c & 1)) {
      // bytes 16 (c % 4) .. + 34 of the block: they end within the block, so the pieces within the row
      uint32_t v[12], w[9], x[8];
      const uint32_t m = eg_load_pieces(blk + 16 * (c & 3), v);
      eg_words_at(v, m, w);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = __funnelshift_r(w[i], w[i + 1], 16);  // from byte 2 on
      const uint32_t d = (c & 3) == 0 ? (w[0] & 0xFFFFu) : ld(reinterpret_cast<const uint16_t*>(blk));
      return {{U::Raw{d, x[0], x[1]}, U::Raw{d, x[2], x[3]}}, {x[4], x[5], x[6], x[7]}};
    }
    const uint8_t* q = blk + 2 + 16 * (c & 3);
    const uint32_t mis = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(q) & 3u);  // 0 or 2
    const uint32_t* w = reinterpret_cast<const uint32_t*>(q - mis);
    uint32_t v[5];
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = ld(w + i);
    v[4] = mis != 0 ? ld(reinterpret_cast<const uint16_t*>(q + 14)) : 0u;
    const uint32_t sh = 8 * mis;
    uint32_t x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __funnelshift_r(v[i], v[i + 1], sh);
    const uint32_t d = (c & 3) == 0 || !adj ? ld(reinterpret_cast<const uint16_t*>(blk)) : prev.u0.d;
    return {{U::Raw{d, x[0], x[1]}, U::Raw{d, x[2], x[3]}}, {}};
  }
  // The code path (CudaContext::expert_gemm_codes): both units' codes and, returned, the block's scale d / 8.
  __device__ __forceinline__ float put_codes(const EgTables& et, uint16_t* dh, int vs) const {
    U::put_codes(u0, et, dh, vs);
    U::put_codes(u1, et, dh + 4 * vs, vs);
    return U::code_scale(u0);
  }
};

// The GEMM's kernel (cuda_expert_wgmma.cu, sm_90a builds only) takes plan tiles of
// k_wg_tokens assignments; the MoE op gives it the experts with at least
// CudaContext::expert_gemm_min assignments in a batch ("auto": expert_gemm_auto_min
// of backend/options/cuda_options.h, per weight type; with fewer, the decode of a
// 128-row block serves too few tokens and the tile of cuda_mma.cuh is faster;
// measurements: docs/design-notes/moe-grouped-gemm.md).
constexpr int k_wg_tokens = 128;
struct ExpertGemmArgs {
  const int32_t* list;
  const int4* tiles;  // the plan's big tiles {expert, first list index, count, padded token base}
  const int32_t* n_tiles;
  int64_t max_tiles;
  const __half* xth;  // their split x, gathered (expert_gemm_gather_x_kernel)
  const __half* xtl;
  const __half* xts;  // their sums blocks (expert_gemm_sums: Q2_K codes), or null
  const int* e_t;     // the x rows' exponents
  int x_div;
  bool x_exact;  // x is an activation quantiser's output, exact in f16: no x_lo (xtl not written, not read)
};
// True when this binary carries the sm_90a kernel and the device runs it
// (probed once: a CC 9.0 device and the sm_90a image loaded).
bool expert_wgmma_available();
// w: the experts' shape and type; wr: where each expert's rows are (cuda_expert_rows.cuh).
void launch_expert_wgmma(const CudaContext& ctx, float* out, int64_t R, const Tensor& w, ExpertRows wr,
                         const ExpertGemmArgs& a);

}  // namespace dsv4::cuda
