// The grouped expert GEMM of cuda_expert_gemm.cuh on wgmma (sm_90a): the
// prefill experts of large batches (CudaContext::expert_gemm).
//
//   out[a, r] = sum_c W_e(a)[r, c] x[a / x_div, c]     for the assignments a of one plan tile
//
// Numerics (cuda_expert_gemm.cuh): producers decode the weights as
// scaled f16 hi/lo and copy the tile's split x; consumers accumulate w_hi x_hi
// + w_lo x_hi + w_hi x_lo in f32, per slice of k_wg_slice_chunks chunks into
// fresh accumulators that are then added with one rounded f32 addition. When x
// is an activation quantiser's output (x_exact: MoeExpertsOp::x_quant for gate
// and up, mid_quant for down) x_lo is 0: two wgmmas per 16 columns and one
// bulk copy of x per chunk instead of three and two, the same sums. IQ2_XXS
// and Q2_K weights go as exact integer codes by default (CudaContext::expert_gemm_codes,
// cuda_expert_gemm.cuh): producers write wh only and each row's scale per chunk
// (IQ2_XXS d / 8, Q2_K sigma), consumers run c x_hi (+ c x_lo) and add each
// chunk's sums times the scale: one wgmma per 16 columns under x_exact, two
// otherwise; Q2_K's mins as one more wgmma per chunk (the rows' A in wl, the
// tokens' sub-block sums in xs).
// Block: 128 weight rows x the <= 128 assignments of one plan tile
// (k_wg_tokens: each decoded weight chunk serves up to 128 tokens), 64-column
// chunks in k_eg_stages shared stages, 512 threads:
//   2 producer warpgroups (k_wg_pgroups): thread p of each decodes both
//     32-element units of row p per chunk, warpgroup g the chunk pairs
//     2 q, 2 q + 1 with q % 2 == g, so that two chunks are decoded at once;
//     setmaxnreg moves registers from the producers (k_wg_preg) to the
//     consumers (k_wg_creg);
//   2 consumer warpgroups: consumer thread 0 fetches the tile's split x two
//     chunks ahead, two bulk copies (cp.async.bulk, completing on the stage's
//     mbarrier) per chunk from the copy that expert_gemm_gather_x_kernel laid
//     out in the stage layout; warpgroup wg owns rows 64 wg.., all tokens; per 16
//     columns three m64nNk16 wgmmas (N = the tile's count rounded up to 32), operands
//     straight from shared memory (no ldmatrix); accumulators in registers
//     (64 + 64 per thread: > 128 registers each, the entry count at 512
//     threads, hence setmaxnreg).
// The stages hold 8x8 "core matrices" (8 rows x 16 bytes, 128 contiguous bytes)
// in row-group-major order, element (r, k) of a chunk at halves
// ((r / 8) 8 + k / 8) 64 + (r % 8) 8 + k % 8, which is what wgmma reads without
// swizzling (descriptor: LBO = 128 bytes between cores along K, SBO = 1024
// bytes between row groups; bench/micro/wgmma_f16.cu checked it on the H200).
// Hand-off: named barriers full[s] (the chunk's producer warpgroup arrives after its writes and a
// fence.proxy.async, which makes generic stores visible to wgmma's async
// proxy), the x mbarriers xbar[s] (phase c / 3 of stage s: chunk c's x), and
// empty[s] (consumers arrive once wgmma.wait_group says the wgmmas reading the
// stage are complete, one chunk later; a consumer-only barrier orders the next
// bulk copy into a stage after both warpgroups' wgmmas on it). With two producer
// warpgroups a stage's barriers serve both, one chunk at a time: chunk c + 3's
// producer passes empty[s] only once the consumers have taken chunk c, and they
// take chunks in order, so no barrier phase holds two warpgroups' arrivals.
// Its cost is nearly flat in a tile's assignment count (the producers decode
// 128 rows x K whatever N is), so for experts of few assignments the tile is
// faster: the MoE op chooses per expert (CudaContext::expert_gemm_min).
// Measurements: docs/design-notes/moe-grouped-gemm.md.
// Built for sm_90a only (the wgmma instructions); on any other target the
// kernel is a trap and expert_wgmma_available() says false, so the caller
// keeps the tile of cuda_mma.cuh. CPU reference: cpu::moe_experts.
#include <type_traits>

#include "backend/cuda/cuda_expert_gemm.cuh"
#include "backend/cuda/cuda_launch.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_EG_WGMMA 1
#endif

namespace dsv4::cuda {
namespace {

[[maybe_unused]] constexpr int k_wg_vs =
    64;  // halves between the 8-element vectors of one row's chunk (one core matrix)
// Chunks per accumulation slice. 8 (512 columns: 96 truncating
// tensor-core additions per slice) gave NMSE ~2.3e-11 against the CPU on the IQ2_XXS/Q2_K cases (the tile:
// ~6e-13) and failed "x scaled 1e+15 n=40" with seed 16448866924283836166. 1: fresh
// accumulators per 64-column chunk (12 truncating additions): NMSE 6e-14..8e-13, that seed passes, and the
// op time is the same as with 8.
[[maybe_unused]] constexpr int k_wg_slice_chunks = 1;
// Producer warpgroups: in each, thread p decodes row p (both units of a chunk). With two, warpgroup g decodes
// the chunk pairs 2 q, 2 q + 1 with q % 2 == g (a pair keeps the bytes an odd chunk shares with the even one:
// EgChunk::load's prev), so two chunks are decoded at once: one producer warp per scheduler decoding a chunk
// was the kernel's critical path (docs/design-notes/moe-grouped-gemm.md).
constexpr int k_wg_pgroups = 2;
constexpr int k_wg_producers = 128 * k_wg_pgroups;
constexpr int k_wg_threads = k_wg_producers + 256;  // + two consumer warpgroups
// A chunk's hand-off barriers (full[s], empty[s]) count the one producer warpgroup that decodes it and the
// two consumer warpgroups.
[[maybe_unused]] constexpr int k_wg_bar_threads = 128 + 256;
static_assert(k_eg_rows == 128, "one producer thread per weight row in each producer warpgroup");
static_assert(k_wg_pgroups == 1 || k_wg_pgroups == 2, "one or two producer warpgroups");
// Registers per thread with two producer warpgroups (512 threads: 128 each at entry, 65,536 in all): the
// producers give theirs down to k_wg_preg and the consumers take k_wg_creg (setmaxnreg; their accumulators
// need ~160); 256 k_wg_preg + 256 k_wg_creg must not exceed the pool, or the consumers' increase never returns.
[[maybe_unused]] constexpr int k_wg_preg = 72, k_wg_creg = 184;
static_assert(k_wg_pgroups == 1 || 256 * (k_wg_preg + k_wg_creg) <= 65536, "setmaxnreg within the block's pool");

[[maybe_unused]] __host__ __device__ constexpr int wg_off(int r, int k) { return eg_core_off(r, k); }

struct WgStage {
  uint16_t wh[k_eg_rows * k_eg_bk], wl[k_eg_rows * k_eg_bk];
  uint16_t xh[k_wg_tokens * k_eg_bk], xl[k_wg_tokens * k_eg_bk];
  float ds[k_eg_rows];  // integer codes (CudaContext::expert_gemm_codes): each row's scale for this chunk (IQ2_XXS
                        // d / 8, Q2_K sigma)
  uint16_t xs[k_wg_tokens * k_eg_sums_k];  // Q2_K codes: the tokens' sums block (wl: the rows' A)
};
struct WgSmem {
  WgStage st[k_eg_stages];
  EgTables tables;
  int64_t arow[k_wg_tokens];
  uint64_t xbar[k_eg_stages];  // mbarriers: stage s's x (two bulk copies) has landed
  int e_t[k_wg_tokens];
  int e_r[k_eg_rows];
};
static_assert(sizeof(WgStage) % 128 == 0, "stages keep 128-byte alignment");

#ifdef DSV4_EG_WGMMA
// Named barriers 1.. (0 is __syncthreads) over the whole block: full[s] = 1 + s, empty[s] = 1 + k_eg_stages + s.
__device__ __forceinline__ void wg_bar_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(k_wg_bar_threads) : "memory");
}
__device__ __forceinline__ void wg_bar_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(k_wg_bar_threads) : "memory");
}
// The warpgroup's registers per thread from here on (every thread of the warpgroup executes it).
template <int N>
__device__ __forceinline__ void wg_regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void wg_regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Shared-memory matrix descriptor (no swizzle): start address, LBO, SBO in 16-byte units.
__device__ __forceinline__ uint64_t wg_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32);
}
// mbarriers and bulk copies (the x stages): one arrival (the issuing thread's, with the byte count) per phase.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}
// bytes (a multiple of 16; both addresses 16-byte aligned) from global to shared memory, completing on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins the accumulators: code after a wait must not read them earlier, nor code before a wgmma write them later.
template <int M>
__device__ __forceinline__ void wg_pin(float (&d)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// d (64 x 64 f32: this thread's 32) = (accumulate ? d : 0) + A (64 x 16) B (64 x 16)^T, f16 operands in shared memory.
__device__ __forceinline__ void wgmma_64x64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "
      "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, "
      "0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
}
// d (64 x 128 f32: this thread's 64) = (accumulate ? d : 0) + A (64 x 16) B (128 x 16)^T.
__device__ __forceinline__ void wgmma_64x128(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, "
      "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
      "%58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate));
}
// d (64 x 32 f32: this thread's 16) = (accumulate ? d : 0) + A (64 x 16) B (32 x 16)^T.
__device__ __forceinline__ void wgmma_64x32(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
}
// d (64 x 96 f32: this thread's 48) = (accumulate ? d : 0) + A (64 x 16) B (96 x 16)^T.
__device__ __forceinline__ void wgmma_64x96(float (&d)[48], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(da), "l"(db), "r"(accumulate));
}
template <int N>
__device__ __forceinline__ void wgmma_n(float (&d)[N / 2], uint64_t da, uint64_t db, int accumulate) {
  if constexpr (N == 32)
    wgmma_64x32(d, da, db, accumulate);
  else if constexpr (N == 64)
    wgmma_64x64(d, da, db, accumulate);
  else if constexpr (N == 96)
    wgmma_64x96(d, da, db, accumulate);
  else
    wgmma_64x128(d, da, db, accumulate);
}

// The consumers' loop (threads k_wg_producers.. of the block) for N-token wgmmas (N = 32, 64, 96 or 128):
// part = this slice's products (fresh at each slice start), acc = the rounded sum of the slices; CODES: the
// weights are integer codes (wh only) and acc = fma(part, the row's scale ds, acc) per slice (a slice never
// spans two 256-column blocks). MINS (Q2_K codes): one more wgmma per chunk, the rows' A of the mins (wl)
// times the tokens' sub-block sums (xs, a bulk copy from xts), both sums blocks of 16 columns (eg_sums_off;
// EgChunk<Q2_K>::put_codes), into the same slice.
template <int N, bool XE, bool CODES, bool MINS>
__device__ __forceinline__ void wg_consume(WgSmem& sm, float* __restrict__ out, int64_t R, int64_t r0, int nt,
                                           int n_chunks, const __half* __restrict__ xth, const __half* __restrict__ xtl,
                                           const __half* __restrict__ xts) {
  const int ctid = static_cast<int>(threadIdx.x) - k_wg_producers, wg = ctid >> 7;
  // The tile's x, gathered in the stage layout (expert_gemm_gather_x_kernel): chunk c is r8 token rows of
  // 128 bytes each for hi and for lo, two bulk copies issued by consumer thread 0, two chunks ahead.
  const uint32_t r8 = (static_cast<uint32_t>(nt) + 7u) & ~7u;
  auto copy_x = [&](int c) {
    if (ctid == 0 && c < n_chunks) {
      const int s = c % k_eg_stages;
      const int64_t at = static_cast<int64_t>(c) * r8 * k_eg_bk;
      mbar_expect(&sm.xbar[s], (XE ? 1 : 2) * r8 * 128 + (MINS ? r8 * 2 * k_eg_sums_k : 0));
      bulk_copy(sm.st[s].xh, xth + at, r8 * 128, &sm.xbar[s]);
      if constexpr (!XE) bulk_copy(sm.st[s].xl, xtl + at, r8 * 128, &sm.xbar[s]);
      if constexpr (MINS)  // chunk c's sums block: r8 rows of 32 bytes
        bulk_copy(sm.st[s].xs, xts + static_cast<int64_t>(c) * r8 * k_eg_sums_k, r8 * 2 * k_eg_sums_k, &sm.xbar[s]);
    }
  };
  copy_x(0);
  copy_x(1);
  float part[N / 2], acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) part[i] = acc[i] = 0.0f;
  const int a_base = wg_off(64 * wg, 0);
  // Fragment of warp w4 of the warpgroup, lane (g, t), value 4 j + i: row 16 w4 + g + 8 (i / 2), token 8 j + 2 t + i
  // % 2.
  const int w4 = (ctid >> 5) & 3, lane = ctid & 31, g = lane >> 2, t = lane & 3;
  const int row_g = 64 * wg + 16 * w4 + g;  // this thread's rows: row_g, row_g + 8
  float dsc0 = 1.0f, dsc1 = 1.0f;           // CODES: their block scales for the current slice
  for (int c = 0; c < n_chunks; ++c) {
    const int s = c % k_eg_stages;
    mbar_wait(&sm.xbar[s], (c / k_eg_stages) & 1);  // chunk c's x has landed (the stage's (c / 3)-th phase)
    wg_bar_sync(1 + s);                             // full[s]: the producers' weights of chunk c
    const WgStage& st = sm.st[s];
    const bool fresh = c % k_wg_slice_chunks == 0;  // a slice starts: the first product overwrites part
    if constexpr (CODES) {
      dsc0 = st.ds[row_g];
      dsc1 = st.ds[row_g + 8];
    }
    // (no wg_pin before the wgmmas: touching the accumulators while the previous chunk's group is in flight
    // makes ptxas wait for it; no wgmma in a branch either: ptxas would serialise them all)
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < k_eg_bk / 16; ++ks) {
      // K step ks covers core columns 2 ks, 2 ks + 1: 256 bytes further along the row group.
      const uint64_t ah = wg_desc(st.wh + a_base + ks * 128, 128, 1024),
                     al = wg_desc(st.wl + a_base + ks * 128, 128, 1024);
      const uint64_t bh = wg_desc(st.xh + ks * 128, 128, 1024), bl = wg_desc(st.xl + ks * 128, 128, 1024);
      wgmma_n<N>(part, ah, bh, !(fresh && ks == 0));
      if constexpr (!CODES) wgmma_n<N>(part, al, bh, 1);
      if constexpr (!XE) wgmma_n<N>(part, ah, bl, 1);
    }
    // sums blocks: 8x8 cores, LBO 128 bytes along K, SBO 256 bytes between row groups (two cores each)
    if constexpr (MINS)
      wgmma_n<N>(part, wg_desc(st.wl + eg_sums_off(64 * wg, 0), 128, 256), wg_desc(st.xs, 128, 256), 1);
    wg_commit();
    wg_wait<1>();  // chunk c - 1's wgmmas are complete: its stage may be refilled
    if (c >= 1 && c - 1 + k_eg_stages < n_chunks)
      wg_bar_arrive(1 + k_eg_stages + (c - 1) % k_eg_stages);  // empty (weights)
    // Both consumer warpgroups are past chunk c - 1: its stage's x may be overwritten with chunk c + 2's.
    asm volatile("bar.sync %0, %1;\n" ::"n"(2 + 2 * k_eg_stages), "n"(256) : "memory");
    copy_x(c + 2);
    if ((c + 1) % k_wg_slice_chunks == 0 || c + 1 == n_chunks) {
      wg_wait<0>();
      wg_pin(part);
      if constexpr (CODES) {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) acc[i] = __fmaf_rn(part[i], (i & 2) ? dsc1 : dsc0, acc[i]);
      } else {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) acc[i] = __fadd_rn(acc[i], part[i]);
      }
    }
  }
  wg_wait<0>();  // (the last chunk's slice end already waited; this tells ptxas)
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int rl = 64 * wg + 16 * w4 + g + 8 * (i >> 1);
      const int tt = 8 * j + 2 * t + (i & 1);
      const int64_t r = r0 + rl;
      if (r < R && tt < nt) out[sm.arow[tt] * R + r] = ldexpf(acc[4 * j + i], -(sm.e_r[rl] + sm.e_t[tt]));
    }
}
#endif

// grid (ceil(R / k_eg_rows), plan max tiles); tiles[y] = {expert, first list index, count}. wide: every row
// starts 16-byte aligned and row_bytes is a multiple of 16 (EgChunk<T>::load's aligned 16-byte pieces).
template <GgmlType T>
__global__ void __launch_bounds__(k_wg_threads, 1)
    expert_wgmma_kernel(float* __restrict__ out, int64_t R, ExpertRows w, size_t row_bytes, int64_t n_units,
                        const int32_t* __restrict__ list, const int4* __restrict__ tiles,
                        const int32_t* __restrict__ n_tiles, const __half* __restrict__ xth,
                        const __half* __restrict__ xtl, const __half* __restrict__ xts, const int* __restrict__ tok_exp,
                        int x_div, bool x_exact, bool codes_on, bool wide, QuantTables tab) {
#ifndef DSV4_EG_WGMMA
  __trap();  // never launched: expert_wgmma_available() is false for this target
#else
  pdl_enter();
  extern __shared__ __align__(128) unsigned char wg_smem[];
  auto& sm = *reinterpret_cast<WgSmem*>(wg_smem);
  if (static_cast<int>(blockIdx.y) >= *n_tiles) return;  // the whole block leaves together
  const int4 td = tiles[blockIdx.y];
  const int nt = td.z;
  const int64_t cols = n_units * 32;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * k_eg_rows;
  const uint8_t* we = w.at(td.x);  // R rows of row_bytes
  const int tid = threadIdx.x;
  for (int i = tid; i < k_wg_tokens; i += blockDim.x) {
    const int64_t a = list[td.y + (i < nt ? i : 0)];
    const int32_t xr = static_cast<int32_t>(a / x_div);
    sm.arow[i] = a;
    sm.e_t[i] = tok_exp[xr];
  }
  if (tid < k_eg_stages) mbar_init(&sm.xbar[tid], 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // the barriers, visible to the bulk copies
  __syncthreads();
  const int n_chunks = static_cast<int>(cols / k_eg_bk);
  constexpr bool can_codes = expert_gemm_codes_type<T>();
  const bool codes = can_codes && codes_on;  // block-uniform (Q2_K: the gather wrote xts, expert_gemm_sums)
  static_assert(256 % (k_eg_bk * k_wg_slice_chunks) == 0, "codes: a slice within one 256-column block");

  if (tid < k_wg_producers) {
    // ---- producers: thread p of warpgroup pg decodes both units of row p in each of its chunks ----
    if constexpr (k_wg_pgroups > 1) wg_regs_dec<k_wg_preg>();
    const int pg = tid / 128, p = tid % 128;
    const int64_t drow = r0 + p < R ? r0 + p : R - 1;  // rows past R repeat the last one (not stored)
    const uint8_t* dptr = we + drow * static_cast<int64_t>(row_bytes);
    // Row p's exponent, from one warpgroup (the other reads it after the barrier below; the consumers'
    // epilogue after a full[] barrier).
    if (pg == 0) sm.e_r[p] = codes ? 0 : split_exponent(RowBound<T>::partial(dptr, n_units, 0, 1));
    EgUnit<T>::tables(sm.tables, tab, tid, k_wg_producers);
    asm volatile("bar.sync %0, %1;\n" ::"n"(1 + 2 * k_eg_stages), "n"(k_wg_producers)
                 : "memory");  // the producers' tables and row exponents
    const float s_r = eg_pow2(sm.e_r[p]);
    // Row p's units start at cores (p / 8, 0) and (p / 8, 4), row p % 8.
    const int wofs = wg_off(p, 0);
    constexpr int upc = k_eg_bk / 32;  // units per chunk
    static_assert(upc == 2, "two units per producer thread and chunk");
    // This warpgroup's i-th chunk (pairs 2 q, 2 q + 1 with q % k_wg_pgroups == pg) and how many it has.
    auto chunk_of = [&](int i) { return k_wg_pgroups == 1 ? i : 4 * (i >> 1) + 2 * pg + (i & 1); };
    const int n_mine = k_wg_pgroups == 1 ? n_chunks : 2 * (n_chunks / 4) + min(max(n_chunks % 4 - 2 * pg, 0), 2);
    using Raw2 = EgChunk<T>;  // the chunk's bytes, read once (cuda_expert_gemm.cuh)
    // Chunks load in this warpgroup's order, each after its i - 1 (the last set loaded: prev), which a chunk
    // reuses only when it is the chunk just before it (adj).
    auto load2 = [&](int i, const Raw2& prev) {
      const int c = chunk_of(i);
      return EgChunk<T>::load(dptr, static_cast<int64_t>(c), prev, i > 0 && chunk_of(i - 1) == c - 1, wide);
    };
    auto step = [&](int i, const Raw2& raw) {
      const int c = chunk_of(i), s = c % k_eg_stages;
      if (c >= k_eg_stages) wg_bar_sync(1 + k_eg_stages + s);  // consumers done with chunk c - stages
      bool put_codes = false;
      if constexpr (can_codes) {
        if (codes) {                                     // both units of a chunk lie in one 256-value block: one scale
          if constexpr (expert_gemm_codes_need_sums(T))  // and the row's A of the mins into wl (a sums block)
            sm.st[s].ds[p] = raw.put_codes(sm.tables, sm.st[s].wh + wofs, k_wg_vs, sm.st[s].wl + eg_sums_off(p, 0));
          else
            sm.st[s].ds[p] = raw.put_codes(sm.tables, sm.st[s].wh + wofs, k_wg_vs);
          put_codes = true;
        }
      }
      if (!put_codes) raw.put(s_r, tab, sm.tables, sm.st[s].wh + wofs, sm.st[s].wl + wofs, k_wg_vs);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic writes -> wgmma's async proxy
      wg_bar_arrive(1 + s);                                           // full[s]
    };
    // Software pipeline: the raw bytes of chunks i + 1 and i + 2 are in registers while chunk i is decoded
    // (three register sets, the loop unrolled by three so that no set is copied).
    if (n_mine == 0) return;
    Raw2 ra = load2(0, Raw2{}), rb = ra, rc = ra;
    if (n_mine > 1) rb = load2(1, ra);
    for (int i = 0; i < n_mine; i += 3) {
      if (i + 2 < n_mine) rc = load2(i + 2, rb);
      step(i, ra);
      if (i + 1 >= n_mine) break;
      if (i + 3 < n_mine) ra = load2(i + 3, rc);
      step(i + 1, rb);
      if (i + 2 >= n_mine) break;
      if (i + 4 < n_mine) rb = load2(i + 4, ra);
      step(i + 2, rc);
    }
    return;
  }

  // ---- consumers: warpgroup wg owns weight rows 64 wg .. 64 wg + 63 of the block, all the tile's tokens ----
  if constexpr (k_wg_pgroups > 1) wg_regs_inc<k_wg_creg>();
  // The wgmma width follows the tile's assignment count: N = 32, 64, 96 or 128 (block-uniform; one loop per
  // width, so that no wgmma sits in a divergent path: ptxas would serialise them).
  const int64_t tile_at = static_cast<int64_t>(td.w) * cols;  // the tile's gathered x
  auto consume = [&](auto exact, auto codes_tag) {
    constexpr bool XE = decltype(exact)::value, CO = decltype(codes_tag)::value;
    constexpr bool MI = CO && expert_gemm_codes_need_sums(T);
    const __half *xh = xth + tile_at, *xl = xtl + tile_at, *xs = MI ? xts + tile_at / 4 : nullptr;
    if (nt <= 32)
      wg_consume<32, XE, CO, MI>(sm, out, R, r0, nt, n_chunks, xh, xl, xs);
    else if (nt <= 64)
      wg_consume<64, XE, CO, MI>(sm, out, R, r0, nt, n_chunks, xh, xl, xs);
    else if (nt <= 96)
      wg_consume<96, XE, CO, MI>(sm, out, R, r0, nt, n_chunks, xh, xl, xs);
    else
      wg_consume<128, XE, CO, MI>(sm, out, R, r0, nt, n_chunks, xh, xl, xs);
  };
  auto consume_x = [&](auto codes_tag) {
    if (x_exact)
      consume(std::true_type{}, codes_tag);
    else
      consume(std::false_type{}, codes_tag);
  };
  if constexpr (can_codes) {
    if (codes) {
      consume_x(std::true_type{});
      return;
    }
  }
  consume_x(std::false_type{});
#endif
}

__global__ void expert_wgmma_probe_kernel(int* on) {
  pdl_enter();
#ifdef DSV4_EG_WGMMA
  *on = 1;
#else
  *on = 0;
#endif
}

}  // namespace

bool expert_wgmma_available() {
  static const bool on = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (major != 9 || minor != 0) return false;
    int* d = nullptr;
    int h = 0;
    if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) return false;
    launch_kernel(expert_wgmma_probe_kernel, 1, 1, 0, nullptr, d);  // the image for this device: sm_90a or plain sm_90
    const bool ok = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
    cudaFree(d);
    cudaGetLastError();  // a missing image for this device is not an error of the caller's
    return ok && h == 1;
  }();
  return on;
}

void launch_expert_wgmma(const CudaContext& ctx, float* out, int64_t R, const Tensor& w, ExpertRows wr,
                         const ExpertGemmArgs& a) {
  const int64_t cols = w.ne[0];
  DSV4_ASSERT(cols % k_eg_bk == 0, "moe_experts: wgmma grouped GEMM columns");
  DSV4_ASSERT(!expert_gemm_sums(w.type, ctx.expert_gemm_codes) || a.xts, "moe_experts: Q2_K codes without x sums");
  dispatch_weight_type(w.type, [&](auto tag) {
    constexpr GgmlType T = decltype(tag)::value;
    if constexpr (expert_gemm_type<T>()) {
      allow_smem(expert_wgmma_kernel<T>, sizeof(WgSmem));
      auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
      const bool wide = w.row_bytes() % 16 == 0 && a16(wr.dev) && a16(wr.host) && a16(wr.stage);
      const dim3 grid(ceil_div(R, k_eg_rows), static_cast<unsigned>(a.max_tiles));
      launch_kernel(expert_wgmma_kernel<T>, grid, k_wg_threads, sizeof(WgSmem), ctx.stream, out, R, wr, w.row_bytes(),
                    cols / 32, a.list, a.tiles, a.n_tiles, a.xth, a.xtl, a.xts, a.e_t, a.x_div, a.x_exact,
                    ctx.expert_gemm_codes, wide, ctx.tables);
      CUDA_CHECK_LAUNCH();
    } else {
      DSV4_ASSERT(false, "moe_experts: grouped GEMM for %s", ggml_type_name(T));
    }
  });
}

}  // namespace dsv4::cuda
