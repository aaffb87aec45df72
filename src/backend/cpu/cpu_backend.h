// The CPU reference backend: every op of src/ops/ops.h in plain fp32, threaded
// over all cores. It is the oracle the CUDA kernels are tested against.
//
// Determinism: every output element is computed by one thread in a fixed
// order that does not depend on the batch size or the thread count, so a
// chunked prefill, a whole prefill and token-by-token decoding give bitwise
// identical results.
#pragma once

#include <memory>
#include <vector>

#include "ops/ops.h"

namespace dsv4 {

class ThreadPool;

// n_threads: the backend's own worker pool (the calling thread included); <= 0: every core.
std::unique_ptr<Backend> make_cpu_backend(int n_threads = 0);

namespace cpu {

// Shared helpers of the op files (cpu_*.cpp).
// The pool an op's loops run on: the backend's whose op this thread is running (make_cpu_backend's
// n_threads; PoolScope), else a process-wide pool of every core (an op function called directly).
ThreadPool& pool();
class PoolScope {
 public:
  explicit PoolScope(ThreadPool& p);
  ~PoolScope();
  PoolScope(const PoolScope&) = delete;
  PoolScope& operator=(const PoolScope&) = delete;

 private:
  ThreadPool* prev_;
};
// Fixed-order f32 dot product (8 interleaved partial sums, then a fixed tree).
float dot(const float* a, const float* b, int64_t n);
// out[j] = dot(a, b[j], n) for j < 4, bitwise (each sum in dot's order), computed together: four independent
// chains of additions where one dot is bound by the latency of its own (~3x dot's rate).
void dot4(const float* a, const float* const b[4], int64_t n, float out[4]);
// Dequantises row r of a weight tensor into dst (ne0 floats).
void weight_row(const Tensor& w, int64_t r, float* dst);
float sigmoid(float x);

void embed(const EmbedOp& op);
void hc_pre(const HcPreOp& op);
void hc_post(const HcPostOp& op);
void hc_head(const HcHeadOp& op);
void rms_norm(const RmsNormOp& op);
void matmul(const MatmulOp& op);
void rope(const RopeOp& op);
void quant_sim(const QuantSimOp& op);
void act_quant(const ActQuantOp& op);
void store_rows(const StoreRowsOp& op);
void compress(const CompressOp& op);
void indexer_scores(const IndexerScoresOp& op);
void topk(const TopKOp& op);
void attention(const AttentionOp& op);
void moe_route(const MoeRouteOp& op);
void moe_experts(const MoeExpertsOp& op);
void swiglu(const SwigluOp& op);

// Row-level helpers reused by several ops (and by tests).
void rms_norm_row(float* out, const float* x, const float* w, int64_t d, float eps);
void rope_row(float* x, int64_t d, int n_rot, const float* omega, int32_t pos, bool inverse);
void quant_sim_row(float* x, int64_t d, KvQuantSim sim, int n_quant);

// KV state rows in their storage format (F32, or the compact KV_FP8 / KV_FP4
// of core/kv_rows.h): write row r from floats, read row r as floats.
void kv_row_store(const Tensor& t, int64_t r, const float* x);
void kv_row_load(const Tensor& t, int64_t r, float* x);

// f32 views of chosen rows of a KV state tensor: F32 rows are read in place,
// compact rows are unpacked once (in parallel) into a private buffer.
class KvRowView {
 public:
  // Rows [0, n_first) plus the listed rows (entries outside [0, rows) are ignored).
  KvRowView(const Tensor& t, int64_t n_first, const int32_t* listed = nullptr, int64_t n_listed = 0);
  const float* row(int64_t r) const;

 private:
  Tensor t_;
  std::vector<int32_t> slot_;  // row -> slot in buf_ (-1: not unpacked)
  std::vector<float> buf_;
};

}  // namespace cpu
}  // namespace dsv4
