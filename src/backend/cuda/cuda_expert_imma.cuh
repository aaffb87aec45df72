// Decode experts on integer tensor cores: the IQ2_XXS gate/up pair and the
// Q2_K down matvec of one token per assignment as mma.sync.m16n8k32 s8 x s8
// -> s32, with the split x of cuda_idot.cuh (4 int8 digit planes, one
// power-of-two scale per 256 values) as B. Results agree with the CPU to f32
// rounding (the tensor-core tiles' contract; tests: ops_moe.cpp, k_thr_f32).
//
// Why: a dp4a matvec issues ~5.7 instructions per IQ2_XXS weight
// and ~5.5 per Q2_K weight (scripts/ptx-loops.sh), four of
// them the dp4a of the four digits alone; at 0.26-0.33 bytes per weight the weight
// stream needs ~2 per weight to keep up with DRAM. One IMMA multiplies 16
// rows x 32 weights by the four digit planes (B columns 0..3; 4..7 are zero)
// exactly in int32, so what is left per weight is decoding the codes into the
// A fragment (~3 PTX instructions per IQ2_XXS weight in the loop below).
// Measured (one H200, bench_cuda_ops --filter moe): a Flash decode step's
// experts 44.6 us vs 46.2 with dp4a; Nsight Compute: gate/up pair 29.0 vs 29.9
// us with 28% fewer instructions (4.1 per weight), down 14.6 vs 15.9 with 42%
// fewer. Both kernels are latency-bound, not issue-bound (0.55-0.59 issued per
// scheduler cycle, 13-18 warps per SM, 1.4-1.9-way bank conflicts on the
// selector-table lookups): one warp stages its chunk, waits, then runs a
// dependent chain per unit (loads -> table lookups -> prmt -> MMA -> IMAD). One commit
// group per 256-column block (MMAs on block 0 while 1..3 land) was slower: 49.5 us.
//
// Mapping (m16n8k32: lane = 4 g + t; a0/a2 hold row g's k 4t..4t+3 / 16+4t..,
// a1/a3 row g + 8's; b0/b1 hold column g's k 4t..4t+3 / 16+4t..): one MMA is
// one 32-weight unit u of the rows r0 + g and r0 + g + 8; k is permuted so
// that lane t owns the unit's 8-element group t (elements 8t..8t+3 in a0/a1,
// 8t+4..8t+7 in a2/a3) and B column p < 4 = digit plane p of the same
// elements (XDigits words 2t, 2t+1). D column p = the digit sum of plane p:
// lanes t = 0 hold (T, H), t = 1 (M, L) of rows g and g + 8; t = 2, 3 zeros.
//
// Units of one weight block share one x scale (split_x_digits_kernel scales
// per 256 values), so a block's unit sums add up in int32 before any float
// work:
//   IQ2_XXS: D = A B per unit (A = signed grid codes +-8/25/43), summed as
//            D (2 ls + 1) (the unit's scale factor: db = d (2 ls + 1) / 8);
//            |sum| <= 8 units * 31 * 32 * 43 * 128 < 2^31.
//   Q2_K:    A = code * sc (<= 45: the 16-element scale folds into the int8),
//            A' = m (the sub-block's min) for every element, both accumulated
//            by the MMA over the block: dot = d S - dmin S' (no x sums).
// Per block and row: value = xs * scale * (2^24 T + 2^16 H + 2^8 M + L) in f32.
//
// Work split: block (assignment a, 16 rows); warp w of W stages 1,024-column
// chunks w, w + W, ... of its rows (cp.async, UnitStaging's chunk layout) and
// the W partial sums per row are added in warp order (deterministic; a row's
// value does not depend on the batch).
#pragma once

#include <type_traits>

#include "backend/cuda/cuda_expert_rows.cuh"
#include "backend/cuda/cuda_idot.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace dsv4::cuda {

constexpr int k_imma_rows = 16;      // rows per block (the MMA's M)
constexpr int k_imma_max_warps = 8;  // K split: at most 8 chunks in flight per block

// This lane's B fragments of the 8 units of one 256-value x block (lanes g >= 4:
// zero columns) and the block's scale.
struct ImmaXBlock {
  uint32_t b[8][2];
  float scale;
  __device__ __forceinline__ void load(const XDigits* xd, int g, int t) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint2 v = make_uint2(0u, 0u);
      if (g < 4) v = *reinterpret_cast<const uint2*>(reinterpret_cast<const unsigned char*>(xd + i) + 32 * g + 8 * t);
      b[i][0] = v.x;
      b[i][1] = v.y;
    }
    scale = xd[0].scale;
  }
};

// f32 value of this lane's two digit sums (c0, c1) with weights (w0, w1):
// lanes t = 0: (2^24, 2^16), t = 1: (2^8, 1), t = 2, 3: (0, 0).
__device__ __forceinline__ float imma_digits(int32_t c0, int32_t c1, float w0, float w1) {
  return __fmaf_rn(static_cast<float>(c0), w0, static_cast<float>(c1) * w1);
}

template <GgmlType T>
struct ImmaBlock;

// IQ2_XXS block (66 bytes: f16 d, 8 units of 8 bytes: 4 grid indices, then
// 4 x 7 sign bits and the 4-bit scale ls in the top nibble), at byte 66 B of
// its row's staged 1,024-column chunk (264 bytes per row, rows 8-byte
// aligned): odd blocks' units start on a word, even blocks' 2 bytes past one.
template <>
struct ImmaBlock<GgmlType::IQ2_XXS> {
  // The words of one row's block b (0..3) within a staged chunk, read with
  // 8-byte loads where the offset allows (rows start 8-byte aligned: the
  // chunk is 264 bytes). Odd blocks: the 16 words of units 0..7 (unit i =
  // words 2i (grid indices) and 2i + 1 (signs, scale)); even blocks, whose
  // units start 2 bytes past a word: the 9 words from the block's start
  // covering units 4h..4h+3 of half h.
  template <int B, int H, int N>
  __device__ __forceinline__ static void half_words(const uint8_t* row, uint32_t (&w)[N]) {
    constexpr int off = (B & 1) ? 66 * B + 2 + 32 * H : 66 * B + 32 * H;
    static_assert(off % 4 == 0, "word-aligned");
    int k = 0;
    if constexpr (off % 8 != 0) {
      w[0] = *reinterpret_cast<const uint32_t*>(row + off);
      k = 1;
    }
#pragma unroll
    for (; k + 1 < N; k += 2) {
      const uint2 v = *reinterpret_cast<const uint2*>(row + off + 4 * k);
      w[k] = v.x;
      w[k + 1] = v.y;
    }
    if (k < N) w[k] = *reinterpret_cast<const uint32_t*>(row + off + 4 * k);
  }
  // The lane's A fragments of one unit of one row from its grid-index word iw
  // and sign word wb, and the unit's factor 2 ls + 1; sel_t = 0x4440 | t
  // (byte t of iw, zero-extended).
  __device__ __forceinline__ static void unit_w(uint32_t iw, uint32_t wb, int t, uint32_t sel_t, const IdotTables& tab,
                                                uint32_t& lo, uint32_t& hi, int32_t& ls2) {
    const uint32_t idx = __byte_perm(iw, 0u, sel_t);
    const uint32_t sel = tab.grid_sel[idx] | tab.sign_sel[(wb >> (7 * t)) & 127u];
    lo = signed_codes(sel);
    hi = signed_codes(sel >> 16);
    ls2 = static_cast<int32_t>((wb >> 27) | 1u);
  }
  // acc[0..1] (rows g, g + 8) += xs * value of block B of the chunk for this
  // lane's digit pair; rg, rg8: the rows' staged chunks. The unit bytes are
  // read as whole words, 8-byte loads where aligned: ~1.1 shared loads per
  // unit and row instead of 2.5 byte/halfword loads (measured on the H200,
  // bench_cuda_ops --filter moe, 3 rounds: a decode step's experts
  // 41.4 -> 40.5 us; PTX per MMA 55.7 -> 49.4, loads 9.9 -> 7.1).
  template <int B>
  __device__ __forceinline__ static void dot(const uint8_t* rg, const uint8_t* rg8, const ImmaXBlock& x, int t,
                                             float w0, float w1, const IdotTables& tab, float (&acc)[2]) {
    constexpr bool odd = (B & 1) != 0;
    constexpr int NW = odd ? 8 : 9;
    const uint32_t sel_t = 0x4440u | static_cast<uint32_t>(t);
    int32_t s[4] = {0, 0, 0, 0};
    const int32_t zero[4] = {0, 0, 0, 0};
    auto half = [&](auto h_tag) {
      constexpr int H = decltype(h_tag)::value;
      uint32_t a[NW], c[NW];
      half_words<B, H>(rg, a);
      half_words<B, H>(rg8, c);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int i = 4 * H + j;
        uint32_t ia, wa, ic, wc;
        if constexpr (odd) {
          ia = a[2 * j];
          wa = a[2 * j + 1];
          ic = c[2 * j];
          wc = c[2 * j + 1];
        } else {  // unit bytes 2 past the words
          ia = __byte_perm(a[2 * j], a[2 * j + 1], 0x5432);
          wa = __byte_perm(a[2 * j + 1], a[2 * j + 2], 0x5432);
          ic = __byte_perm(c[2 * j], c[2 * j + 1], 0x5432);
          wc = __byte_perm(c[2 * j + 1], c[2 * j + 2], 0x5432);
        }
        uint32_t lo0, hi0, lo1, hi1;
        int32_t f0, f1;
        unit_w(ia, wa, t, sel_t, tab, lo0, hi0, f0);
        unit_w(ic, wc, t, sel_t, tab, lo1, hi1, f1);
        int32_t d[4];
        imma_16832(d, lo0, lo1, hi0, hi1, x.b[i][0], x.b[i][1], zero);
        s[0] += d[0] * f0;
        s[1] += d[1] * f0;
        s[2] += d[2] * f1;
        s[3] += d[3] * f1;
      }
    };
    half(std::integral_constant<int, 0>{});
    half(std::integral_constant<int, 1>{});
    const uint8_t* pg = rg + 66 * B;
    const uint8_t* pg8 = rg8 + 66 * B;
    const float sg = __fmul_rn(f16_bits_to_f32(*reinterpret_cast<const uint16_t*>(pg)), 0.125f) * x.scale;
    const float sg8 = __fmul_rn(f16_bits_to_f32(*reinterpret_cast<const uint16_t*>(pg8)), 0.125f) * x.scale;
    acc[0] = __fmaf_rn(imma_digits(s[0], s[1], w0, w1), sg, acc[0]);
    acc[1] = __fmaf_rn(imma_digits(s[2], s[3], w0, w1), sg8, acc[1]);
  }
};

// Q2_K block at p (84 bytes: 16 scale bytes (sc | m << 4), 64 code bytes, f16
// d, f16 dmin). Unit v = elements 32v..32v+31: code bits 2 (v % 4) of bytes
// 32 (v / 4) + 0..31; group t of it is sub-block 2v + t / 2.
template <>
struct ImmaBlock<GgmlType::Q2_K> {
  template <class Tables>
  __device__ __forceinline__ static void dot(const uint8_t* pg, const uint8_t* pg8, bool, const ImmaXBlock& x, int t,
                                             float w0, float w1, const Tables&, float (&acc)[2]) {
    const uint8_t* rows[2] = {pg, pg8};
    uint32_t sc[2][4], q[2][2][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int j = 0; j < 4; ++j) sc[r][j] = reinterpret_cast<const uint32_t*>(rows[r])[j];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        q[r][h][0] = *reinterpret_cast<const uint32_t*>(rows[r] + 16 + 32 * h + 8 * t);
        q[r][h][1] = *reinterpret_cast<const uint32_t*>(rows[r] + 20 + 32 * h + 8 * t);
      }
    }
    // Scale byte 2v + t / 2 = byte (v odd ? 2 : 0) + t / 2 of word v / 2.
    const uint32_t sel_even = 0x4440u | static_cast<uint32_t>(t >> 1), sel_odd = sel_even + 2u;
    int32_t s[4] = {0, 0, 0, 0}, m[4] = {0, 0, 0, 0};
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      uint32_t a[2][2], am[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint32_t byte = prmt(sc[r][v >> 1], 0u, (v & 1) ? sel_odd : sel_even);
        const uint32_t f = byte & 15u;
        const int sh = 2 * (v & 3);
        a[r][0] = ((q[r][v >> 2][0] >> sh) & 0x03030303u) * f;  // <= 45 per byte: no carries
        a[r][1] = ((q[r][v >> 2][1] >> sh) & 0x03030303u) * f;
        am[r] = (byte >> 4) * 0x01010101u;
      }
      imma_16832(s, a[0][0], a[1][0], a[0][1], a[1][1], x.b[v][0], x.b[v][1], s);
      imma_16832(m, am[0], am[1], am[0], am[1], x.b[v][0], x.b[v][1], m);
    }
    // dot = xs (d S - dmin S') per row.
    auto row = [&](const uint8_t* p, int32_t c0, int32_t c1, int32_t m0, int32_t m1, float& a) {
      const uint32_t dd = *reinterpret_cast<const uint32_t*>(p + 80);
      const float d = f16_bits_to_f32(static_cast<uint16_t>(dd & 0xffffu)),
                  dmin = f16_bits_to_f32(static_cast<uint16_t>(dd >> 16));
      const float v = __fmaf_rn(d, imma_digits(c0, c1, w0, w1), -(dmin * imma_digits(m0, m1, w0, w1)));
      a = __fmaf_rn(v, x.scale, a);
    };
    row(pg, s[0], s[1], m[0], m[1], acc[0]);
    row(pg8, s[2], s[3], m[2], m[3], acc[1]);
  }
};

// out[a, r] = W[e_a, r, :] . x[a / x_div] for the 16 rows of blockIdx.y; Pair:
// W = gate, W2 = up and out[a, r] = expert_mid(gate, up, weights[a]) (cuda_moe.cu
// passes it as Mid). xdig: the split x rows (32 n_chunks XDigits each).
// blockDim.x = 32 W, W <= k_imma_max_warps; dynamic shared memory W * NM * 16 *
// chunk_bytes. Requires can_stage<T> (rows of whole 1,024-column chunks).
template <GgmlType T, bool Pair, class Mid>
__global__ void __launch_bounds__(k_imma_max_warps * 32, Pair ? 3 : 2)
    expert_imma_kernel(float* __restrict__ out, int64_t R, ExpertRows w, ExpertRows w2, size_t row_bytes,
                       int64_t n_chunks, int64_t E, const int32_t* __restrict__ experts,
                       const float* __restrict__ weights, float clamp, const XDigits* __restrict__ xdig, int x_div,
                       QuantTables tab) {
  constexpr int NM = Pair ? 2 : 1;
  constexpr int CB = UnitStaging<T>::chunk_bytes;
  constexpr int BB = CB / 4;  // bytes per 256-weight block
  using Vec = typename UnitStaging<T>::Vec;
  constexpr int SV = CB / static_cast<int>(sizeof(Vec));
  extern __shared__ __align__(16) unsigned char im_smem[];
  __shared__ std::conditional_t<T == GgmlType::IQ2_XXS, IdotTables, int> tables;
  __shared__ float red[k_imma_max_warps][NM][k_imma_rows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  if constexpr (T == GgmlType::IQ2_XXS) block_idot_tables(tables, tab);  // constant data: before pdl_enter
  pdl_enter();
  __syncthreads();
  const int64_t a = blockIdx.x;
  const int32_t ex = experts[a];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * k_imma_rows;
  if (ex < 0) {  // an assignment the host computes (ex = -1 - e, cuda_host_experts.cuh): zeros here
    if (threadIdx.x < k_imma_rows && r0 + threadIdx.x < R) out[a * R + r0 + threadIdx.x] = 0.0f;
    return;
  }
  DEVICE_CHECK(ex < E);
  const uint8_t* base[NM];
  base[0] = w.at(ex);
  if constexpr (Pair) base[1] = w2.at(ex);
  const XDigits* xd = xdig + (a / x_div) * n_chunks * 32;
  Vec* stage = reinterpret_cast<Vec*>(im_smem) + warp * NM * k_imma_rows * SV;
  const auto* sb = reinterpret_cast<const uint8_t*>(stage);
  const float w0 = t == 0 ? 16777216.0f : t == 1 ? 256.0f : 0.0f;
  const float w1 = t == 0 ? 65536.0f : t == 1 ? 1.0f : 0.0f;
  float acc[NM][2] = {};
  for (int64_t c = warp; c < n_chunks; c += n_warps) {
    // Chunk c of the 16 rows (rows past R repeat the last row; not stored).
    // (One commit group per 256-column block, MMAs of block 0 while 1..3 are in
    // flight, measured slower: 49.5 vs 44.6 us per decode step's experts.)
#pragma unroll
    for (int mi = 0; mi < NM; ++mi)
      for (int i = lane; i < k_imma_rows * SV; i += 32) {
        const int rr = i / SV, v = i - rr * SV;
        const int64_t r = r0 + rr < R ? r0 + rr : R - 1;
        cp_async_vec(stage + (mi * k_imma_rows + rr) * SV + v,
                     reinterpret_cast<const Vec*>(base[mi] + r * static_cast<int64_t>(row_bytes) + c * CB) + v);
      }
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    if constexpr (T == GgmlType::IQ2_XXS) {
      // The 4 blocks unrolled, each with its own alignment, so the parity is a
      // constant, never a branch per unit and row (measured: blocks in a loop,
      // PTX per MMA 82.5, a decode step's experts 44.1 us; in pairs 55.7, 41.3
      // us; unrolled with word loads 49.4, 40.5 us).
      auto block_w = [&](auto b_tag) {
        constexpr int B = decltype(b_tag)::value;
        ImmaXBlock xb;
        xb.load(xd + c * 32 + B * 8, g, t);
#pragma unroll
        for (int mi = 0; mi < NM; ++mi) {
          const uint8_t* rg = sb + (mi * k_imma_rows + g) * CB;
          ImmaBlock<T>::template dot<B>(rg, rg + 8 * CB, xb, t, w0, w1, tables, acc[mi]);
        }
      };
      block_w(std::integral_constant<int, 0>{});
      block_w(std::integral_constant<int, 1>{});
      block_w(std::integral_constant<int, 2>{});
      block_w(std::integral_constant<int, 3>{});
    } else {
      // The 256-column block b of the chunk (one block's B fragments, 16 registers, live at a time).
#pragma unroll 1
      for (int b = 0; b < 4; ++b) {
        ImmaXBlock xb;
        xb.load(xd + c * 32 + b * 8, g, t);
#pragma unroll
        for (int mi = 0; mi < NM; ++mi) {
          const uint8_t* pg = sb + (mi * k_imma_rows + g) * CB + b * BB;
          ImmaBlock<T>::dot(pg, pg + 8 * CB, (b & 1) != 0, xb, t, w0, w1, tables, acc[mi]);
        }
      }
    }
    __syncwarp();  // the stage is refilled by the next chunk
  }
  // Lanes t = 0 and 1 hold the (T, H) and (M, L) parts of rows g, g + 8.
#pragma unroll
  for (int mi = 0; mi < NM; ++mi) {
    acc[mi][0] += __shfl_xor_sync(k_full_mask, acc[mi][0], 1);
    acc[mi][1] += __shfl_xor_sync(k_full_mask, acc[mi][1], 1);
    if (t == 0) {
      red[warp][mi][g] = acc[mi][0];
      red[warp][mi][g + 8] = acc[mi][1];
    }
  }
  __syncthreads();
  if (threadIdx.x < k_imma_rows && r0 + threadIdx.x < R) {
    const int rr = threadIdx.x;
    float s[NM];
#pragma unroll
    for (int mi = 0; mi < NM; ++mi) {
      s[mi] = red[0][mi][rr];
      for (int j = 1; j < n_warps; ++j) s[mi] += red[j][mi][rr];
    }
    if constexpr (Pair)
      out[a * R + r0 + rr] = Mid{}(s[0], s[1], weights[a], clamp);
    else
      out[a * R + r0 + rr] = s[0];
  }
}

}  // namespace dsv4::cuda
