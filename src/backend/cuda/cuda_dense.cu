// Dense element/row kernels: RMSNorm, RoPE, quantisation simulations, ring
// stores, SwiGLU, add, scale, fill.
//
//   rms_norm    rows of d <= 1024: one warp per row (8 per block), double sum
//               of squares, warp tree; longer rows: one block per row (128
//               threads, 256 for d >= 2048), fixed-order block tree; then x*r*w;
//               optionally (RmsNormOp::rope_pos) RoPE on the row afterwards.
//               CPU reference: cpu::rms_norm / rms_norm_row (cpu_dense.cpp).
//   rope        one thread per rotated pair; pos[t] read from device memory.
//               CPU reference: cpu::rope / rope_row.
//   quant_sim   one block per row (FP8: a warp per 64-block; Hadamard: in-place
//               butterflies with barriers, then a warp per 32-block); Hadamard
//               rows of 64..1024: one warp per row in registers, butterflies by
//               shuffles. Bit-exact with cpu::quant_sim_row.
//   store_rows  one block per token: ring[pos[t] % cap] = rows[t], packed
//               when the ring is compact (cuda_kv_rows.cuh); a later token of
//               the batch with the same slot wins (sequential semantics of
//               cpu::store_rows).
//   swiglu/add/scale/fill: grid-stride element loops (cpu::swiglu, CpuBackend::add/scale/fill).
//   Activation quantisation (ActQuantOp, core/act_quant.h): one warp per block
//   of a row; RmsNormOp::quant and SwigluOp::quant (INT8_32) inside the norm /
//   SwiGLU kernel, whose warps hold whole 32-value blocks (one launch fewer per
//   quantised input of `fast` numerics); other formats by a launch after it.
#include <algorithm>

#include "backend/cuda/cuda_dense.cuh"
#include "backend/cuda/cuda_kv_rows.cuh"
#include "backend/cuda/cuda_rowops.cuh"
#include "backend/cuda/cuda_seqs.cuh"

namespace dsv4::cuda {

RopeTable make_rope_table(const RopeParams& p) {
  DSV4_ASSERT(p.n_rot >= 0 && p.n_rot % 2 == 0 && p.n_rot / 2 <= RopeTable::k_max_pairs, "rope: n_rot %d unsupported",
              p.n_rot);
  RopeTable t;
  t.n_rot = p.n_rot;
  rope_frequencies(p, t.omega);
  return t;
}

namespace {

unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>((n + threads - 1) / threads, 1), 65536));
}

// With rope_pos: the block then rotates its row's RoPE tail (rope_kernel's
// rope_pair, pos of the row's token), after a barrier that makes the normed
// row visible to the whole block. Rows of up to k_norm_reg * blockDim.x (every
// decode norm): the weight (a constant) is loaded before pdl_enter and the
// position with the row, so neither adds a round trip to the chain
// (block_rms_norm_row's register path, the same operations).
__global__ void rms_norm_kernel(float* out, const float* x, const float* w, int64_t d, float eps,
                                const int32_t* rope_pos, int64_t per_tok, RopeTable rt, float* q8) {
  __shared__ double red[33];
  const int64_t r = blockIdx.x, nt = blockDim.x;
  int32_t pos = 0;
  if (d <= k_norm_reg * nt) {
    float v[k_norm_reg], wv[k_norm_reg];
#pragma unroll
    for (int k = 0; k < k_norm_reg; ++k) {
      const int64_t i = threadIdx.x + k * nt;
      wv[k] = (w && i < d) ? w[i] : 1.0f;
    }
    pdl_enter();
    if (rope_pos) pos = rope_pos[r / per_tok];
#pragma unroll
    for (int k = 0; k < k_norm_reg; ++k) {
      const int64_t i = threadIdx.x + k * nt;
      v[k] = i < d ? x[r * d + i] : 0.0f;
    }
    block_rms_norm_regs(out + r * d, v, wv, w != nullptr, d, eps, red, q8 ? q8 + r * d : nullptr);
  } else {
    pdl_enter();
    block_rms_norm_row(out + r * d, x + r * d, w, d, eps, red, q8 ? q8 + r * d : nullptr);
    if (rope_pos) pos = rope_pos[r / per_tok];
  }
  if (rope_pos) {
    __syncthreads();
    for (int j = threadIdx.x; j < rt.n_rot / 2; j += blockDim.x)
      rope_pair(out + r * d + (d - rt.n_rot), j, rt.omega[j], pos, false);
  }
}

// Rows of d <= 32 K (K = 16 or 32: every norm of a V4 layer, d = 512 or 1024):
// one warp per row, 8 rows per 256-thread block. Lane l owns elements l + 32 k
// (coalesced 128-byte loads, all in flight) and sums their squares in that
// order; the warp's double tree sum (warp_sum_double), no block barrier. The
// same float operations as the block path but for the order of the double sum
// of squares (practically never visible in the float r; the kernel is picked
// by d alone, so results never depend on the row count). A 2,048-token batch's
// q head norms (131,072 rows of 512) as one 128-thread block per row read at
// 1.1 TB/s (ncu, H200). q8: as block_rms_norm_regs (element l + 32 k of each
// lane: block k of the row is the warp's register k).
template <int K>
__global__ void __launch_bounds__(256)
    rms_norm_warp_kernel(float* out, const float* x, const float* w, int64_t rows, int64_t d, float eps,
                         const int32_t* rope_pos, int64_t per_tok, RopeTable rt, float* q8) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  float v[K], wv[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t i = lane + 32 * k;
    wv[k] = (w && i < d) ? w[i] : 1.0f;  // a constant: before pdl_enter
  }
  pdl_enter();
  if (r >= rows) return;  // whole warps: the shuffles below see all 32 lanes
  const int32_t pos = rope_pos ? rope_pos[r / per_tok] : 0;
  const float* xr = x + r * d;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t i = lane + 32 * k;
    v[k] = i < d ? xr[i] : 0.0f;
  }
  double ss = 0.0;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < d) ss += static_cast<double>(v[k]) * static_cast<double>(v[k]);
  ss = __shfl_sync(k_full_mask, warp_sum_double(ss),
                   0);  // also orders every read of x before the writes (out may alias x)
  const float rs = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
  float* o = out + r * d;
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = w ? __fmul_rn(__fmul_rn(v[k], rs), wv[k]) : __fmul_rn(v[k], rs);
  store_normed_regs(o, q8 ? q8 + r * d : nullptr, v, d, [&](int k) { return lane + 32 * k; });
  if (rope_pos) {
    __syncwarp();  // the normed row visible to the whole warp
    for (int j = lane; j < rt.n_rot / 2; j += 32) rope_pair(o + (d - rt.n_rot), j, rt.omega[j], pos, false);
  }
}

__global__ void rope_kernel(float* x, const int32_t* pos, int64_t d, int64_t per_tok, int64_t n_pairs_total,
                            RopeTable rt, bool inverse) {
  pdl_enter();
  const int half = rt.n_rot / 2;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_pairs_total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / half;
    const int j = static_cast<int>(i % half);
    rope_pair(x + r * d + (d - rt.n_rot), j, rt.omega[j], pos[r / per_tok], inverse);
  }
}

__global__ void quant_sim_kernel(float* x, int64_t d, KvQuantSim sim, int n_quant) {
  pdl_enter();
  block_quant_sim_row(x + static_cast<int64_t>(blockIdx.x) * d, d, sim, n_quant);
}

// ActQuantOp (core/act_quant.h): one warp per block of B values of a row of d
// (a row's last block may be shorter), B / 32 values per lane. amax = max(1e-4,
// |x_i|) by shuffles (fmaxf drops NaN as the host's std::max keeps its left
// operand); an infinite amax makes the block NaN. Per value the host's
// operations in its order (act_quant_row): bit-identical.
template <int B>
__global__ void __launch_bounds__(256)
    act_quant_kernel(float* out, const float* x, int64_t d, int64_t blocks_per_row, int64_t n_blocks, bool int8) {
  constexpr int per = B / 32;
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (blk >= n_blocks) return;  // whole warps
  const int64_t r = blk / blocks_per_row, b0 = blk % blocks_per_row * B;
  const int64_t nb = d - b0 < B ? d - b0 : B;
  const float* xb = x + r * d + b0;
  float* ob = out + r * d + b0;
  float v[per];
  float amax = 1e-4f;
#pragma unroll
  for (int j = 0; j < per; ++j) {
    const int i = j * 32 + lane;
    v[j] = i < nb ? xb[i] : 0.0f;
    if (i < nb) amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = warp_max_all(amax);
#pragma unroll
  for (int j = 0; j < per; ++j) {
    const int i = j * 32 + lane;
    if (i < nb) ob[i] = act_quant_value_dev(v[j], amax, int8);
  }
}

// HADAMARD_FP4 rows of d = 32 E (E = 2..32, a power of two; V4's indexer heads:
// d = 128): one warp per row, 8 rows per block, the row in registers — lane l
// holds x[E l, E l + E) (16-byte loads). Butterflies of stride h < E inside a
// lane; h >= E between lanes l and l ^ (h / E) by a shuffle, the lower lane
// keeping a + b and the upper a - b; then * 1/sqrt(d) and the FP4 blocks of 32
// (32 / E lanes: amax by shuffles inside the group). The same operations in the
// same order as block_hadamard_fp4_row (bit-identical; fmaxf is order-free),
// without its log2(d) block barriers on a row in global memory (a 2,048-token
// batch's 131,072 rows of 128 took 280 us per call at 0.38 TB/s; ncu, H200).
template <int E>
__global__ void __launch_bounds__(256) hadamard_fp4_warp_kernel(float* x, int64_t rows) {
  static_assert(E >= 2 && E <= 32 && (E & (E - 1)) == 0, "E: a power of two in 2..32");
  constexpr int d = 32 * E;
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (r >= rows) return;  // whole warps: the shuffles below see all 32 lanes
  float* xr = x + r * d + E * lane;
  float v[E];
  if constexpr (E % 4 == 0) {
#pragma unroll
    for (int j = 0; j < E; j += 4) {
      const float4 q = *reinterpret_cast<const float4*>(xr + j);
      v[j] = q.x, v[j + 1] = q.y, v[j + 2] = q.z, v[j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j) v[j] = xr[j];
  }
#pragma unroll
  for (int h = 1; h < E; h *= 2)
#pragma unroll
    for (int j = 0; j < E; ++j)
      if ((j & h) == 0) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
#pragma unroll
  for (int m = 1; m < 32; m *= 2)  // stride h = E m
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const float o = __shfl_xor_sync(k_full_mask, v[j], m);
      v[j] = (lane & m) ? o - v[j] : v[j] + o;  // upper: a - b with a the lower lane's; lower: a + b
    }
  const float s = 1.0f / sqrtf(static_cast<float>(d));
  float amax = 6.0f * 0x1p-126f;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    v[j] = __fmul_rn(v[j], s);
    amax = fmaxf(amax, fabsf(v[j]));
  }
#pragma unroll
  for (int m = 1; m < 32 / E; m *= 2) amax = fmaxf(amax, __shfl_xor_sync(k_full_mask, amax, m));
  const float scale = pow2_ceil_dev(amax / k_fp4_max_dev);
#pragma unroll
  for (int j = 0; j < E; ++j)
    v[j] = bf16_round_dev(__fmul_rn(fp4_e2m1_round_dev(clamp_dev(v[j] / scale, -k_fp4_max_dev, k_fp4_max_dev)), scale));
  if constexpr (E % 4 == 0) {
#pragma unroll
    for (int j = 0; j < E; j += 4) *reinterpret_cast<float4*>(xr + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j) xr[j] = v[j];
  }
}

__global__ void store_rows_kernel(void* ring, GgmlType type, const float* rows, const int32_t* pos, int64_t n,
                                  int64_t d, int64_t cap) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int64_t slot = pos[t] % cap;
  // Sequential semantics: skip when a later token of the batch writes the same slot.
  int later = 0;
  for (int64_t u = t + 1 + threadIdx.x; u < n; u += blockDim.x) later |= (pos[u] % cap) == slot;
  if (__syncthreads_or(later)) return;
  block_store_kv_row(kv_row_ptr(ring, type, d, slot), rows + t * d, d, type);
}

// One token per sequence (launch_store_rows_seqs): token t of the launch into
// the ring of table entry t.
struct StoreRowsSeq {
  void* ring;
  int64_t cap;
};
__global__ void store_rows_seqs_kernel(SeqTable<StoreRowsSeq> tab, GgmlType type, const float* rows, const int32_t* pos,
                                       int64_t d) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const StoreRowsSeq s = tab.at[t];
  block_store_kv_row(kv_row_ptr(s.ring, type, d, pos[t] % s.cap), rows + t * d, d, type);
}

// q8 (SwigluOp::quant INT8_32 with rows of whole 32-value blocks, so n % 32 == 0):
// every warp steps through aligned 32-value blocks together and quantises its
// block (warp_int8_32_quant: bit-identical with an ActQuantOp over out).
__global__ void swiglu_kernel(float* out, const float* g, const float* u, int64_t n, float c, bool q8) {
  pdl_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gt = c < g[i] ? c : g[i];  // std::min(g, c)
    const float up = clamp_dev(u[i], -c, c);
    const float h = __fmul_rn(__fmul_rn(gt, sigmoid_dev(gt)), up);
    out[i] = q8 ? warp_int8_32_quant(h) : h;
  }
}

__global__ void add_kernel(float* out, const float* x, int64_t n) {
  pdl_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] += x[i];
}

__global__ void scale_kernel(float* x, int64_t n, float s) {
  pdl_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}

__global__ void fill_kernel(float* x, int64_t n, float v) {
  pdl_enter();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = v;
}

}  // namespace

void launch_rms_norm(const CudaContext& ctx, const RmsNormOp& op) {
  const int64_t d = op.x.ne[0], rows = op.x.n_rows();
  DSV4_ASSERT(op.out.ne[0] == d && op.out.n_rows() == rows, "rms_norm: shape mismatch");
  DSV4_ASSERT(!op.w || op.w.ne[0] == d, "rms_norm: weight length %lld != %lld", static_cast<long long>(op.w.ne[0]),
              static_cast<long long>(d));
  DSV4_ASSERT(rows <= 0x7fffffff, "rms_norm: too many rows");
  if (rows == 0) return;
  RopeTable rt;
  const int64_t per_tok = op.rope_rows_per_token;
  if (op.rope_pos) {
    DSV4_ASSERT(per_tok >= 1 && rows % per_tok == 0 && op.rope_pos.ne[0] == rows / per_tok,
                "rms_norm: RoPE positions for %lld rows of %lld per token", static_cast<long long>(rows),
                static_cast<long long>(per_tok));
    DSV4_ASSERT(op.rope.n_rot <= d && op.rope.n_rot % 2 == 0, "rms_norm: bad RoPE n_rot");
    rt = make_rope_table(op.rope);
  }
  Tensor q = op.q ? op.q : op.out;
  DSV4_ASSERT(op.quant == ActQuant::NONE || (q.ne[0] == d && q.n_rows() == rows), "rms_norm: quantised output shape");
  // INT8_32 without RoPE in the norm's own kernel (ctx.fuse_act_quant_norms) for rows it holds in registers;
  // otherwise an act_quant launch after it.
  const int threads = d >= 2048 ? 256 : 128;  // the block kernel's: a function of d only (never of the row count)
  const bool regs = d <= 32 * 32 || d <= k_norm_reg * threads;
  float* q8 = op.quant == ActQuant::INT8_32 && !op.rope_pos && regs && ctx.fuse_act_quant_norms ? q.f32() : nullptr;
  if (d <= 32 * 32) {  // one warp per row (a function of d only, like the block size below)
    const unsigned grid = static_cast<unsigned>((rows + 7) / 8);
    auto launch = [&](auto kernel) {
      launch_kernel(kernel, grid, 256, 0, ctx.stream, op.out.f32(), op.x.f32(), op.w ? op.w.f32() : nullptr, rows, d,
                    op.eps, op.rope_pos ? op.rope_pos.i32() : nullptr, per_tok, rt, q8);
    };
    if (d <= 32 * 16)
      launch(rms_norm_warp_kernel<16>);
    else
      launch(rms_norm_warp_kernel<32>);
  } else {
    launch_kernel(rms_norm_kernel, static_cast<unsigned>(rows), threads, 0, ctx.stream, op.out.f32(), op.x.f32(),
                  op.w ? op.w.f32() : nullptr, d, op.eps, op.rope_pos ? op.rope_pos.i32() : nullptr, per_tok, rt, q8);
  }
  CUDA_CHECK_LAUNCH();
  if (op.quant != ActQuant::NONE && !q8) launch_act_quant(ctx.stream, q.f32(), op.out.f32(), d, rows, op.quant);
}

void launch_rope(const CudaContext& ctx, const RopeOp& op) {
  const int64_t d = op.x.ne[0], per_tok = op.x.ne[1], n = op.x.ne[2] * op.x.ne[3];
  DSV4_ASSERT(op.pos.ne[0] == n, "rope: %lld positions for %lld tokens", static_cast<long long>(op.pos.ne[0]),
              static_cast<long long>(n));
  DSV4_ASSERT(op.rope.n_rot <= d && op.rope.n_rot % 2 == 0, "rope: bad n_rot");
  const RopeTable rt = make_rope_table(op.rope);
  const int64_t total = n * per_tok * (rt.n_rot / 2);
  if (total == 0) return;
  launch_kernel(rope_kernel, grid_for(total, 256), 256, 0, ctx.stream, op.x.f32(), op.pos.i32(), d, per_tok, total, rt,
                op.inverse);
  CUDA_CHECK_LAUNCH();
}

void launch_act_quant(cudaStream_t stream, float* out, const float* x, int64_t d, int64_t rows, ActQuant q) {
  const int B = act_quant_block(q);
  if (B == 0) {
    if (out != x && rows * d > 0)
      CUDA_CHECK(
          cudaMemcpyAsync(out, x, static_cast<size_t>(rows * d) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const int64_t per_row = (d + B - 1) / B, n_blocks = rows * per_row;
  if (n_blocks == 0) return;
  const int64_t grid = (n_blocks + 7) / 8;  // 8 warps per block
  DSV4_ASSERT(grid <= 0x7fffffff, "act_quant: %lld rows of %lld", static_cast<long long>(rows),
              static_cast<long long>(d));
  if (B == 128)
    launch_kernel(act_quant_kernel<128>, static_cast<unsigned>(grid), 256, 0, stream, out, x, d, per_row, n_blocks,
                  q == ActQuant::INT8_32);
  else
    launch_kernel(act_quant_kernel<32>, static_cast<unsigned>(grid), 256, 0, stream, out, x, d, per_row, n_blocks,
                  q == ActQuant::INT8_32);
  CUDA_CHECK_LAUNCH();
}

void launch_act_quant(const CudaContext& ctx, const ActQuantOp& op) {
  const int64_t d = op.x.ne[0], rows = op.x.n_rows();
  DSV4_ASSERT(op.out.ne[0] == d && op.out.n_rows() == rows, "act_quant: shapes");
  launch_act_quant(ctx.stream, op.out.f32(), op.x.f32(), d, rows, op.quant);
}

void launch_quant_sim(const CudaContext& ctx, const QuantSimOp& op) {
  if (op.sim == KvQuantSim::NONE) return;
  const int64_t d = op.x.ne[0], rows = op.x.n_rows();
  DSV4_ASSERT(op.sim != KvQuantSim::HADAMARD_FP4 || (d & (d - 1)) == 0, "Hadamard needs a power-of-two width");
  DSV4_ASSERT(op.sim != KvQuantSim::FP8_BF16 || (op.n_quant >= 0 && op.n_quant <= d),
              "quant_sim: n_quant out of range");
  DSV4_ASSERT(rows <= 0x7fffffff, "quant_sim: too many rows");
  if (rows == 0) return;
  if (op.sim == KvQuantSim::HADAMARD_FP4 && d >= 64 && d <= 1024 && reinterpret_cast<uintptr_t>(op.x.data) % 16 == 0) {
    const unsigned grid = static_cast<unsigned>((rows + 7) / 8);
    auto launch = [&](auto kernel) { launch_kernel(kernel, grid, 256, 0, ctx.stream, op.x.f32(), rows); };
    switch (d) {
      case 64: launch(hadamard_fp4_warp_kernel<2>); break;
      case 128: launch(hadamard_fp4_warp_kernel<4>); break;
      case 256: launch(hadamard_fp4_warp_kernel<8>); break;
      case 512: launch(hadamard_fp4_warp_kernel<16>); break;
      default: launch(hadamard_fp4_warp_kernel<32>); break;  // 1024
    }
    CUDA_CHECK_LAUNCH();
    return;
  }
  launch_kernel(quant_sim_kernel, static_cast<unsigned>(rows), d > 256 ? 256 : 128, 0, ctx.stream, op.x.f32(), d,
                op.sim, op.n_quant);
  CUDA_CHECK_LAUNCH();
}

void launch_store_rows(const CudaContext& ctx, const StoreRowsOp& op) {
  const int64_t d = op.rows.ne[0], n = op.rows.n_rows(), cap = op.ring.n_rows();
  DSV4_ASSERT(op.ring.ne[0] == d, "store_rows: width mismatch");
  DSV4_ASSERT(op.pos.ne[0] >= n, "store_rows: %lld positions for %lld rows", static_cast<long long>(op.pos.ne[0]),
              static_cast<long long>(n));
  if (n == 0) return;
  check_kv_rows(op.ring, "store_rows");
  launch_kernel(store_rows_kernel, static_cast<unsigned>(n), 128, 0, ctx.stream, op.ring.data, op.ring.type,
                op.rows.f32(), op.pos.i32(), n, d, cap);
  CUDA_CHECK_LAUNCH();
}

void launch_store_rows_seqs(const CudaContext& ctx, std::span<const StoreRowsOp> ops) {
  auto fits = [](const StoreRowsOp& op, const StoreRowsOp& first, size_t k) {
    return op.rows.n_rows() == 1 && op.rows.ne[0] == first.rows.ne[0] && op.ring.ne[0] == first.ring.ne[0] &&
           op.ring.type == first.ring.type && rows_follow(first.rows, op.rows, k, first.rows.row_bytes()) &&
           rows_follow(first.pos, op.pos, k, sizeof(int32_t));
  };
  auto batch = [&](std::span<const StoreRowsOp> run) {
    const StoreRowsOp& first = run.front();
    check_kv_rows(first.ring, "store_rows");
    SeqTable<StoreRowsSeq> tab{};
    for (size_t k = 0; k < run.size(); ++k) tab.at[k] = {run[k].ring.data, run[k].ring.n_rows()};
    launch_kernel(store_rows_seqs_kernel, static_cast<unsigned>(run.size()), 128, 0, ctx.stream, tab, first.ring.type,
                  first.rows.f32(), first.pos.i32(), first.rows.ne[0]);
    CUDA_CHECK_LAUNCH();
  };
  seq_runs(ops, fits, batch, [&](const StoreRowsOp& op) { launch_store_rows(ctx, op); });
}

void launch_swiglu(const CudaContext& ctx, const SwigluOp& op) {
  const int64_t n = op.out.n_elements();
  DSV4_ASSERT(op.gate.n_elements() == n && op.up.n_elements() == n, "swiglu: size mismatch");
  if (n == 0) return;
  const int64_t F = op.out.ne[0];
  const bool q8 = op.quant == ActQuant::INT8_32 && F % 32 == 0 && ctx.fuse_act_quant;  // else a launch after it
  launch_kernel(swiglu_kernel, grid_for(n, 256), 256, 0, ctx.stream, op.out.f32(), op.gate.f32(), op.up.f32(), n,
                op.clamp, q8);
  CUDA_CHECK_LAUNCH();
  if (op.quant != ActQuant::NONE && !q8) launch_act_quant(ctx.stream, op.out.f32(), op.out.f32(), F, n / F, op.quant);
}

void launch_add(const CudaContext& ctx, const AddOp& op) {
  const int64_t n = op.out.n_elements();
  DSV4_ASSERT(op.x.n_elements() == n, "add: size mismatch");
  if (n == 0) return;
  launch_kernel(add_kernel, grid_for(n, 256), 256, 0, ctx.stream, op.out.f32(), op.x.f32(), n);
  CUDA_CHECK_LAUNCH();
}

void launch_scale(const CudaContext& ctx, const ScaleOp& op) {
  const int64_t n = op.x.n_elements();
  if (n == 0) return;
  launch_kernel(scale_kernel, grid_for(n, 256), 256, 0, ctx.stream, op.x.f32(), n, op.s);
  CUDA_CHECK_LAUNCH();
}

void launch_fill(const CudaContext& ctx, float* dst, int64_t n, float value) {
  if (n == 0) return;
  launch_kernel(fill_kernel, grid_for(n, 256), 256, 0, ctx.stream, dst, n, value);
  CUDA_CHECK_LAUNCH();
}

}  // namespace dsv4::cuda
