// Lightning-indexer scores and top-k selection (model-spec.md §5.6).
//
// indexer_scores: score[t, k] = sum_h w[t, h] * relu(q[t, h, :] · rows[k, :])
//   for k < visible = min((pos[t]+1) / ratio, cap_rows), -inf otherwise.
//   Grid (n, ceil(cap_rows / (8 * rpw))), 256 threads: a block covers 8 * rpw
//   rows of one query (rpw = 2 for one query, 8 for a batch). q[t] is staged in shared memory as [H_I][d_I + 4]
//   (16-byte rows; the pad puts the lanes' heads on distinct banks) with w[t]; each warp takes rpw rows: the row (F32
//   or compact KV_FP4, unpacked by cuda_kv_rows.cuh) goes to a per-warp shared buffer, lane l computes the full
//   d_I-long dots of heads l, l+32, ... (sequential fma), relu, weights, then a warp sum. Blocks entirely past
//   `visible` only write -inf. Batches of >= 8 queries with bf16-exact inputs (reference numerics) run
//   indexer_scores_mma_kernel instead: the dots as bf16 MMAs (see there). The
//   single-token sequences of a batched decode step share one launch, each
//   query with its own rows and scores (IxSeqs; topk likewise, TopkSeqs).
//   CPU reference: cpu::indexer_scores (cpu_attention.cpp).
//
// topk: per query, the min(K, visible) largest scores among rows < visible,
//   ties to the lower index, written in ascending index order, padded with -1.
//   One 512-thread block per query. Radix select on order-preserving 32-bit
//   keys of the floats (-0 folded onto +0 so that equal floats have equal
//   keys): 4 passes of 8 bits (a histogram, then a warp scan of its 256
//   bins) find the K-th largest key T and how many keys equal to T are
//   needed; a final pass in ascending index order (block-wide
//   exclusive scans) takes every key > T and the first `need` keys == T.
//   Exactly the CPU's selection for any input without NaN.
//   CPU reference: cpu::topk (cpu_attention.cpp).
#include <algorithm>

#include "backend/cuda/cuda_indexer.cuh"
#include "backend/cuda/cuda_kv_rows.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_seqs.cuh"

namespace dsv4::cuda {

namespace {

constexpr int k_ix_warps = 8;
// Rows per warp: 2 for a single query (decode: its visible rows spread over
// many SMs), 8 for batches (each block's staged q serves more rows). The
// mapping never changes a row's arithmetic.
constexpr int k_ix_rows_per_warp_decode = 2;
constexpr int k_ix_rows_per_warp_batch = 8;
constexpr int k_topk_threads = 512;

// Shared-memory layout of indexer_scores_kernel (floats): q [HI][ix_q_ld(dI)],
// w [HI], then the warps' row buffers [k_ix_warps][dI] from a 16-byte boundary.
// The q stride dI + 4 keeps rows 16-byte aligned and puts the 8 lanes of a
// quarter warp (heads l..l+7) on distinct bank groups for 16-byte loads.
__host__ __device__ constexpr int64_t ix_q_ld(int64_t dI) { return dI + 4; }
__host__ __device__ constexpr int64_t ix_row_buf_offset(int64_t HI, int64_t dI) {
  return (HI * ix_q_ld(dI) + HI + 3) / 4 * 4;
}

// Where query t's scores go and which rows it scores: one sequence's for every
// query (IxOne: scores [n, cap]), or a table entry per query (single-token
// sequences, launch_indexer_scores_seqs).
struct IxQuery {
  float* scores;  // [cap]
  int64_t cap;
  const void* rows;  // [cap, dI]
};
struct IxOne {
  float* scores;
  int64_t cap;
  const void* rows;
  __device__ IxQuery at(int64_t t) const { return {scores + t * cap, cap, rows}; }
};
struct IxSeqs {
  SeqTable<IxQuery> tab;
  __device__ const IxQuery& at(int64_t t) const { return tab.at[t]; }
};

// dI % 4 == 0 (launcher). A lane's heads l, l + 32 (the next two l + 64, ...)
// run as two interleaved chains, each the sequential fma over e = 0..dI-1
// with 16-byte shared loads; acc adds the heads in the order l, l + 32, ...
template <class Src>
__global__ void __launch_bounds__(256)
    indexer_scores_kernel(Src src, const float* q, const float* w, GgmlType rows_type, const int32_t* pos, int ratio,
                          int HI, int dI, int rows_per_warp) {
  pdl_enter();
  extern __shared__ __align__(16) float sm[];
  const int qld = static_cast<int>(ix_q_ld(dI));
  float* qs = sm;                              // [HI][qld]
  float* ws = qs + HI * qld;                   // [HI]
  float* rb = sm + ix_row_buf_offset(HI, dI);  // [warps][dI]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = blockIdx.x;
  const int k_ix_rows = k_ix_warps * rows_per_warp;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * k_ix_rows;
  const IxQuery& iq = src.at(t);
  const int64_t cap = iq.cap;
  const void* rows = iq.rows;
  const int64_t visible = min(static_cast<int64_t>((pos[t] + 1) / ratio), cap);
  const float neg_inf = -__int_as_float(0x7f800000);
  float* out = iq.scores;
  if (k0 >= visible) {
    for (int64_t i = threadIdx.x; i < k_ix_rows && k0 + i < cap; i += blockDim.x) out[k0 + i] = neg_inf;
    return;
  }
  const float4* qt = reinterpret_cast<const float4*>(q + t * HI * dI);
  const int d4 = dI / 4;
#pragma unroll 4
  for (int i = threadIdx.x; i < HI * d4; i += blockDim.x)
    reinterpret_cast<float4*>(qs + (i / d4) * qld)[i % d4] = qt[i];
  for (int i = threadIdx.x; i < HI; i += blockDim.x) ws[i] = w[t * HI + i];
  __syncthreads();
  float* row = rb + warp * dI;
  const float4* row4 = reinterpret_cast<const float4*>(row);
  for (int r = 0; r < rows_per_warp; ++r) {
    const int64_t k = k0 + warp * rows_per_warp + r;
    if (k >= cap) break;
    if (k >= visible) {
      if (lane == 0) out[k] = neg_inf;
      continue;
    }
    warp_load_kv_row(row, kv_row_ptr(rows, rows_type, dI, k), dI, rows_type);
    __syncwarp();
    float acc = 0.0f;
    for (int h0 = lane; h0 < HI; h0 += 64) {
      const int h1 = h0 + 32;
      const bool two = h1 < HI;
      const float4* qa = reinterpret_cast<const float4*>(qs + h0 * qld);
      const float4* qb = reinterpret_cast<const float4*>(qs + (two ? h1 : h0) * qld);
      float da = 0.0f, db = 0.0f;
#pragma unroll 4
      for (int e4 = 0; e4 < d4; ++e4) {
        const float4 x = row4[e4], a = qa[e4], b = qb[e4];
        da = fmaf(a.x, x.x, da);
        db = fmaf(b.x, x.x, db);
        da = fmaf(a.y, x.y, da);
        db = fmaf(b.y, x.y, db);
        da = fmaf(a.z, x.z, da);
        db = fmaf(b.z, x.z, db);
        da = fmaf(a.w, x.w, da);
        db = fmaf(b.w, x.w, db);
      }
      acc = fmaf(ws[h0], fmaxf(0.0f, da), acc);
      if (two) acc = fmaf(ws[h1], fmaxf(0.0f, db), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[k] = acc;
    __syncwarp();  // the row buffer is rewritten next
  }
}

// ---- Tensor-core scores for prefill batches (indexer_scores_mma_kernel).
// When q and the rows hold bf16-exact values (reference numerics: Hadamard +
// FP4 simulation; IndexerScoresOp::inputs_bf16), a token's dots for all heads
// are the matrix product S = Q R^T (Q [H_I, 128], R [rows, 128]) with exact
// bf16 operands and f32 accumulation: agreement with the FFMA kernel to f32
// rounding. Grid (n, ceil(cap / k_ixm_block_rows)), 256 threads; a block
// stages q[t] (bf16, heads padded to 16 MT with zeros) and w[t], then walks
// its rows in tiles of 64: warp w converts rows 8w..8w+7 to bf16 in shared
// memory, computes their 16 MT x 8 logits (MT m16 tiles x one n8 tile, 8
// k-steps), and forms sum_h w_h relu(S[h, row]) (the lane's heads, then a
// shuffle tree over the 8 lanes sharing a row). Rows >= visible: -inf.
constexpr int k_ixm_dim = 128;           // d_I (the only width this kernel takes)
constexpr int k_ixm_ld = k_ixm_dim + 8;  // bf16 row stride: 272 bytes (an odd multiple of 16)
constexpr int k_ixm_tile = 64;           // rows per tile (8 per warp)
constexpr int k_ixm_block_rows = 512;    // rows per block
constexpr int64_t k_ixm_min_tokens = 8;

// dst[0, 128) (bf16) = row (F32 or KV_FP4, bf16-exact values); one warp, lane l: dims 4l..4l+3.
__device__ __forceinline__ void warp_row_to_bf16(uint16_t* dst, const uint8_t* src, GgmlType type) {
  const int lane = threadIdx.x & 31;
  float v[4];
  if (type == GgmlType::KV_FP4) {
    const uint16_t c = reinterpret_cast<const uint16_t*>(src)[lane];  // dims 4l..4l+3 (nibbles, low first)
    const float s = kv_scale_value(src[kv_fp4_scale_offset(k_ixm_dim) + (4 * lane) / k_kv_fp4_block]);
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = kv_e2m1_value(static_cast<uint8_t>((c >> (4 * i)) & 15u)) * s;
  } else {
    const float4 f = reinterpret_cast<const float4*>(src)[lane];
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  }
  *reinterpret_cast<uint2*>(dst + 4 * lane) = make_uint2(pack_bf16x2(v[0], v[1]), pack_bf16x2(v[2], v[3]));
}

template <int MT>
__global__ void __launch_bounds__(256)
    indexer_scores_mma_kernel(float* scores, int64_t cap, const float* q, const float* w, const void* rows,
                              GgmlType rows_type, const int32_t* pos, int ratio, int HI) {
  pdl_enter();
  constexpr int HP = 16 * MT;  // padded heads
  __shared__ __align__(16) uint16_t qs[HP * k_ixm_ld];
  __shared__ __align__(16) uint16_t ks[k_ixm_tile * k_ixm_ld];
  __shared__ float ws[HP];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t t = blockIdx.x;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * k_ixm_block_rows;
  const int64_t k_end = min(cap, k_begin + k_ixm_block_rows);
  const int64_t visible = min(static_cast<int64_t>((pos[t] + 1) / ratio), cap);
  const float neg_inf = -__int_as_float(0x7f800000);
  float* out = scores + t * cap;
  for (int64_t k = max(k_begin, visible) + threadIdx.x; k < k_end; k += blockDim.x) out[k] = neg_inf;
  if (k_begin >= visible) return;
  for (int i = threadIdx.x; i < HP * k_ixm_dim / 4; i += blockDim.x) {
    const int h = (4 * i) / k_ixm_dim, e = 4 * i - h * k_ixm_dim;
    const float4 f =
        h < HI ? *reinterpret_cast<const float4*>(q + (t * HI + h) * k_ixm_dim + e) : make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<uint2*>(qs + h * k_ixm_ld + e) = make_uint2(pack_bf16x2(f.x, f.y), pack_bf16x2(f.z, f.w));
  }
  for (int h = threadIdx.x; h < HP; h += blockDim.x) ws[h] = h < HI ? w[t * HI + h] : 0.0f;
  const int64_t k_stop = min(k_end, visible);
  for (int64_t k0 = k_begin; k0 < k_stop; k0 += k_ixm_tile) {
    __syncthreads();  // q staged / the previous tile's rows consumed
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int j = 8 * warp + r;
      const int64_t k = k0 + j;
      if (k < k_stop) {
        warp_row_to_bf16(ks + j * k_ixm_ld, kv_row_ptr(rows, rows_type, k_ixm_dim, k), rows_type);
      } else {
        *reinterpret_cast<uint2*>(ks + j * k_ixm_ld + 4 * lane) = make_uint2(0u, 0u);
      }
    }
    __syncwarp();  // a warp reads only its own 8 rows
    float acc[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[m][c] = 0.0f;
    const uint16_t* kb = ks + (8 * warp + (lane & 7)) * k_ixm_ld + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < k_ixm_dim; kk += 16) {
      uint32_t b[2];
      ldsm_x2(b, kb + kk);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        uint32_t a[4];
        ldsm_x4(a, qs + (16 * m + (lane & 15)) * k_ixm_ld + kk + (lane >> 4) * 8);
        mma_bf16_16816(acc[m], a, b[0], b[1]);
      }
    }
    // Lane (g, tq): heads 16m + g (c0, c1) and 16m + g + 8 (c2, c3) of rows 2tq, 2tq + 1.
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      const float w_lo = ws[16 * m + g], w_hi = ws[16 * m + g + 8];
      s0 = fmaf(w_lo, fmaxf(0.0f, acc[m][0]), s0);
      s1 = fmaf(w_lo, fmaxf(0.0f, acc[m][1]), s1);
      s0 = fmaf(w_hi, fmaxf(0.0f, acc[m][2]), s0);
      s1 = fmaf(w_hi, fmaxf(0.0f, acc[m][3]), s1);
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      s0 += __shfl_xor_sync(k_full_mask, s0, o);
      s1 += __shfl_xor_sync(k_full_mask, s1, o);
    }
    if (g == 0) {
      const int64_t k = k0 + 8 * warp + 2 * tq;
      if (k < k_stop) out[k] = s0;
      if (k + 1 < k_stop) out[k + 1] = s1;
    }
  }
}

// Exclusive prefix sum over the block (blockDim.x a multiple of 32, <= 1024);
// *total receives the block sum. `buf`: 32 ints of shared memory. Block-uniform.
__device__ int block_exclusive_scan(int v, int* buf, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(k_full_mask, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) buf[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int s = lane < n_warps ? buf[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(k_full_mask, s, o);
      if (lane >= o) s += y;
    }
    buf[lane] = s;  // inclusive warp totals
  }
  __syncthreads();
  const int offset = warp > 0 ? buf[warp - 1] : 0;
  *total = buf[n_warps - 1];
  __syncthreads();
  return offset + incl - v;
}

// Query t's scores: row t of one [n, cap] (TopkOne) or a table entry per query (TopkSeqs).
struct TopkQuery {
  const float* scores;
  int64_t cap;
};
struct TopkOne {
  const float* scores;
  int64_t cap;
  __device__ TopkQuery at(int64_t t) const { return {scores + t * cap, cap}; }
};
struct TopkSeqs {
  SeqTable<TopkQuery> tab;
  __device__ const TopkQuery& at(int64_t t) const { return tab.at[t]; }
};

template <class Src>
__global__ void __launch_bounds__(k_topk_threads)
    topk_kernel(int32_t* sel, int64_t K, Src src, const int32_t* pos, int ratio) {
  pdl_enter();
  __shared__ unsigned hist[256];
  __shared__ unsigned s_digit, s_remaining;
  __shared__ int scan_buf[32];
  const int64_t t = blockIdx.x;
  const TopkQuery tq = src.at(t);
  const int64_t visible = min(static_cast<int64_t>((pos[t] + 1) / ratio), tq.cap);
  int32_t* out = sel + t * K;
  const float* s = tq.scores;
  if (visible <= K) {
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x) out[i] = i < visible ? static_cast<int32_t>(i) : -1;
    return;
  }
  uint32_t prefix = 0, mask = 0;
  unsigned remaining = static_cast<unsigned>(K);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < visible; i += blockDim.x) {
      const uint32_t key = float_key(s[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // The digit: the largest bin b with (count of keys in bins > b) < remaining <=
      // (count in bins >= b). Lane l holds bins 255 - 8l .. 248 - 8l (descending);
      // a warp scan gives each lane the count above its bins, the first lane whose
      // inclusive count reaches `remaining` walks its 8 bins (a serial walk over
      // up to 256 bins by one thread was ~4 us per pass).
      const int lane = static_cast<int>(threadIdx.x);
      unsigned c[8], tot = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        c[j] = hist[255 - 8 * lane - j];
        tot += c[j];
      }
      unsigned incl = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned v = __shfl_up_sync(k_full_mask, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned hit =
          __ballot_sync(k_full_mask, incl >= remaining);  // nonempty: the prefix's keys number >= remaining
      if (lane == __ffs(static_cast<int>(hit)) - 1) {
        unsigned cum = incl - tot;
        for (int j = 0; j < 8; ++j) {
          if (cum + c[j] >= remaining) {
            s_digit = static_cast<unsigned>(255 - 8 * lane - j);
            s_remaining = remaining - cum;
            break;
          }
          cum += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= s_digit << shift;
    mask |= 255u << shift;
    remaining = s_remaining;
    __syncthreads();
  }
  // prefix = the K-th largest key; take all larger keys and the first `remaining` equal ones.
  const int need = static_cast<int>(remaining);
  int base_eq = 0, base_take = 0;
  for (int64_t c0 = 0; c0 < visible; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const uint32_t key = i < visible ? float_key(s[i]) : 0u;
    const bool valid = i < visible;
    const int gt = valid && key > prefix;
    const int eq = valid && key == prefix;
    int tot_eq, tot_take;
    const int eq_rank = base_eq + block_exclusive_scan(eq, scan_buf, &tot_eq);
    const int take = gt || (eq && eq_rank < need);
    const int at = base_take + block_exclusive_scan(take, scan_buf, &tot_take);
    if (take) out[at] = static_cast<int32_t>(i);
    base_eq += tot_eq;
    base_take += tot_take;
  }
}

}  // namespace

void launch_indexer_scores(const CudaContext& ctx, const IndexerScoresOp& op) {
  const int64_t dI = op.q.ne[0], HI = op.q.ne[1], n = op.q.ne[2];
  const int64_t cap = op.rows.n_rows();
  DSV4_ASSERT(op.scores.ne[0] == cap && op.scores.n_rows() == n, "indexer_scores: shape");
  DSV4_ASSERT(op.rows.ne[0] == dI && op.w.ne[0] == HI, "indexer_scores: row/weight widths");
  DSV4_ASSERT(op.ratio >= 1, "indexer_scores: ratio %d", op.ratio);
  check_kv_rows(op.rows, "indexer_scores");
  DSV4_ASSERT(op.rows.type != GgmlType::KV_FP8, "indexer_scores: KV_FP8 rows need 16-byte aligned staging");
  if (n == 0 || cap == 0) return;
  const bool exact_rows = op.rows.type == GgmlType::KV_FP4 || op.rows.type == GgmlType::F32;
  if (ctx.tensor_cores && op.inputs_bf16 && exact_rows && n >= k_ixm_min_tokens && dI == k_ixm_dim && HI <= 64) {
    DSV4_ASSERT(n <= 0x7fffffff && (cap + k_ixm_block_rows - 1) / k_ixm_block_rows <= 65535,
                "indexer_scores: %lld x %lld scores too many", static_cast<long long>(n), static_cast<long long>(cap));
    const dim3 grid(static_cast<unsigned>(n), ceil_div(cap, k_ixm_block_rows));
    auto go = [&](auto kernel) {
      launch_kernel(kernel, grid, 256, 0, ctx.stream, op.scores.f32(), cap, op.q.f32(), op.w.f32(), op.rows.data,
                    op.rows.type, op.pos.i32(), op.ratio, static_cast<int>(HI));
      CUDA_CHECK_LAUNCH();
    };
    const int64_t mt = (HI + 15) / 16;
    if (mt == 1)
      go(indexer_scores_mma_kernel<1>);
    else if (mt == 2)
      go(indexer_scores_mma_kernel<2>);
    else if (mt == 3)
      go(indexer_scores_mma_kernel<3>);
    else
      go(indexer_scores_mma_kernel<4>);
    return;
  }
  const int rpw = n == 1 ? k_ix_rows_per_warp_decode : k_ix_rows_per_warp_batch, k_ix_rows = k_ix_warps * rpw;
  DSV4_ASSERT(n <= 0x7fffffff && (cap + k_ix_rows - 1) / k_ix_rows <= 65535,
              "indexer_scores: %lld x %lld scores too many", static_cast<long long>(n), static_cast<long long>(cap));
  DSV4_ASSERT(dI % 4 == 0, "indexer_scores: index head width %lld is not a multiple of 4", static_cast<long long>(dI));
  const size_t smem = static_cast<size_t>(ix_row_buf_offset(HI, dI) + k_ix_warps * dI) * sizeof(float);
  DSV4_ASSERT(smem <= 200 * 1024, "indexer_scores: %lld heads x %lld dims exceed shared memory",
              static_cast<long long>(HI), static_cast<long long>(dI));
  allow_smem(indexer_scores_kernel<IxOne>, smem);
  launch_kernel(indexer_scores_kernel<IxOne>, dim3(static_cast<unsigned>(n), ceil_div(cap, k_ix_rows)), 256, smem,
                ctx.stream, IxOne{op.scores.f32(), cap, op.rows.data}, op.q.f32(), op.w.f32(), op.rows.type,
                op.pos.i32(), op.ratio, static_cast<int>(HI), static_cast<int>(dI), rpw);
  CUDA_CHECK_LAUNCH();
}

void launch_indexer_scores_seqs(const CudaContext& ctx, std::span<const IndexerScoresOp> ops) {
  // Single queries on the FFMA kernel (the MMA kernel takes batches of >= k_ixm_min_tokens).
  auto fits = [](const IndexerScoresOp& op, const IndexerScoresOp& first, size_t k) {
    return op.q.ne[2] == 1 && op.q.ne[0] == first.q.ne[0] && op.q.ne[1] == first.q.ne[1] &&
           op.rows.type == first.rows.type && op.ratio == first.ratio && op.scores.ne[0] == op.rows.n_rows() &&
           op.rows.ne[0] == op.q.ne[0] && op.w.ne[0] == op.q.ne[1] && op.rows.n_rows() > 0 &&
           rows_follow(first.q, op.q, k, first.q.row_bytes() * static_cast<size_t>(first.q.ne[1])) &&
           rows_follow(first.w, op.w, k, first.w.row_bytes()) && rows_follow(first.pos, op.pos, k, sizeof(int32_t));
  };
  auto batch = [&](std::span<const IndexerScoresOp> run) {
    const IndexerScoresOp& first = run.front();
    const int64_t dI = first.q.ne[0], HI = first.q.ne[1];
    check_kv_rows(first.rows, "indexer_scores");
    DSV4_ASSERT(first.rows.type != GgmlType::KV_FP8, "indexer_scores: KV_FP8 rows need 16-byte aligned staging");
    DSV4_ASSERT(dI % 4 == 0, "indexer_scores: index head width %lld is not a multiple of 4",
                static_cast<long long>(dI));
    IxSeqs src{};
    int64_t max_cap = 0;
    for (size_t j = 0; j < run.size(); ++j) {
      src.tab.at[j] = {run[j].scores.f32(), run[j].rows.n_rows(), run[j].rows.data};
      max_cap = std::max(max_cap, run[j].rows.n_rows());
    }
    const int rpw = k_ix_rows_per_warp_decode, k_ix_rows = k_ix_warps * rpw;
    DSV4_ASSERT((max_cap + k_ix_rows - 1) / k_ix_rows <= 65535, "indexer_scores: %lld rows too many",
                static_cast<long long>(max_cap));
    const size_t smem = static_cast<size_t>(ix_row_buf_offset(HI, dI) + k_ix_warps * dI) * sizeof(float);
    DSV4_ASSERT(smem <= 200 * 1024, "indexer_scores: %lld heads x %lld dims exceed shared memory",
                static_cast<long long>(HI), static_cast<long long>(dI));
    allow_smem(indexer_scores_kernel<IxSeqs>, smem);
    launch_kernel(indexer_scores_kernel<IxSeqs>, dim3(static_cast<unsigned>(run.size()), ceil_div(max_cap, k_ix_rows)),
                  256, smem, ctx.stream, src, first.q.f32(), first.w.f32(), first.rows.type, first.pos.i32(),
                  first.ratio, static_cast<int>(HI), static_cast<int>(dI), rpw);
    CUDA_CHECK_LAUNCH();
  };
  seq_runs(ops, fits, batch, [&](const IndexerScoresOp& op) { launch_indexer_scores(ctx, op); });
}

void launch_topk(const CudaContext& ctx, const TopKOp& op) {
  const int64_t K = op.sel.ne[0], n = op.sel.n_rows(), cap = op.scores.ne[0];
  DSV4_ASSERT(op.scores.n_rows() >= n, "topk: scores hold fewer rows than the selection");
  DSV4_ASSERT(op.ratio >= 1, "topk: ratio %d", op.ratio);
  DSV4_ASSERT(cap < 0x7fffffff, "topk: too many rows");
  if (n == 0 || K == 0) return;
  DSV4_ASSERT(n <= 0x7fffffff, "topk: too many queries");
  launch_kernel(topk_kernel<TopkOne>, static_cast<unsigned>(n), k_topk_threads, 0, ctx.stream, op.sel.i32(), K,
                TopkOne{op.scores.f32(), cap}, op.pos.i32(), op.ratio);
  CUDA_CHECK_LAUNCH();
}

void launch_topk_seqs(const CudaContext& ctx, std::span<const TopKOp> ops) {
  auto fits = [](const TopKOp& op, const TopKOp& first, size_t k) {
    return op.sel.n_rows() == 1 && op.sel.ne[0] == first.sel.ne[0] && op.ratio == first.ratio &&
           op.scores.n_rows() >= 1 && op.scores.ne[0] < 0x7fffffff &&
           rows_follow(first.sel, op.sel, k, first.sel.row_bytes()) &&
           rows_follow(first.pos, op.pos, k, sizeof(int32_t));
  };
  auto batch = [&](std::span<const TopKOp> run) {
    const TopKOp& first = run.front();
    DSV4_ASSERT(first.ratio >= 1, "topk: ratio %d", first.ratio);
    const int64_t K = first.sel.ne[0];
    if (K == 0) return;
    TopkSeqs src{};
    for (size_t j = 0; j < run.size(); ++j) src.tab.at[j] = {run[j].scores.f32(), run[j].scores.ne[0]};
    launch_kernel(topk_kernel<TopkSeqs>, static_cast<unsigned>(run.size()), k_topk_threads, 0, ctx.stream,
                  first.sel.i32(), K, src, first.pos.i32(), first.ratio);
    CUDA_CHECK_LAUNCH();
  };
  seq_runs(ops, fits, batch, [&](const TopKOp& op) { launch_topk(ctx, op); });
}

}  // namespace dsv4::cuda
