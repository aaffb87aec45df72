// The op harness of test_backend_ops: both backends, the RNG of this run, the
// reporter, and `Bufs`, which makes each tensor of a case in both backends
// (same bytes), poisons outputs with NaN before each run and frees everything
// when the case ends.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "core/act_quant.h"
#include "core/kv_rows.h"
#include "cuda_test_util.h"

namespace dsv4::cudatest {

// Thresholds (normalised MSE against the CPU backend) and why:
//  * k_thr_f32 = 1e-10: ops that differ from the CPU only in the order of f32
//    additions (dot products of up to 16K terms, softmax sums): the relative
//    error per output is ~1e-7 (NMSE ~1e-14); 1e-10 leaves room for
//    cancellation and still catches any indexing or decoding mistake
//    (a single wrong weight block gives NMSE >> 1e-6).
//  * k_thr_elem = 1e-12: element-wise ops that repeat the CPU's operations and
//    differ at most through libm (expf/sinf/cosf ulps) or a double sum of
//    squares.
//  * k_thr_sim = 1e-6: rows that go through FP8/FP4/bf16 simulation after
//    f32 work (compressor rows): a 1-ulp difference before the rounding can
//    move a value by one FP8/bf16 quantum (1/16 or 1/256 of it); expected
//    NMSE is ~0 with rare flips at ~1e-8.
//    The same bound for the routed experts with the mid vector quantised
//    (MoeExpertsOp::mid_quant): a value within f32 rounding of an int8
//    boundary moves by one step.
//  * exact: selections (top-k, router experts), simulations and activation
//    quantisation on identical inputs (quant_sim, act_quant), copies (embed, store_rows), hc_post (the CPU's exact
//    operation sequence), compressor frontiers, and CUDA n-token vs 1-token
//    runs of matmul/moe_experts on the FFMA tiles (one summation order for any
//    batch size; --no-tensor-cores). On tensor cores (cuda_mma.cuh) the batched
//    kernels agree with the one-token ones to k_thr_f32.
constexpr double k_thr_f32 = 1e-10;
constexpr double k_thr_elem = 1e-12;
// Experts the host computes (backend/host): x and the mid vector quantised to 8 bits (Q8_K/Q8_0 activations, the
// ds4 CPU convention) before integer dots; the CPU unit test measures NMSE 7e-5 .. 3e-4 against f32 for weights
// quantised from normals; the harness's random-byte weights give mid vectors with outliers that one 256-value
// Q8_K block must span (measured up to 1.2e-3 at F = 256). A wrong row or expert gives NMSE ~1.
constexpr double k_thr_host_experts = 5e-3;
constexpr double k_thr_sim = 1e-6;

struct Harness {
  Backend& cpu;
  Backend& gpu;
  Rng rng;
  Report report;
  bool flash = true;             // include DeepSeek V4 Flash shapes (GBs of weights)
  std::string filter;            // run only ops whose name contains this
  bool tensor_cores = true;      // the gpu backend runs batched matmuls on tensor cores
  bool expert_gather = true;     // host-memory experts gathered into GPU memory first (CudaOptions::expert_gather)
  float cpu_experts = 0.0f;      // decode batches' share of host experts on the CPU (CudaOptions::cpu_experts)
  int fast_attention_terms = 3;  // bf16 terms of q and P in `fast` attention ops (CudaOptions::fast_attention_terms)
  bool want(const char* op) const { return filter.empty() || std::string(op).find(filter) != std::string::npos; }
};

// v (rows of d values) quantised on the host by act_quant_row: the oracle of a quantisation fused into
// another op's kernel (RmsNormOp::quant, HcPreOp::norm_quant, SwigluOp::quant), applied to that kernel's
// own unquantised rows so that the comparison is bitwise.
inline std::vector<float> host_act_quant(std::vector<float> v, int64_t d, ActQuant q) {
  for (size_t r = 0; r + static_cast<size_t>(d) <= v.size(); r += static_cast<size_t>(d))
    act_quant_row(v.data() + r, d, q);
  return v;
}

// Batched vs one-token CUDA results: bitwise on the FFMA tiles, k_thr_f32 on tensor cores.
inline void report_batch_invariance(Harness& h, const char* op, const std::string& s, const Diff& d) {
  if (h.tensor_cores)
    h.report.nmse(op, s, d, k_thr_f32);
  else
    h.report.exact(op, s, d);
}

struct Shape {
  int64_t ne[4] = {1, 1, 1, 1};
  Shape(int64_t a, int64_t b = 1, int64_t c = 1, int64_t d = 1) : ne{a, b, c, d} {}
  int64_t n() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

// One tensor in both backends.
struct Pair {
  Tensor c, g;
};

class Bufs {
 public:
  explicit Bufs(Harness& h) : h_(h) {}
  ~Bufs() {
    h_.gpu.synchronize();
    for (auto& t : cpu_allocs_) h_.cpu.free(t);
    for (auto& t : gpu_allocs_) h_.gpu.free(t);
  }
  Bufs(const Bufs&) = delete;
  Bufs& operator=(const Bufs&) = delete;

  Pair alloc(GgmlType type, Shape s) {
    Pair p{h_.cpu.alloc(type, s.ne[0], s.ne[1], s.ne[2], s.ne[3]),
           h_.gpu.alloc(type, s.ne[0], s.ne[1], s.ne[2], s.ne[3])};
    cpu_allocs_.push_back(p.c);
    gpu_allocs_.push_back(p.g);
    return p;
  }
  Pair f32(const std::vector<float>& v, Shape s) {
    DSV4_ASSERT(static_cast<int64_t>(v.size()) == s.n(), "Bufs::f32: %zu values for %lld elements", v.size(),
                static_cast<long long>(s.n()));
    Pair p = alloc(GgmlType::F32, s);
    set(p, v.data());
    return p;
  }
  Pair i32(const std::vector<int32_t>& v, Shape s) {
    DSV4_ASSERT(static_cast<int64_t>(v.size()) == s.n(), "Bufs::i32: size");
    Pair p = alloc(GgmlType::I32, s);
    set(p, v.data());
    return p;
  }
  // An output: NaN-poisoned in both backends (I32: the NaN bit pattern, never a valid id).
  Pair out(GgmlType type, Shape s) {
    Pair p = alloc(type, s);
    poison(p);
    return p;
  }
  void poison(const Pair& p) {
    std::vector<uint32_t> pat(p.c.n_bytes() / 4, 0x7fc00000u);
    h_.cpu.write(p.c, pat.data(), pat.size() * 4);
    h_.gpu.write(p.g, pat.data(), pat.size() * 4);
  }
  void set(const Pair& p, const void* host) {
    h_.cpu.write(p.c, host, p.c.n_bytes());
    h_.gpu.write(p.g, host, p.g.n_bytes());
  }
  // A weight uploaded to both backends from these bytes (kept alive for the CPU's view).
  Pair weight(GgmlType type, std::vector<uint8_t> bytes, Shape s) {
    host_.push_back(std::move(bytes));
    const auto& b = host_.back();
    Pair p{*h_.cpu.upload_weight(b.data(), type, s.ne), *h_.gpu.upload_weight(b.data(), type, s.ne)};
    DSV4_ASSERT(p.c.n_bytes() == b.size(), "Bufs::weight: %zu bytes for a %zu-byte tensor", b.size(), p.c.n_bytes());
    gpu_allocs_.push_back(p.g);
    return p;
  }
  Pair weight_f32(const std::vector<float>& v, Shape s) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return weight(GgmlType::F32, std::move(b), s);
  }
  Pair random_weight(GgmlType type, Shape s) {
    return weight(type, cudatest::random_weight(h_.rng, type, s.ne[0], s.n() / s.ne[0]), s);
  }

  std::vector<float> get_f32(const Tensor& t, Backend& b) {
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    b.read(t, v.data(), v.size() * 4);
    return v;
  }
  std::vector<uint8_t> get_bytes(const Tensor& t, Backend& b) {
    std::vector<uint8_t> v(t.n_bytes());
    b.read(t, v.data(), v.size());
    return v;
  }
  std::vector<int32_t> get_i32(const Tensor& t, Backend& b) {
    std::vector<int32_t> v(static_cast<size_t>(t.n_elements()));
    b.read(t, v.data(), v.size() * 4);
    return v;
  }
  // KV state rows in `type`'s format (F32, KV_FP8, KV_FP4; core/kv_rows.h), packed on the host from v.
  Pair kv_rows(GgmlType type, const std::vector<float>& v, Shape s) {
    Pair p = alloc(type, s);
    std::vector<uint8_t> bytes(p.c.n_bytes());
    const int64_t d = s.ne[0];
    for (int64_t r = 0; r < s.n() / d; ++r) {
      const float* x = v.data() + r * d;
      uint8_t* dst = bytes.data() + r * p.c.row_bytes();
      if (type == GgmlType::KV_FP8)
        kv_fp8_pack_row(dst, x, d);
      else if (type == GgmlType::KV_FP4)
        kv_fp4_pack_row(dst, x, d);
      else
        std::memcpy(dst, x, static_cast<size_t>(d) * 4);
    }
    set(p, bytes.data());
    return p;
  }
  // A KV state tensor's rows as f32 (unpacked on the host).
  std::vector<float> get_kv_f32(const Tensor& t, Backend& b) {
    std::vector<uint8_t> bytes(t.n_bytes());
    b.read(t, bytes.data(), bytes.size());
    const int64_t d = t.ne[0];
    std::vector<float> v(static_cast<size_t>(t.n_elements()));
    for (int64_t r = 0; r < t.n_rows(); ++r) {
      const uint8_t* src = bytes.data() + r * t.row_bytes();
      if (t.type == GgmlType::KV_FP8)
        kv_fp8_unpack_row(v.data() + r * d, src, d);
      else if (t.type == GgmlType::KV_FP4)
        kv_fp4_unpack_row(v.data() + r * d, src, d);
      else
        std::memcpy(v.data() + r * d, src, static_cast<size_t>(d) * 4);
    }
    return v;
  }
  // Byte-exact comparison (as 32-bit words; every KV row format is a multiple of 4 bytes).
  Diff diff_bytes(const Pair& p) {
    std::vector<int32_t> g(p.g.n_bytes() / 4), c(p.c.n_bytes() / 4);
    h_.gpu.read(p.g, g.data(), g.size() * 4);
    h_.cpu.read(p.c, c.data(), c.size() * 4);
    return diff_i32(g, c);
  }
  Diff diff_kv(const Pair& p) { return diff_f32(get_kv_f32(p.g, h_.gpu), get_kv_f32(p.c, h_.cpu)); }
  Diff diff(const Pair& p) { return diff_f32(get_f32(p.g, h_.gpu), get_f32(p.c, h_.cpu)); }
  Diff diff_ids(const Pair& p) { return diff_i32(get_i32(p.g, h_.gpu), get_i32(p.c, h_.cpu)); }

 private:
  Harness& h_;
  std::vector<Tensor> cpu_allocs_, gpu_allocs_;
  std::deque<std::vector<uint8_t>> host_;
};

// Case groups (one file each).
void cases_memory(Harness& h);
void cases_dense(Harness& h);
void cases_mhc(Harness& h);
void cases_matmul(Harness& h);
void cases_compress(Harness& h);
void cases_indexer(Harness& h);
void cases_attention(Harness& h);
void cases_seqs(Harness& h);
void cases_moe(Harness& h);

}  // namespace dsv4::cudatest
