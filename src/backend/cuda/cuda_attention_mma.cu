// Core attention on tensor cores (model-spec.md §5.7; the key set of a query
// and the maths are those of cuda_attention.cu, whose FFMA kernel runs when
// this one cannot: keys not bf16-exact, no tensor cores, head width not 128,
// 256 or 512).
//
// Why MMAs fit: the H heads of a token share its key set and its single K = V
// head (MQA), so the token's logits are a matrix product, S = Q K^T (Q [H, d],
// K [n_keys, d]), and so is its output, O = P K (P = the softmax rows): M =
// heads. The FFMA kernel reads every key element from shared memory for one
// FMA per head; here one 16x8x16 MMA does 4,096 FLOP per operand fetch.
//
// Exactness (the results agree with the FFMA kernel and the CPU to f32
// rounding; test_backend_ops compares with k_thr_f32):
//  * keys: this kernel runs only when every key value is a bf16 (KV_FP8 rows:
//    e4m3 x 2^s nope dims, a bf16 RoPE tail; f32 rows holding the reference
//    numerics' simulated values, AttentionOp::keys_bf16), so K converts exactly;
//  * q and P are split into three bf16 terms, x = hi + mid + lo (each the bf16
//    rounding of what the previous ones leave): 24 significant bits, exact for
//    f32 values away from underflow. Each term's products are exact and the MMA
//    accumulates in f32 (lo, mid, hi in that order);
//  * under `fast` numerics (AttentionOp::fast) heads of 512 may take q and P
//    as 2 or 1 bf16 terms instead (CudaContext::fast_attention_terms: 16 or 8
//    significant bits, 4 or 2 MMAs per product pair instead of 6, and at 1 term
//    a third of the q staging), held to a tolerance against the CPU;
//  * each key tile's P K goes into fresh MMA accumulators (a chain of 6 MMAs)
//    that are added to O with an f32 FMA: over thousands of keys one MMA chain
//    drifted to NMSE 3.5e-10 against the CPU (8,320 keys); this way 3e-13.
//
// Launch: grid (n tokens, ceil(H / HB), S), HB = 16 MT heads per block (MT = 2
// when H >= 32 for prefill batches, else 1; rows >= H are zero and never written), 256 threads,
// head width D a template argument. Prefill batches (n >= 8): S = 1, a block
// walks all keys of its token and writes o. Smaller batches (decode): S = 16
// key splits with the FFMA kernel's split geometry, each writing its running
// max, denominator and unnormalised O for launch_attention_combine; so do the
// single-token sequences of a batched decode step launched together (one
// key source per token, launch_attention_mma_tokens with per_token). Per tile of
// 32 keys:
//   1. this tile's raw rows (fetched by cp.async during the previous tile into
//      a staging buffer: warp w fetches keys 4w..4w+3, 8 lanes per key, their
//      row indices read one more tile ahead) are decoded to bf16 rows of Ks
//      (KV_FP8: bit operations, warp_key_to_bf16; a missing key: a zero row and
//      logit -inf); then the next tile's fetch is issued;
//   2. S = Q K^T: warp w owns m-tile w % MT and the dims [kr DR, (kr+1) DR),
//      kr = w / MT, DR = D MT / 8, for the 32 keys (4 n-tiles), and writes its
//      partial sums to Sp[kr] (summed in kr order in step 3);
//   3. softmax: 256 / HB threads per head row: logits l = scale * sum_kr Sp,
//      running max m and denominator l_run, P = e^(l - m) as three bf16 terms
//      into Ps, the row's rescale factor alpha = e^(m_old - m) into al;
//   4. O = alpha O + P K: warp w owns the output dims [w D/8, (w+1) D/8) of all
//      HB rows (accumulators in registers; B fragments by ldmatrix.trans of Ks).
// End: o = O / (l_run + e^(sink - m)).
// Shared memory (D = 512, MT = 2, KV_FP8 rows): Qs 3 x 32 x 520 bf16 (100 KB),
// Ks 32 x 520 bf16 (33 KB), staging 32 x 592 (19 KB), Sp 4 x 32 x 40 f32
// (20 KB), Ps 3 x 32 x 40 bf16 (7.5 KB): 180 KB, one block per SM (f32 rows:
// 227 KB). Rows are padded by 16 bytes so that the 8 row addresses of every
// ldmatrix fall in distinct bank groups.
// Measured (H200, bench_cuda_ops, ctx 2,048): 2,048 tokens of a ratio-4 layer
// in 3.1 ms, a decode step's layer in 12.6-17.3 us with MT = 1 (MT = 2:
// 15.1-20.9; FFMA kernel: 27-46 us); a whole
// 2,048-token prefill batch spends 86 ms in attention (FFMA: 670 ms).
// Nsight Compute: issue-limited by the per-tile work around the MMAs (key
// decode, softmax, term splits), two warps per scheduler.
//
// CPU reference: cpu::attention (src/backend/cpu/cpu_attention.cpp).
#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_seqs.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace dsv4::cuda {

namespace {

constexpr int k_am_threads = 256;
constexpr int k_am_warps = k_am_threads / 32;
constexpr int k_am_keys = 32;              // keys per tile
constexpr int k_am_terms = 3;              // bf16 terms of q and P (f32-exact); `fast` may take fewer
constexpr int k_am_pad = 8;                // bf16 padding of Qs / Ks rows
constexpr int k_am_sp_ld = k_am_keys + 8;  // f32 row stride of Sp
constexpr int k_am_ps_ld = k_am_keys + 8;  // bf16 row stride of Ps
constexpr int k_am_max_d = 512;            // accumulators: d / 64 n-tiles of 8 per warp and m-tile
constexpr int k_am_max_nt = k_am_max_d / 64;
constexpr int64_t k_am_min_tokens = 8;  // smaller batches (decode) split each token's keys ...
constexpr int k_am_splits = 16;         // ... over this many blocks

size_t am_smem_bytes(int MT, int terms, int64_t d, int64_t stage_ld) {
  const int64_t HB = 16 * MT, KS = k_am_warps / MT, ld = d + k_am_pad;
  return static_cast<size_t>(2 * (terms * HB * ld + k_am_keys * ld) + k_am_keys * stage_ld + 4 * KS * HB * k_am_sp_ld +
                             2 * terms * HB * k_am_ps_ld + 4 * HB + 2 * k_am_keys);
}

// x ~ t[0] + .. + t[N - 1] (bf16 bits; each term the rounding of what is left): exact for N = 3 (24
// significant bits), x's leading 16 or 8 bits for N = 2 or 1.
template <int N>
__device__ __forceinline__ void split_bf16(float x, uint16_t (&t)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    t[i] = bf16_bits_rn(x);
    x -= bf16_bits_to_f32(t[i]);
  }
}

// e4m3 codes to bf16 without a float conversion: the 7 magnitude bits of code
// c = (e, m) shifted into a bf16's exponent and mantissa fields, (c & 0x7f) << 4,
// are the bf16 of 2^-120 times c's value (for e > 0: 2^(e-127) (1 + m/8); for
// e = 0: the bf16 subnormal m 2^-129 = 2^-120 m 2^-9), so one exact bf16 product
// by 2^120 x the block scale 2^(s-127) = 2^(s-7) gives the key value (bf16
// products take subnormal inputs; a factor outside bf16's range, s > 134, and
// the zero scale s = 0 are applied as two products). Two codes per call: bytes `sel` of w (0x4140: bytes
// 0, 1; 0x4342: bytes 2, 3) into the two halves.
constexpr uint32_t k_bf16x2_2p120 = 0x7B807B80u;  // 2^120 = bf16 exponent field 247
__device__ __forceinline__ uint32_t e4m3x2_bf16_bits(uint32_t w, uint32_t sel) {
  const uint32_t x = __byte_perm(w, 0u, sel);  // [c, 0, c', 0]
  return ((x & 0x007F007Fu) << 4) | ((x & 0x00800080u) << 8);
}
__device__ __forceinline__ uint32_t bf16x2_pow2(uint8_t s) {  // 2^(s-127) in both halves (a scale code)
  return (static_cast<uint32_t>(s) << 7) * 0x00010001u;
}
// 2^(s-7) in both halves, or 0 when it exceeds bf16's range (or s = 0, the zero scale).
__device__ __forceinline__ uint32_t e4m3_factor_bf16x2(uint8_t s) {
  return s >= 1 && s <= 134 ? ((static_cast<uint32_t>(s) + 120u) << 7) * 0x00010001u : 0u;
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 x, y;
  memcpy(&x, &a, 4);
  memcpy(&y, &b, 4);
  const __nv_bfloat162 r = __hmul2(x, y);
  uint32_t u;
  memcpy(&u, &r, 4);
  return u;
}

// dst[0, d) (bf16) = the key row at src; exact for bf16-valued keys. Lanes of one warp; no sync inside.
__device__ __forceinline__ void warp_key_to_bf16(uint16_t* dst, const uint8_t* src, int64_t d, GgmlType type) {
  const int lane = threadIdx.x & 31;
  if (type == GgmlType::KV_FP8) {
    const int64_t n = kv_fp8_nope(d);
    const uint8_t* scales = src + kv_fp8_scale_offset(d);
    for (int64_t e = 4 * lane; e < n; e += 128) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(src + e);
      const uint8_t sc = scales[e / k_kv_fp8_block];
      const uint32_t f = e4m3_factor_bf16x2(sc);
      uint32_t lo = e4m3x2_bf16_bits(w, 0x4140u), hi = e4m3x2_bf16_bits(w, 0x4342u);
      if (f) {
        lo = bf16x2_mul(lo, f);
        hi = bf16x2_mul(hi, f);
      } else {  // 2^120, then the scale
        lo = bf16x2_mul(bf16x2_mul(lo, k_bf16x2_2p120), bf16x2_pow2(sc));
        hi = bf16x2_mul(bf16x2_mul(hi, k_bf16x2_2p120), bf16x2_pow2(sc));
      }
      *reinterpret_cast<uint2*>(dst + e) = make_uint2(lo, hi);
    }
    const uint32_t* tail = reinterpret_cast<const uint32_t*>(src + kv_fp8_tail_offset(d));
    uint32_t* dt = reinterpret_cast<uint32_t*>(dst + n);
    for (int j = lane; j < k_kv_rope_dims / 2; j += 32) dt[j] = tail[j];
  } else {  // F32 rows with bf16 values
    const float* s = reinterpret_cast<const float*>(src);
    for (int64_t e = 4 * lane; e < d; e += 128) {
      const float4 v = *reinterpret_cast<const float4*>(s + e);
      *reinterpret_cast<uint2*>(dst + e) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
  }
}

// part_acc == null: o of every (token, head) (one split); else split s = blockIdx.z of
// gridDim.z writes its running max m, denominator l and unnormalised O to
// part_ml[2 slot + {0, 1}], part_acc[slot d + e], slot = (t H + h) S + s, the
// layout attention_combine merges (cuda_attention.cu).
// TERMS: bf16 terms of q and P (k_am_terms: f32-exact; fewer only for AttentionOp::fast). One term at width
// 512 asks for two blocks per SM (128 registers; its shared memory allows it); the others name no minimum (0),
// as before the template had TERMS: an explicit 1 let ptxas give them ~50% more registers.
template <int MT, int D, int TERMS>
__global__ void __launch_bounds__(k_am_threads, TERMS == 1 && D == 512 ? 2 : 0)
    attention_mma_kernel(float* out, float* part_acc, float* part_ml, const float* q, SeqTable<AttKeySource> srcs,
                         bool per_token, const int32_t* pos, const float* sinks, int H, float scale, int stage_ld) {
  pdl_enter();
  constexpr int d = D;
  constexpr int HB = 16 * MT;                  // heads per block
  constexpr int KS = k_am_warps / MT;          // dim ranges of the logits step
  constexpr int TPR = k_am_threads / HB;       // softmax threads per head row
  constexpr int KPT = k_am_keys / TPR;         // keys per softmax thread
  constexpr int KPW = k_am_keys / k_am_warps;  // keys each warp fetches per tile
  static_assert(TPR <= 32 && 32 % TPR == 0 && KPT >= 1 && KPW <= 4,
                "softmax rows within warps; 8 lanes per fetched key");
  extern __shared__ __align__(16) unsigned char am_smem[];
  constexpr int ld = d + k_am_pad;
  uint16_t* Qs = reinterpret_cast<uint16_t*>(am_smem);                    // [terms][HB][ld]
  uint16_t* Ks = Qs + TERMS * HB * ld;                                    // [keys][ld]
  uint8_t* stage = reinterpret_cast<uint8_t*>(Ks + k_am_keys * ld);       // [keys][stage_ld] raw rows of the next tile
  float* Sp = reinterpret_cast<float*>(stage + k_am_keys * stage_ld);     // [KS][HB][sp_ld]
  uint16_t* Ps = reinterpret_cast<uint16_t*>(Sp + KS * HB * k_am_sp_ld);  // [terms][HB][ps_ld]
  float* al = reinterpret_cast<float*>(Ps + TERMS * HB * k_am_ps_ld);     // [HB] alpha; at the end the denominators
  uint8_t* kst = reinterpret_cast<uint8_t*>(al + HB);  // [2][keys] 0 missing, 1 ring, 2 comp (tile parity)

  const float neg_inf = -__int_as_float(0x7f800000);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t t = blockIdx.x;
  // The token's keys: one source for the batch (its sel row t) or one per token (sel row 0 of its own).
  const AttKeySource& src = srcs.at[per_token ? t : 0];
  const int64_t ts = per_token ? 0 : t;
  const int h0 = static_cast<int>(blockIdx.y) * HB;
  const AttQueryKeys qk = att_query_keys(src, pos[t]);
  const int64_t n_keys = qk.n_keys();
  // This split's keys [k_begin, k_end): the split kernel's geometry (chunks rounded up to the tile).
  const int S = static_cast<int>(gridDim.z), split = static_cast<int>(blockIdx.z);
  const int64_t chunk = ((n_keys + S - 1) / S + k_am_keys - 1) / k_am_keys * k_am_keys;
  const int64_t k_begin = min(n_keys, split * chunk), k_end = min(n_keys, k_begin + chunk);
  const int64_t n_tiles = (k_end - k_begin + k_am_keys - 1) / k_am_keys;

  // Key fetches: warp w copies keys w*KPW .. w*KPW + KPW-1 of a tile, 8 lanes per key. Lane j < KPW
  // holds the row index of key w*KPW + j of the next tile to fetch, read one tile ahead of its use.
  auto key_index = [&](int64_t tile) -> int64_t {
    const int64_t i = k_begin + tile * k_am_keys + warp * KPW + lane;
    return lane < KPW && i < k_end ? att_key_index(src, qk, ts, i) : -1;
  };
  auto fetch = [&](int64_t tile, int64_t idx_lanes) {
    const int kk = lane >> 3, j = warp * KPW + kk;
    const int64_t i = k_begin + tile * k_am_keys + j, idx = __shfl_sync(k_full_mask, idx_lanes, kk & (KPW - 1));
    if (kk < KPW) {
      const bool win = i < qk.n_win, ok = i < k_end && att_key_present(qk, i, idx);
      if ((lane & 7) == 0) kst[(tile & 1) * k_am_keys + j] = ok ? (win ? 1 : 2) : 0;
      if (ok) {
        const GgmlType type = win ? src.ring_type : src.comp_type;
        const uint4* row = reinterpret_cast<const uint4*>(kv_row_ptr(win ? src.ring : src.comp, type, d, idx));
        uint4* st = reinterpret_cast<uint4*>(stage + j * stage_ld);
        const int chunks =
            static_cast<int>((type == GgmlType::F32 ? 4 * static_cast<int64_t>(d) : kv_fp8_row_bytes(d)) / 16);
        for (int c = lane & 7; c < chunks; c += 8) cp_async_vec(st + c, row + c);
      }
    }
    cp_async_commit();
  };
  int64_t idx_next = key_index(0);
  if (n_tiles > 0) fetch(0, idx_next);
  idx_next = key_index(1);

  // q rows of the block's heads as TERMS bf16 terms (rows >= H: zero); float4 loads, 8 in flight per thread.
  {
    const int n4 = HB * d / 4;
    constexpr int B = 8;
    for (int f0 = 0; f0 < n4; f0 += B * k_am_threads) {
      float4 v[B];
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const int f = f0 + u * k_am_threads + static_cast<int>(threadIdx.x), r = 4 * f / d;
        v[u] = f < n4 && h0 + r < H
                   ? *reinterpret_cast<const float4*>(q + (t * H + h0 + r) * static_cast<int64_t>(d) + (4 * f - r * d))
                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const int f = f0 + u * k_am_threads + static_cast<int>(threadIdx.x), r = 4 * f / d, e = 4 * f - r * d;
        if (f >= n4) continue;
        uint16_t x0[TERMS], x1[TERMS], x2[TERMS], x3[TERMS];
        split_bf16<TERMS>(v[u].x, x0);
        split_bf16<TERMS>(v[u].y, x1);
        split_bf16<TERMS>(v[u].z, x2);
        split_bf16<TERMS>(v[u].w, x3);
#pragma unroll
        for (int k = 0; k < TERMS; ++k)
          *reinterpret_cast<uint2*>(Qs + (k * HB + r) * ld + e) =
              make_uint2(x0[k] | (static_cast<uint32_t>(x1[k]) << 16), x2[k] | (static_cast<uint32_t>(x3[k]) << 16));
      }
    }
  }

  // Step 2's warp: m-tile and dim range; step 3's thread: row and keys; step 4's warp: output dims.
  constexpr int dr = d / KS, dw = d / k_am_warps, n_nt = dw / 8;
  static_assert(d % 128 == 0 && d <= k_am_max_d, "head width: a multiple of 128, at most 512");
  const int mt_s = warp % MT, kr = warp / MT;
  const int row = threadIdx.x / TPR, sub = threadIdx.x % TPR;
  float acc[MT][k_am_max_nt][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < k_am_max_nt; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][j][c] = 0.0f;
  float m_run = neg_inf, l_run = 0.0f;  // of `row` (every thread of the row holds them)

  for (int64_t tile = 0; tile < n_tiles; ++tile) {
    // 1. This tile's raw rows (fetched during the previous tile) -> bf16 rows of Ks; then the next tile's fetch.
    cp_async_wait<0>();
    __syncthreads();
    const uint8_t* ks_state = kst + (tile & 1) * k_am_keys;
#pragma unroll
    for (int jj = 0; jj < KPW; ++jj) {
      const int j = warp * KPW + jj, st = ks_state[j];
      uint16_t* dst = Ks + j * ld;
      if (st) {
        warp_key_to_bf16(dst, stage + j * stage_ld, d, st == 1 ? src.ring_type : src.comp_type);
      } else {
        for (int e = 2 * lane; e < d; e += 64) *reinterpret_cast<uint32_t*>(dst + e) = 0u;
      }
    }
    __syncthreads();
    if (tile + 1 < n_tiles) fetch(tile + 1, idx_next);
    idx_next = key_index(tile + 2);

    // 2. Partial logits of m-tile mt_s over dims [kr dr, (kr+1) dr) for the 32 keys.
    {
      float s[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) s[nt][c] = 0.0f;
      const uint16_t* qa = Qs + (mt_s * 16 + (lane & 15)) * ld + kr * dr + (lane >> 4) * 8;
      const uint16_t* kb = Ks + ((lane >> 4) * 8 + (lane & 7)) * ld + kr * dr + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int kk = 0; kk < dr; kk += 16) {
        uint32_t a[TERMS][4], b[2][4];
#pragma unroll
        for (int k = 0; k < TERMS; ++k) ldsm_x4(a[k], qa + k * HB * ld + kk);
#pragma unroll
        for (int np = 0; np < 2; ++np) ldsm_x4(b[np], kb + np * 16 * ld + kk);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int k = TERMS - 1; k >= 0; --k)
            mma_bf16_16816(s[nt], a[k], b[nt >> 1][2 * (nt & 1)], b[nt >> 1][2 * (nt & 1) + 1]);
      }
      float* sp = Sp + (kr * HB + mt_s * 16 + g) * k_am_sp_ld + 2 * tq;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        *reinterpret_cast<float2*>(sp + 8 * nt) = make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2*>(sp + 8 * k_am_sp_ld + 8 * nt) = make_float2(s[nt][2], s[nt][3]);
      }
    }
    __syncthreads();

    // 3. Online softmax of row `row`, keys sub*KPT .. sub*KPT + KPT-1.
    {
      float lg[KPT];
      float mx = neg_inf;
#pragma unroll
      for (int u = 0; u < KPT; ++u) {
        const int j = sub * KPT + u;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < KS; ++k) v += Sp[(k * HB + row) * k_am_sp_ld + j];
        lg[u] = ks_state[j] ? v * scale : neg_inf;
        mx = fmaxf(mx, lg[u]);
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(k_full_mask, mx, o));
      const float m_new = fmaxf(m_run, mx);
      const float alpha = m_run == neg_inf ? 0.0f : expf(m_run - m_new);
      float ps = 0.0f;
#pragma unroll
      for (int u = 0; u < KPT; ++u) {
        const int j = sub * KPT + u;
        const float p = (lg[u] == neg_inf || m_new == neg_inf) ? 0.0f : expf(lg[u] - m_new);
        ps += p;
        uint16_t pt[TERMS];
        split_bf16<TERMS>(p, pt);
#pragma unroll
        for (int k = 0; k < TERMS; ++k) Ps[(k * HB + row) * k_am_ps_ld + j] = pt[k];
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) ps += __shfl_xor_sync(k_full_mask, ps, o);
      l_run = l_run * alpha + ps;
      m_run = m_new;
      if (sub == 0) al[row] = alpha;
    }
    __syncthreads();

    // 4. O = alpha O + P K over this warp's output dims, 4 n-tiles at a time: the tile's
    // P K in fresh MMA accumulators (a chain of 6 MMAs), added to O with an f32 FMA (so
    // long key sets accumulate with f32 rounding, not the MMA's).
    {
      float a_lo[MT], a_hi[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        a_lo[m] = al[m * 16 + g];
        a_hi[m] = al[m * 16 + g + 8];
      }
#pragma unroll
      for (int gq = 0; gq < k_am_max_nt / 4; ++gq) {
        if (4 * gq >= n_nt) continue;
        float ta[MT][4][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c) ta[m][j][c] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < k_am_keys; kk += 16) {
          uint32_t a[MT][TERMS][4];
#pragma unroll
          for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int k = 0; k < TERMS; ++k)
              ldsm_x4(a[m][k], Ps + (k * HB + m * 16 + (lane & 15)) * k_am_ps_ld + kk + (lane >> 4) * 8);
          const uint16_t* vb =
              Ks + (kk + ((lane >> 3) & 1) * 8 + (lane & 7)) * ld + warp * dw + 32 * gq + (lane >> 4) * 8;
#pragma unroll
          for (int np = 0; np < 2; ++np) {
            if (4 * gq + 2 * np >= n_nt) continue;
            uint32_t b[4];
            ldsm_x4_trans(b, vb + 16 * np);
#pragma unroll
            for (int half = 0; half < 2; ++half)
#pragma unroll
              for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int k = TERMS - 1; k >= 0; --k)
                  mma_bf16_16816(ta[m][2 * np + half], a[m][k], b[2 * half], b[2 * half + 1]);
          }
        }
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int c = 0; c < 4; ++c)
              acc[m][4 * gq + j][c] = fmaf(acc[m][4 * gq + j][c], c < 2 ? a_lo[m] : a_hi[m], ta[m][j][c]);
      }
    }
  }

  __syncthreads();
  if (part_acc) {  // one split of several: the running state, merged by attention_combine
    if (sub == 0 && h0 + row < H) {
      const int64_t slot = (t * H + h0 + row) * S + split;
      part_ml[2 * slot] = m_run;
      part_ml[2 * slot + 1] = l_run;
    }
  } else {
    if (sub == 0) al[row] = h0 + row < H ? l_run + expf(sinks[h0 + row] - m_run) : 1.0f;
    __syncthreads();
  }
#pragma unroll
  for (int m = 0; m < MT; ++m) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m * 16 + g + 8 * half;
      if (h0 + r >= H) continue;
      const float den = part_acc ? 1.0f : al[r];
      float* o = (part_acc ? part_acc + ((t * H + h0 + r) * S + split) * static_cast<int64_t>(d)
                           : out + (t * H + h0 + r) * static_cast<int64_t>(d)) +
                 warp * dw + 2 * tq;
#pragma unroll
      for (int nt = 0; nt < n_nt; ++nt)
        *reinterpret_cast<float2*>(o + 8 * nt) =
            part_acc ? make_float2(acc[m][nt][2 * half], acc[m][nt][2 * half + 1])
                     : make_float2(acc[m][nt][2 * half] / den, acc[m][nt][2 * half + 1] / den);
    }
  }
}

bool keys_exact_in_bf16(const Tensor& rows, bool keys_bf16) {
  return rows.type == GgmlType::KV_FP8 || (rows.type == GgmlType::F32 && keys_bf16);
}

}  // namespace

bool attention_uses_mma(const CudaContext& ctx, const AttentionOp& op) {
  const int64_t d = op.q.ne[0];
  return ctx.tensor_cores && (d == 128 || d == 256 || d == 512) && keys_exact_in_bf16(op.ring, op.keys_bf16) &&
         (!op.comp || keys_exact_in_bf16(op.comp, op.keys_bf16));
}

void launch_attention_mma(const CudaContext& ctx, const AttentionOp& op) {
  SeqTable<AttKeySource> srcs{};
  srcs.at[0] = att_key_source(op, 0);
  launch_attention_mma_tokens(ctx, op, srcs, false, op.q.f32(), op.out.f32(), op.pos.i32(), op.q.ne[2]);
}

void launch_attention_mma_tokens(const CudaContext& ctx, const AttentionOp& like, const SeqTable<AttKeySource>& srcs,
                                 bool per_token, const float* q, float* out, const int32_t* pos, int64_t n) {
  const int64_t d = like.q.ne[0], H = like.q.ne[1];
  // Small batches (decode) and tokens of their own sequences split each token's keys over k_am_splits
  // blocks and merge the partial states (the split geometry of a decode token, whatever the batch).
  const int S = per_token || n < k_am_min_tokens ? k_am_splits : 1;
  DSV4_ASSERT(n <= 0x7fffffff && H <= 65535 * 16, "attention: %lld tokens x %lld heads too many",
              static_cast<long long>(n), static_cast<long long>(H));
  DSV4_ASSERT(!per_token || n <= k_seq_tokens, "attention: %lld key sources", static_cast<long long>(n));
  // Staging row stride: the larger of the two row formats (multiples of 16 bytes).
  const int64_t stage_ld = std::max<int64_t>(like.ring.row_bytes(), like.comp ? like.comp.row_bytes() : 0);
  DSV4_ASSERT(stage_ld % 16 == 0, "attention: KV rows of %lld bytes", static_cast<long long>(stage_ld));
  float *part_acc = nullptr, *part_ml = nullptr;
  if (S > 1) {
    const size_t acc_floats = static_cast<size_t>(n) * H * S * d, ml_floats = static_cast<size_t>(n) * H * S * 2;
    part_acc = static_cast<float*>(ctx.scratch->get((acc_floats + ml_floats) * sizeof(float), ctx.stream));
    part_ml = part_acc + acc_floats;
  }
  auto go = [&](auto kernel, int MT, int terms) {
    const size_t smem = am_smem_bytes(MT, terms, d, stage_ld);
    allow_smem(kernel, smem);
    launch_kernel(kernel, dim3(static_cast<unsigned>(n), ceil_div(H, 16 * MT), static_cast<unsigned>(S)), k_am_threads,
                  smem, ctx.stream, out, part_acc, part_ml, q, srcs, per_token, pos, like.sinks.f32(),
                  static_cast<int>(H), like.scale, static_cast<int>(stage_ld));
    CUDA_CHECK_LAUNCH();
  };
  // bf16 terms of q and P: fewer than f32-exact only under `fast` (AttentionOp::fast, CudaContext::
  // fast_attention_terms) and for heads of 512 (DeepSeek V4's; the other widths keep one instantiation).
  const int terms = like.fast && d == 512 ? ctx.fast_attention_terms : k_am_terms;
  auto by_width = [&](auto mt) {
    constexpr int MT = decltype(mt)::value;
    if (d == 128)
      go(attention_mma_kernel<MT, 128, k_am_terms>, MT, k_am_terms);
    else if (d == 256)
      go(attention_mma_kernel<MT, 256, k_am_terms>, MT, k_am_terms);
    else if (terms == 1)
      go(attention_mma_kernel<MT, 512, 1>, MT, 1);
    else if (terms == 2)
      go(attention_mma_kernel<MT, 512, 2>, MT, 2);
    else
      go(attention_mma_kernel<MT, 512, k_am_terms>, MT, k_am_terms);
  };
  // MT = 2 (32 heads per block) for prefill batches: each key tile serves more heads. Decode (S > 1): MT = 1,
  // twice the blocks (Flash: 4 head groups x 16 splits = 64) with half the q staging and MMAs each.
  if (H >= 32 && S == 1)
    by_width(std::integral_constant<int, 2>{});
  else
    by_width(std::integral_constant<int, 1>{});
  if (S > 1) launch_attention_combine(ctx, out, part_acc, part_ml, like.sinks.f32(), n, static_cast<int>(H), S, d);
}

}  // namespace dsv4::cuda
