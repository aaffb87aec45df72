#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/thread_pool.h"
#include "quant/quant.h"

namespace dsv4 {
namespace cpu {

namespace {
std::unique_ptr<ThreadPool> g_pool;
std::once_flag g_pool_once;
thread_local ThreadPool* t_pool = nullptr;  // the pool of the backend whose op this thread is running
}  // namespace

ThreadPool& pool() {
  if (t_pool) return *t_pool;
  std::call_once(g_pool_once, [] { g_pool = std::make_unique<ThreadPool>(0); });
  return *g_pool;
}

PoolScope::PoolScope(ThreadPool& p) : prev_(t_pool) { t_pool = &p; }
PoolScope::~PoolScope() { t_pool = prev_; }

namespace {
typedef float F4 __attribute__((vector_size(16)));

// acc + x * p[0..3] (element-wise IEEE operations: the same results as four scalar lanes; the default build
// has no FMA contraction).
inline F4 mac(F4 acc, F4 x, const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return acc + x * v;
}

// The end of one dot: lanes lo (0-3) and hi (4-7) after the first i elements, the tail i..n-1 added to lanes
// 0.., then the fixed tree.
inline float fold(F4 lo, F4 hi, const float* a, const float* b, int64_t i, int64_t n) {
  float t[8] = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
  for (int k = 0; i < n; ++i, ++k) t[k] += a[i] * b[i];
  return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}
}  // namespace

// Lane k sums a[i] * b[i] over i = k (mod 8) in order (lanes 0-3 in lo, 4-7 in hi), then a fixed tree (fold).
// The lanes are vector values passed and returned by value, not an array or references, so that they stay in
// registers in every build: memory whose address is taken would be instrumented stack memory under
// AddressSanitizer, ~15x slower there (CI's sanitizer phase runs the CPU tests, and this loop is half of a CPU
// forward pass).
float dot(const float* a, const float* b, int64_t n) {
  F4 lo = {0, 0, 0, 0}, hi = lo;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    F4 a0, a1;
    std::memcpy(&a0, a + i, sizeof a0);
    std::memcpy(&a1, a + i + 4, sizeof a1);
    lo = mac(lo, a0, b + i);
    hi = mac(hi, a1, b + i + 4);
  }
  return fold(lo, hi, a, b, i, n);
}

// Four chains, each dot's steps on the same a: each result is dot(a, b[j], n) bit for bit.
void dot4(const float* a, const float* const b[4], int64_t n, float out[4]) {
  F4 l0 = {0, 0, 0, 0}, h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
  const float *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    F4 a0, a1;
    std::memcpy(&a0, a + i, sizeof a0);
    std::memcpy(&a1, a + i + 4, sizeof a1);
    l0 = mac(l0, a0, b0 + i);
    h0 = mac(h0, a1, b0 + i + 4);
    l1 = mac(l1, a0, b1 + i);
    h1 = mac(h1, a1, b1 + i + 4);
    l2 = mac(l2, a0, b2 + i);
    h2 = mac(h2, a1, b2 + i + 4);
    l3 = mac(l3, a0, b3 + i);
    h3 = mac(h3, a1, b3 + i + 4);
  }
  out[0] = fold(l0, h0, a, b0, i, n);
  out[1] = fold(l1, h1, a, b1, i, n);
  out[2] = fold(l2, h2, a, b2, i, n);
  out[3] = fold(l3, h3, a, b3, i, n);
}

void weight_row(const Tensor& w, int64_t r, float* dst) {
  if (w.type == GgmlType::F32) {
    std::memcpy(dst, w.row(r), static_cast<size_t>(w.ne[0]) * 4);
    return;
  }
  quant::dequantize_row(w.type, w.row(r), dst, w.ne[0]);
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace cpu

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) {}
  ~CpuBackend() override {
    for (auto& [p, n] : allocs_) std::free(p);
  }
  BackendKind kind() const override { return BackendKind::CPU; }
  std::string name() const override { return strfmt("cpu (%d threads)", pool_.size()); }

  Tensor alloc(GgmlType type, int64_t n0, int64_t n1, int64_t n2, int64_t n3) override {
    Tensor t = make_tensor(nullptr, type, n0, n1, n2, n3);
    size_t bytes = (t.n_bytes() + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, std::max<size_t>(bytes, 64));
    DSV4_ASSERT(p != nullptr, "out of memory allocating %zu bytes", bytes);
    std::memset(p, 0, bytes);
    std::lock_guard<std::mutex> lock(mu_);
    allocs_[p] = bytes;
    t.data = p;
    return t;
  }
  void free(Tensor& t) override {
    if (!t.data) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocs_.find(t.data);
    DSV4_ASSERT(it != allocs_.end(), "free of a tensor this backend did not allocate");
    std::free(it->first);
    allocs_.erase(it);
    t.data = nullptr;
  }
  expected<Tensor> upload_weight(const void* host, GgmlType type, const int64_t ne[4]) override {
    return make_tensor(const_cast<void*>(host), type, ne[0], ne[1], ne[2], ne[3]);
  }
  void write(const Tensor& dst, const void* host, size_t bytes, size_t offset) override {
    DSV4_ASSERT(offset + bytes <= dst.n_bytes(), "write past the end of a tensor");
    std::memcpy(static_cast<uint8_t*>(dst.data) + offset, host, bytes);
  }
  void read(const Tensor& src, void* host, size_t bytes, size_t offset) override {
    DSV4_ASSERT(offset + bytes <= src.n_bytes(), "read past the end of a tensor");
    std::memcpy(host, static_cast<const uint8_t*>(src.data) + offset, bytes);
  }
  void fill(const Tensor& dst, float value) override {
    if (dst.type != GgmlType::F32 && value == 0.0f) {  // compact KV rows: all-zero bytes read as zeros
      std::memset(dst.data, 0, dst.n_bytes());
      return;
    }
    float* p = dst.f32();
    std::fill(p, p + dst.n_elements(), value);
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    DSV4_ASSERT(dst.n_bytes() == src.n_bytes(), "copy between tensors of different sizes");
    std::memmove(dst.data, src.data, src.n_bytes());
  }
  bool copy_to(const Tensor& src, Backend& to, const Tensor& dst) override {
    if (to.kind() != BackendKind::CPU) return false;
    DSV4_ASSERT(dst.n_bytes() == src.n_bytes(), "copy between tensors of different sizes");
    std::memmove(dst.data, src.data, src.n_bytes());  // (every CPU backend's tensors are host memory)
    return true;
  }
  void synchronize() override {}

  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<OpTiming> take_profile() override {
    std::vector<OpTiming> out;
    for (auto& [k, t] : profile_) out.push_back(t);
    profile_.clear();
    std::sort(out.begin(), out.end(), [](const OpTiming& a, const OpTiming& b) { return a.seconds > b.seconds; });
    return out;
  }

  void embed(const EmbedOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("embed") : std::string());
    cpu::embed(op);
  }
  void hc_pre(const HcPreOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("hc_pre") : std::string());
    cpu::hc_pre(op);
    if (op.norm_out)
      cpu::rms_norm({.out = op.norm_out,
                     .x = op.u,
                     .w = op.norm_w,
                     .eps = op.norm_rms_eps,
                     .quant = op.norm_quant,
                     .q = op.norm_q});
  }
  void hc_post(const HcPostOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("hc_post") : std::string());
    cpu::hc_post(op);
  }
  void hc_head(const HcHeadOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("hc_head") : std::string());
    cpu::hc_head(op);
  }
  void rms_norm(const RmsNormOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("rms_norm") : std::string());
    cpu::rms_norm(op);
  }
  void matmul(const MatmulOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("matmul", &op) : std::string());
    cpu::matmul(op);
  }
  void rope(const RopeOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("rope") : std::string());
    cpu::rope(op);
  }
  void quant_sim(const QuantSimOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("quant_sim") : std::string());
    cpu::quant_sim(op);
  }
  void act_quant(const ActQuantOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("act_quant") : std::string());
    cpu::act_quant(op);
  }
  void store_rows(const StoreRowsOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("store_rows") : std::string());
    cpu::store_rows(op);
  }
  void compress(const CompressOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("compress") : std::string());
    cpu::compress(op);
  }
  void indexer_scores(const IndexerScoresOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("indexer_scores") : std::string());
    cpu::indexer_scores(op);
  }
  void topk(const TopKOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("topk") : std::string());
    cpu::topk(op);
  }
  void attention(const AttentionOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("attention") : std::string());
    cpu::attention(op);
  }
  void moe_route(const MoeRouteOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("moe_route") : std::string());
    cpu::moe_route(op);
  }
  void moe_experts(const MoeExpertsOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("moe_experts") : std::string());
    cpu::moe_experts(op);
  }
  void swiglu(const SwigluOp& op) override {
    Timed t(this, profiling_ ? op_profile_key("swiglu") : std::string());
    cpu::swiglu(op);
  }
  void add(const AddOp& op) override {
    float* o = op.out.f32();
    const float* x = op.x.f32();
    DSV4_ASSERT(op.out.n_elements() == op.x.n_elements(), "add: size mismatch");
    for (int64_t i = 0; i < op.out.n_elements(); ++i) o[i] += x[i];
  }
  void scale(const ScaleOp& op) override {
    float* x = op.x.f32();
    for (int64_t i = 0; i < op.x.n_elements(); ++i) x[i] *= op.s;
  }

 private:
  // Every op runs inside one: its loops go to this backend's pool (cpu::pool()), and with profiling on, the
  // wall time of the call is added to the profile under `key` (ops run synchronously on the CPU).
  struct Timed {
    CpuBackend* be;
    std::string key;
    std::chrono::steady_clock::time_point t0;
    cpu::PoolScope scope;
    Timed(CpuBackend* b, std::string k)
        : be(b), key(std::move(k)), t0(std::chrono::steady_clock::now()), scope(b->pool_) {}
    ~Timed() {
      if (key.empty()) return;
      OpTiming& t = be->profile_[key];
      t.key = key;
      t.calls++;
      t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };

  ThreadPool pool_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> allocs_;
  bool profiling_ = false;
  std::map<std::string, OpTiming> profile_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace dsv4
