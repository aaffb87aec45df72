// CudaBackend: device selection, one stream, device memory, weight upload
// (pinned double-buffered staging filled by 8 copy threads, measured rate), host transfers, and the
// op dispatch to the kernel launchers of the cuda_*.cu files.
//
// Ordering: everything (memsets, copies, kernels) runs on one stream, so ops
// see each other's results in call order without host synchronisation;
// read() and synchronize() are the only calls that wait for the device.
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

#include <unistd.h>

#include "backend/cuda/cuda_attention.cuh"
#include "backend/cuda/cuda_blas.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_compress.cuh"
#include "backend/cuda/cuda_dense.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_expert_prefetch.cuh"
#include "backend/cuda/cuda_expert_stream.cuh"
#include "backend/cuda/cuda_host_experts.cuh"
#include "backend/cuda/cuda_host_ranges.h"
#include "backend/cuda/cuda_indexer.cuh"
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/cuda_mhc.cuh"
#include "backend/cuda/cuda_moe.cuh"
#include "core/host_memory.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "quant/dot_fast.h"
#include "quant/quant.h"

namespace dsv4 {

namespace cuda {

void cuda_fatal(cudaError_t err, const char* stmt, const char* file, int line) {
  std::fprintf(stderr, "dsv4: fatal CUDA error %s: %s\n  statement: %s\n  at %s:%d\n", cudaGetErrorName(err),
               cudaGetErrorString(err), stmt, file, line);
  std::fflush(stderr);
  std::abort();
}

DeviceScratch::~DeviceScratch() {
  if (ptr_) CUDA_CHECK(cudaFree(ptr_));
}

void* DeviceScratch::get(size_t bytes, cudaStream_t stream) {
  if (bytes <= bytes_ && ptr_) return ptr_;
  if (ptr_) {
    CUDA_CHECK(cudaStreamSynchronize(stream));  // kernels queued earlier may still read the old buffer
    CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
  }
  const size_t mib = size_t{1} << 20;
  const size_t want = (std::max({bytes, bytes_ + bytes_ / 2, mib}) + mib - 1) / mib * mib;
  const cudaError_t e = malloc_evicting(&ptr_, want, evictable_, stream);
  if (e == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total_b = 0;
    (void)cudaGetLastError();
    (void)cudaMemGetInfo(&free_b, &total_b);
    DSV4_ASSERT(false, "CUDA backend: out of device memory for %zu bytes of scratch (%.2f GiB free of %.2f GiB)", want,
                static_cast<double>(free_b) / (1u << 30), static_cast<double>(total_b) / (1u << 30));
  }
  CUDA_CHECK(e);
  bytes_ = want;
  ++generation_;
  return ptr_;
}

namespace {
std::atomic<bool> g_pdl{false};
}  // namespace

bool pdl_enabled() { return g_pdl.load(std::memory_order_relaxed); }
void set_pdl_enabled(bool on) { g_pdl.store(on, std::memory_order_relaxed); }

namespace {

__global__ void probe_kernel(int* p) {
  pdl_enter();
  if (p) *p = 1;
}

}  // namespace

}  // namespace cuda

namespace {

using namespace cuda;

constexpr size_t k_staging_bytes = size_t{64} << 20;  // per pinned staging buffer (two of them)
constexpr int k_copy_threads = 8;                     // threads filling a staging buffer

double gib(size_t b) { return static_cast<double>(b) / static_cast<double>(size_t{1} << 30); }

class CudaBackend final : public Backend {
 public:
  // `blas`: the loaded cuBLAS or nullptr, with `blas_why` saying why not (make_cuda_backend).
  CudaBackend(int device, const cudaDeviceProp& prop, const CudaBackendOptions& opts, std::unique_ptr<Blas> blas,
              const std::string& blas_why)
      : device_(device), opts_(opts), blas_(std::move(blas)) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&fork_ev_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&join_ev_, cudaEventDisableTiming));
    // IQ2_XXS tables.
    CUDA_CHECK(cudaMalloc(&tables_mem_, 256 * sizeof(uint64_t) + 128));
    // On the op stream (a non-blocking stream does not wait for legacy-stream copies).
    CUDA_CHECK(
        cudaMemcpyAsync(tables_mem_, quant::iq2xxs_grid(), 256 * sizeof(uint64_t), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(tables_mem_) + 256 * sizeof(uint64_t), quant::iq2xxs_signs(), 128,
                               cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    ctx_.stream = stream_;
    ctx_.tables.iq2_grid = static_cast<const uint64_t*>(tables_mem_);
    ctx_.tables.iq2_signs = static_cast<const uint8_t*>(tables_mem_) + 256 * sizeof(uint64_t);
    ctx_.scratch = &scratch_;
    ctx_.sm_count = prop.multiProcessorCount;
    ctx_.tensor_cores = opts_.tensor_cores && prop.major >= 8;
    ctx_.int_dot = ctx_.tensor_cores && opts_.int_dot;
    ctx_.int8_matvec = ctx_.tensor_cores && opts_.int8_matvec;
    ctx_.int8_tiles = ctx_.tensor_cores && opts_.int8_tiles;
    ctx_.fuse_act_quant = opts_.act_quant_fusion != ActQuantFusion::OFF;
    ctx_.fuse_act_quant_norms = opts_.act_quant_fusion == ActQuantFusion::ALL;
    ctx_.token_matvec = opts_.token_matvec;
    // cuBLAS for the prefill matmuls (cuda_gemm.cu) when it loaded (with tensor cores only: the same contract).
    ctx_.blas = blas_.get();
    ctx_.gemm_min_tokens = opts_.gemm_min_tokens;
    ctx_.ffma_max_tokens = opts_.ffma_max_tokens;
    // Not with an explicit --gpu-memory budget: the cache would live outside it (auto budgets leave it the
    // memory the placement does not take).
    if (blas_ && ctx_.tensor_cores && opts_.gemm_weight_cache && opts_.gpu_memory == 0) {
      gemm_cache_ = std::make_unique<GemmWeightCache>(opts_.gemm_cache_reserve);
      ctx_.gemm_cache = gemm_cache_.get();
      scratch_.set_evictable(gemm_cache_.get());  // out of memory: the splits go before an allocation fails
      side_scratch_.set_evictable(gemm_cache_.get());
    }
    ctx_.expert_gemm_min = ctx_.tensor_cores && expert_wgmma_available() ? opts_.expert_gemm_min : 0;
    ctx_.expert_gemm_codes = opts_.expert_gemm_codes;
    ctx_.fast_attention_terms = opts_.fast_attention_terms;
    ctx_.expert_group_min = opts_.expert_group_min;
    ctx_.expert_gather = opts_.expert_gather;
    ctx_.host_ranges = &registered_;
    // Branches on a second stream (branch_begin), unless turned off.
    branches_ = opts_.branches;
    // Programmatic dependent launch (cuda_launch.cuh) on Hopper and newer.
    set_pdl_enabled(prop.major >= 9 && opts_.pdl);
    name_ = strfmt("cuda:%d (%s, sm_%d%d, %d SMs, %.1f GiB%s)", device_, prop.name, prop.major, prop.minor,
                   prop.multiProcessorCount, gib(prop.totalGlobalMem), ctx_.tensor_cores ? "" : ", FFMA prefill tiles");
    if (opts_.print_properties) {
      size_t free_b = 0, total_b = 0;
      CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
      log_info(
          "cuda: device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free), L2 %.0f MiB, "
          "%zu KiB shared memory per block (opt-in); prefill matmuls on %s%s%s; programmatic dependent launch %s; %s",
          device_, prop.name, prop.major, prop.minor, prop.multiProcessorCount, gib(total_b), gib(free_b),
          static_cast<double>(prop.l2CacheSize) / (1 << 20), prop.sharedMemPerBlockOptin / 1024,
          ctx_.tensor_cores ? "tensor cores" : "FFMA tiles",
          ctx_.int_dot ? ", decode experts on integer dot products" : "",
          (ctx_.expert_gemm_min == 0
               ? (opts_.expert_gemm_min == 0 || !ctx_.tensor_cores
                      ? std::string()
                      : std::string(", no grouped expert GEMM (needs an sm_90a build and device)"))
           : ctx_.expert_gemm_min == k_expert_gemm_auto
               ? ", prefill experts of >= N assignments on the grouped GEMM (wgmma; N by weight type: " +
                     expert_gemm_auto_text() + ")"
               : strfmt(", prefill experts of >= %d assignments on the grouped GEMM (wgmma)", ctx_.expert_gemm_min))
              .c_str(),
          pdl_enabled() ? "on" : "off",
          blas_ ? strfmt("matmuls of >= %lld tokens on %s", static_cast<long long>(ctx_.gemm_min_tokens),
                         blas_->library().c_str())
                      .c_str()
                : ("cuBLAS not used: " + blas_why).c_str());
    }
  }

  ~CudaBackend() override {
    use_device();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_runner_.reset();
    prefetcher_.reset();
    expert_stream_.reset();
    scratch_.set_evictable(nullptr);
    side_scratch_.set_evictable(nullptr);
    gemm_cache_.reset();
    for (auto& [p, n] : allocs_) CUDA_CHECK(cudaFree(p));
    allocs_.clear();
    for (auto& [lo, hi] : host_regs_) CUDA_CHECK(cudaHostUnregister(reinterpret_cast<void*>(lo)));
    host_regs_.clear();
    for (int i = 0; i < 2; ++i) {
      if (staging_[i]) CUDA_CHECK(cudaFreeHost(staging_[i]));
      if (staged_[i]) CUDA_CHECK(cudaEventDestroy(staged_[i]));
    }
    for (auto& [id, r] : recordings_) CUDA_CHECK(cudaGraphExecDestroy(r.exec));
    CUDA_CHECK(cudaFree(tables_mem_));
    for (auto& r : records_) {
      CUDA_CHECK(cudaEventDestroy(r.start));
      CUDA_CHECK(cudaEventDestroy(r.stop));
    }
    for (cudaEvent_t e : free_events_) CUDA_CHECK(cudaEventDestroy(e));
    CUDA_CHECK(cudaEventDestroy(fork_ev_));
    CUDA_CHECK(cudaEventDestroy(join_ev_));
    if (copy_done_) CUDA_CHECK(cudaEventDestroy(copy_done_));
    if (copy_ready_) CUDA_CHECK(cudaEventDestroy(copy_ready_));
    CUDA_CHECK(cudaStreamDestroy(side_));
    CUDA_CHECK(cudaStreamDestroy(stream_));
  }

  BackendKind kind() const override { return BackendKind::CUDA; }

  void set_profiling(bool on) override { profiling_ = on; }
  std::vector<OpTiming> take_profile() override {
    use_device();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::map<std::string, OpTiming> sum;
    for (auto& r : records_) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
      OpTiming& t = sum[r.key];
      t.key = r.key;
      t.calls++;
      t.seconds += ms / 1e3;
      free_events_.push_back(r.start);
      free_events_.push_back(r.stop);
    }
    records_.clear();
    std::vector<OpTiming> out;
    for (auto& [k, t] : sum) out.push_back(t);
    std::sort(out.begin(), out.end(), [](const OpTiming& a, const OpTiming& b) { return a.seconds > b.seconds; });
    return out;
  }
  std::string name() const override { return name_; }

  Tensor alloc(GgmlType type, int64_t n0, int64_t n1, int64_t n2, int64_t n3) override {
    use_device();
    Tensor t = make_tensor(nullptr, type, n0, n1, n2, n3);
    const size_t bytes = (std::max<size_t>(t.n_bytes(), 1) + 255) / 256 * 256;
    t.data = device_malloc(bytes, "an activation/state buffer");
    CUDA_CHECK(cudaMemsetAsync(t.data, 0, bytes, stream_));
    return t;
  }

  void free(Tensor& t) override {
    if (!t.data) return;
    use_device();
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = allocs_.find(t.data);
      DSV4_ASSERT(it != allocs_.end(), "free of a tensor this backend did not allocate");
      bytes = it->second;
      allocs_.erase(it);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));               // queued work may still use it
    if (gemm_cache_) gemm_cache_->drop_range(t.data, bytes);  // split copies of a freed weight
    CUDA_CHECK(cudaFree(t.data));
    t.data = nullptr;
    ++frees_;  // recorded graphs may point at it: they become stale
  }

  // Decode-step graphs. A recording is valid while no tensor was freed and the
  // scratch buffer did not move since it was made (replay checks both).
  bool capture_begin() override {
    if (profiling_ || !opts_.graphs) return false;  // per-op events need eager launches
    use_device();
    DSV4_ASSERT(!capturing_, "capture_begin while recording");
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    ctx_.capturing = true;
    return true;
  }
  uint64_t capture_end() override {
    use_device();
    DSV4_ASSERT(capturing_, "capture_end without capture_begin");
    DSV4_ASSERT(!in_branch_ && !branch_open_, "capture_end with a branch not joined");
    capturing_ = false;
    ctx_.capturing = false;
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    Recording r;
    CUDA_CHECK(cudaGraphInstantiate(&r.exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    r.frees = frees_;
    r.scratch_gen = scratch_.generation();
    r.side_scratch_gen = side_scratch_.generation();
    const uint64_t id = ++last_recording_;
    recordings_[id] = r;
    return id;
  }
  bool replay(uint64_t id) override {
    if (profiling_) return false;  // per-op events need eager launches
    auto it = recordings_.find(id);
    if (it == recordings_.end()) return false;
    if (it->second.frees != frees_ || it->second.scratch_gen != scratch_.generation() ||
        it->second.side_scratch_gen != side_scratch_.generation())
      return false;  // the caller drops it
    use_device();
    CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
    return true;
  }
  void drop_replay(uint64_t id) override {
    auto it = recordings_.find(id);
    if (it == recordings_.end()) return;
    use_device();
    CUDA_CHECK(cudaGraphExecDestroy(it->second.exec));
    recordings_.erase(it);
  }

  // Branches (Backend::branch_begin): the branch's ops go to a second stream
  // that first waits for everything queued on the main stream (fork event),
  // with a scratch buffer of its own; branch_join makes the main stream wait
  // for the branch (join event). In a graph capture the two events become the
  // graph's fork and join edges. Off while profiling (the per-op events time
  // the main stream) and with --no-cuda-branches.
  bool concurrent_branches() const override { return branches_ && !profiling_; }
  void branch_begin() override {
    DSV4_ASSERT(!in_branch_ && !branch_open_, "branch_begin inside a branch");
    if (!concurrent_branches()) return;
    use_device();
    CUDA_CHECK(cudaEventRecord(fork_ev_, stream_));
    CUDA_CHECK(cudaStreamWaitEvent(side_, fork_ev_, 0));
    ctx_.stream = side_;
    ctx_.scratch = &side_scratch_;
    ctx_.blas = nullptr;  // its workspace belongs to the main stream's work
    in_branch_ = true;
  }
  void branch_end() override {
    if (!in_branch_) return;
    CUDA_CHECK(cudaEventRecord(join_ev_, side_));
    ctx_.stream = stream_;
    ctx_.scratch = &scratch_;
    ctx_.blas = blas_.get();
    in_branch_ = false;
    branch_open_ = true;
  }
  void branch_join() override {
    DSV4_ASSERT(!in_branch_, "branch_join before branch_end");
    if (!branch_open_) return;
    CUDA_CHECK(cudaStreamWaitEvent(stream_, join_ev_, 0));
    branch_open_ = false;
  }

  std::optional<uint64_t> free_memory() override {
    use_device();
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    return static_cast<uint64_t>(free_b) +
           (gemm_cache_ ? gemm_cache_->bytes() : 0);  // the splits give way (malloc_evicting)
  }

  expected<Tensor> upload_weight(const void* host, GgmlType type, const int64_t ne[4]) override {
    use_device();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor t = make_tensor(nullptr, type, ne[0], ne[1], ne[2], ne[3]);
    const size_t bytes = t.n_bytes();
    const size_t padded = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    void* p = nullptr;
    const cudaError_t e = malloc_evicting(&p, padded, gemm_cache_.get(), stream_);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      return make_error(
          "out of GPU memory uploading a %s weight of %.3f GiB (%.2f GiB of weights already uploaded, "
          "%.2f GiB free of %.2f GiB): the model does not fit on this GPU",
          ggml_type_name(type), gib(bytes), gib(stats_.bytes), gib(free_b), gib(total_b));
    }
    CUDA_CHECK(e);
    {
      std::lock_guard<std::mutex> lock(mu_);
      allocs_[p] = padded;
    }
    copy_to_device(p, host, bytes);
    t.data = p;
    stats_.bytes += bytes;
    stats_.tensors += 1;
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (opts_.upload_progress) opts_.upload_progress(stats_.bytes);
    return t;
  }

  // Registers the host pages under the tensor with the driver (mapped, read-only where the device supports it)
  // and returns their device-usable address. Pages registered before (a neighbouring tensor's boundary page)
  // are not registered again: only the gaps between earlier ranges are. When RAM cannot pin them (or
  // --stream-experts on), the tensor stays pageable and its experts are streamed (cuda_expert_stream.cuh): the
  // returned tensor then holds the host address, which only the expert ops' staging reads.
  expected<Tensor> map_host_weight(const void* host, GgmlType type, const int64_t ne[4]) override {
    use_device();
    Tensor t = make_tensor(nullptr, type, ne[0], ne[1], ne[2], ne[3]);
    const size_t bytes = t.n_bytes();
    if (bytes == 0) return t;
    const int64_t expert_bytes = static_cast<int64_t>(bytes) / std::max<int64_t>(ne[2], 1);
    if (expert_stream_)
      if (Status st = expert_stream_->note_expert_bytes(expert_bytes); !st) return st.error();
    const std::string what = strfmt("%s weights left in host memory", ggml_type_name(type));
    std::string why;  // non-empty: stream this tensor
    if (opts_.stream_experts == StreamExperts::ON) why = "--stream-experts on";
    if (opts_.stream_experts == StreamExperts::AUTO && streamed_bytes_ > 0) why = "earlier host experts streamed";
    if (opts_.stream_experts == StreamExperts::AUTO && opts_.host_pin_limit > 0 &&
        pinned_bytes_ + bytes > opts_.host_pin_limit)
      why = "the test's pin limit";
    // Registering pins the pages: RAM for those not resident yet, checked first (a clear error, not the OOM killer).
    if (why.empty())
      if (auto avail = mem_available())
        if (Status st = check_pinnable(host, bytes, *avail, uint64_t{1} << 30, what); !st) {
          if (opts_.stream_experts == StreamExperts::OFF) return st.error().with_context("--stream-experts off");
          why = st.error().message;
        }
    if (why.empty()) {
      auto dev = register_host(host, bytes, type);
      if (dev) {
        t.data = *dev;
        registered_.add({static_cast<const uint8_t*>(*dev), static_cast<const uint8_t*>(host), bytes, expert_bytes});
        pinned_bytes_ += bytes;
        start_host_experts();
        return t;
      }
      if (opts_.stream_experts == StreamExperts::OFF) return dev.error();
      why = dev.error().message;
    }
    if (!opts_.expert_gather)
      return make_error(
          "%s cannot be pinned (%s), and --no-expert-gather reads host experts in place, which needs them "
          "pinned: drop --no-expert-gather to stream them from the model file",
          what.c_str(), why.c_str());
    if (!expert_stream_) {
      expert_stream_ = std::make_unique<ExpertStreamRunner>(opts_.cpu_expert_threads);
      ctx_.expert_stream = expert_stream_.get();
      for (const auto& [key, r] : registered_.all())
        if (Status st = expert_stream_->note_expert_bytes(r.expert_bytes); !st) return st.error();
      if (Status st = expert_stream_->note_expert_bytes(expert_bytes); !st) return st.error();
    }
    if (Status st = expert_stream_->add_streamed(host, bytes); !st) return st.error();
    if (streamed_bytes_ == 0)
      log_info(
          "cuda: routed experts in host memory from here on stay in the model file, not pinned (%s): the host "
          "copies each step's (%d threads; pages not in RAM come from the disk) through %.0f MiB of pinned "
          "slots (--stream-experts)",
          why.c_str(), expert_stream_->threads(), static_cast<double>(expert_stream_->pinned_bytes()) / (1 << 20));
    streamed_bytes_ += bytes;
    t.data = const_cast<void*>(host);
    return t;
  }

  // The device-usable address of registered host memory [host, host + bytes) (see map_host_weight).
  expected<void*> register_host(const void* host, size_t bytes, GgmlType type) {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t lo = reinterpret_cast<uintptr_t>(host) / page * page;
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(host) + bytes + page - 1) / page * page;
    int read_only = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, device_));
    const unsigned flags = cudaHostRegisterMapped | (read_only ? cudaHostRegisterReadOnly : 0u);
    auto reg = [&](uintptr_t a, uintptr_t b) -> Status {
      const cudaError_t e = cudaHostRegister(reinterpret_cast<void*>(a), b - a, flags);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return make_error("cannot register %.3f GiB of host memory for the GPU to read (%s): %s", gib(b - a),
                          ggml_type_name(type), cudaGetErrorString(e));
      }
      host_regs_[a] = b;
      return {};
    };
    uintptr_t cur = lo;
    auto it = host_regs_.upper_bound(lo);
    if (it != host_regs_.begin() && std::prev(it)->second > lo) --it;
    for (; it != host_regs_.end() && it->first < hi; ++it) {
      if (it->first > cur)
        if (Status st = reg(cur, it->first); !st) return st.error();
      cur = std::max(cur, it->second);
    }
    if (cur < hi)
      if (Status st = reg(cur, hi); !st) return st.error();
    void* dev = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(&dev, const_cast<void*>(host), 0));
    return dev;
  }

  // Host experts: the CPU computes a share of each decode step's experts from the same bytes.
  void start_host_experts() {
    if (opts_.cpu_experts == 0.0f || !opts_.expert_gather || host_runner_) return;
    host_runner_ = std::make_unique<HostExpertRunner>(opts_.cpu_expert_threads, opts_.cpu_experts);
    ctx_.host_experts = host_runner_.get();
    log_info(
        "cuda: host experts: %d CPU threads (%s dots) compute a share of each decode step's experts in host memory",
        host_runner_->threads(), quant::dot_fast_isa());
  }

  CudaUploadStats upload_stats() {
    use_device();
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.host_pinned_bytes = pinned_bytes_;
    stats_.host_streamed_bytes = streamed_bytes_;
    return stats_;
  }

  // The host buffer may be reused as soon as write returns (pageable memory is
  // staged by the driver before cudaMemcpyAsync returns).
  void write(const Tensor& dst, const void* host, size_t bytes, size_t offset) override {
    DSV4_ASSERT(offset + bytes <= dst.n_bytes(), "write past the end of a tensor");
    if (bytes == 0) return;
    use_device();
    CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + offset, host, bytes, cudaMemcpyHostToDevice, stream_));
  }

  void read(const Tensor& src, void* host, size_t bytes, size_t offset) override {
    DSV4_ASSERT(offset + bytes <= src.n_bytes(), "read past the end of a tensor");
    if (bytes == 0) return;
    use_device();
    CUDA_CHECK(
        cudaMemcpyAsync(host, static_cast<const uint8_t*>(src.data) + offset, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void fill(const Tensor& dst, float value) override {
    use_device();
    if (dst.type != GgmlType::F32 && value == 0.0f) {  // compact KV rows: all-zero bytes read as zeros
      CUDA_CHECK(cudaMemsetAsync(dst.data, 0, dst.n_bytes(), stream_));
      return;
    }
    launch_fill(ctx_, dst.f32(), dst.n_elements(), value);
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    DSV4_ASSERT(dst.n_bytes() == src.n_bytes(), "copy between tensors of different sizes");
    if (src.n_bytes() == 0) return;
    use_device();
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.n_bytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  // To another CUDA backend: the copy on this stream once `to`'s earlier work is done (dst may be a buffer
  // that work still reads: an event on `to`'s stream), peer-to-peer where the devices allow it (enabled once
  // per pair; else the driver stages it); then `to`'s stream waits for the copy (an event on this one).
  bool copy_to(const Tensor& src, Backend& to, const Tensor& dst) override {
    if (to.kind() != BackendKind::CUDA) return false;
    DSV4_ASSERT(dst.n_bytes() == src.n_bytes(), "copy between tensors of different sizes");
    auto& peer = static_cast<CudaBackend&>(to);
    if (src.n_bytes() == 0) return true;
    use_device();
    if (peer.device_ != device_ && peer_enabled_.insert(peer.device_).second) {
      int can = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, peer.device_));
      if (can) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(peer.device_, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CUDA_CHECK(e);
        (void)cudaGetLastError();
      }
    }
    peer.use_device();
    if (!peer.copy_ready_) CUDA_CHECK(cudaEventCreateWithFlags(&peer.copy_ready_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(peer.copy_ready_, peer.stream_));
    use_device();
    CUDA_CHECK(cudaStreamWaitEvent(stream_, peer.copy_ready_, 0));
    CUDA_CHECK(cudaMemcpyPeerAsync(dst.data, peer.device_, src.data, device_, src.n_bytes(), stream_));
    if (!copy_done_) CUDA_CHECK(cudaEventCreateWithFlags(&copy_done_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(copy_done_, stream_));
    peer.use_device();
    CUDA_CHECK(cudaStreamWaitEvent(peer.stream_, copy_done_, 0));
    return true;
  }

  void synchronize() override {
    use_device();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void embed(const EmbedOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("embed") : std::string());
    launch_embed(ctx_, op);
  }
  void hc_pre(const HcPreOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("hc_pre") : std::string());
    launch_hc_pre(ctx_, op);
    if (opts_.dup(CudaDupOp::HC_PRE)) launch_hc_pre(ctx_, op);  // --dup-ops
  }
  void hc_post(const HcPostOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("hc_post") : std::string());
    launch_hc_post(ctx_, op);
  }
  void hc_head(const HcHeadOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("hc_head") : std::string());
    launch_hc_head(ctx_, op);
    if (opts_.dup(CudaDupOp::HC_HEAD)) launch_hc_head(ctx_, op);  // --dup-ops
  }
  void rms_norm(const RmsNormOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("rms_norm") : std::string());
    launch_rms_norm(ctx_, op);
    if (opts_.dup(CudaDupOp::RMS_NORM) && op.out.data != op.x.data) launch_rms_norm(ctx_, op);  // --dup-ops
  }
  void matmul(const MatmulOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("matmul", &op) : std::string());
    launch_matmul(ctx_, op);
    if (opts_.dup(CudaDupOp::MATMUL) && !op.accumulate && op.out.data != op.x.data)
      launch_matmul(ctx_, op);  // --dup-ops
  }
  void matmuls(const MatmulsOp& op) override {
    use_device();
    std::string key;
    if (profiling_ && op.count > 0) {  // e.g. "matmuls F16 1024+1024+64x4096 n=1"
      key = strfmt("matmuls %s ", ggml_type_name(op.w[0].type));
      for (int i = 0; i < op.count; ++i)
        key += strfmt("%s%lld", i ? "+" : "", static_cast<long long>(op.w[i].n_rows()));
      key += strfmt("x%lld%s", static_cast<long long>(op.w[0].ne[0]), op.x.n_rows() == 1 ? " n=1" : " n>1");
    }
    Timed t(this, key);
    launch_matmuls(ctx_, op);
    if (opts_.dup(CudaDupOp::MATMULS)) launch_matmuls(ctx_, op);  // --dup-ops
  }
  void rope(const RopeOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("rope") : std::string());
    launch_rope(ctx_, op);
  }
  void quant_sim(const QuantSimOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("quant_sim") : std::string());
    launch_quant_sim(ctx_, op);
  }
  void act_quant(const ActQuantOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("act_quant") : std::string());
    launch_act_quant(ctx_, op);
  }
  void store_rows(const StoreRowsOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("store_rows") : std::string());
    launch_store_rows(ctx_, op);
    if (opts_.dup(CudaDupOp::STORE_ROWS)) launch_store_rows(ctx_, op);  // --dup-ops
  }
  void compress(const CompressOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("compress") : std::string());
    launch_compress(ctx_, op);
  }
  void indexer_scores(const IndexerScoresOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("indexer_scores") : std::string());
    launch_indexer_scores(ctx_, op);
    if (opts_.dup(CudaDupOp::INDEXER_SCORES)) launch_indexer_scores(ctx_, op);  // --dup-ops
  }
  void topk(const TopKOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("topk") : std::string());
    launch_topk(ctx_, op);
    if (opts_.dup(CudaDupOp::TOPK)) launch_topk(ctx_, op);  // --dup-ops
  }
  void attention(const AttentionOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("attention") : std::string());
    launch_attention(ctx_, op);
    if (opts_.dup(CudaDupOp::ATTENTION) && op.out.data != op.q.data) launch_attention(ctx_, op);  // --dup-ops
  }
  void store_rows_seqs(std::span<const StoreRowsOp> ops) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("store_rows") : std::string());
    launch_store_rows_seqs(ctx_, ops);
    if (opts_.dup(CudaDupOp::STORE_ROWS)) launch_store_rows_seqs(ctx_, ops);  // --dup-ops
  }
  void compress_seqs(std::span<const CompressOp> ops) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("compress") : std::string());
    launch_compress_seqs(ctx_, ops);
  }
  void indexer_scores_seqs(std::span<const IndexerScoresOp> ops) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("indexer_scores") : std::string());
    launch_indexer_scores_seqs(ctx_, ops);
    if (opts_.dup(CudaDupOp::INDEXER_SCORES)) launch_indexer_scores_seqs(ctx_, ops);  // --dup-ops
  }
  void topk_seqs(std::span<const TopKOp> ops) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("topk") : std::string());
    launch_topk_seqs(ctx_, ops);
    if (opts_.dup(CudaDupOp::TOPK)) launch_topk_seqs(ctx_, ops);  // --dup-ops
  }
  void attention_seqs(std::span<const AttentionOp> ops) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("attention") : std::string());
    launch_attention_seqs(ctx_, ops);
    const bool in_place =
        std::any_of(ops.begin(), ops.end(), [](const AttentionOp& op) { return op.out.data == op.q.data; });
    if (opts_.dup(CudaDupOp::ATTENTION) && !in_place) launch_attention_seqs(ctx_, ops);  // --dup-ops
  }
  void moe_route(const MoeRouteOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("moe_route") : std::string());
    launch_moe_route(ctx_, op);
    if (opts_.dup(CudaDupOp::MOE_ROUTE)) launch_moe_route(ctx_, op);  // --dup-ops
  }
  void moe_experts(const MoeExpertsOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("moe_experts") : std::string());
    PrefetchedExperts pf;
    if (prefetcher_) pf = prefetcher_->take(ctx_, op);
    ctx_.prefetched = pf.slots ? &pf : nullptr;
    launch_moe_experts(ctx_, op);
    if (opts_.dup(CudaDupOp::MOE_EXPERTS) && !op.accumulate && op.out.data != op.x.data)
      launch_moe_experts(ctx_, op);  // --dup-ops
    if (pf.slots) prefetcher_->finish(ctx_);
    ctx_.prefetched = nullptr;
  }
  void moe_prefetch(const MoePrefetchOp& op) override {
    if (!opts_.expert_prefetch || !opts_.expert_gather || !op.slots || ctx_.capturing) return;
    if (expert_stream_ && (expert_stream_->streamed(op.gate_host.data) || expert_stream_->streamed(op.up_host.data) ||
                           expert_stream_->streamed(op.down_host.data)))
      return;  // pageable: the host stages them per op (cuda_expert_stream.cuh)
    use_device();
    if (!prefetcher_) prefetcher_ = std::make_unique<ExpertPrefetcher>();
    prefetcher_->prefetch(ctx_, op, [this](uint8_t* dst, const uint8_t* src, size_t n, cudaStream_t stream) {
      copy_from_registered(dst, src, n, stream);
    });
  }
  // Copies n bytes of registered host memory (src: the device-usable address map_host_weight returned) to device
  // memory on `stream` by the copy engine: one copy per registration the bytes span (a copy may not span two).
  void copy_from_registered(uint8_t* dst, const uint8_t* src, size_t n, cudaStream_t stream) {
    const HostRange* r = registered_.find(src);
    DSV4_ASSERT(r && src + n <= r->dev + r->bytes, "copy_from_registered: not registered host memory");
    const auto h = reinterpret_cast<uintptr_t>(r->host + (src - r->dev));
    for (uintptr_t a = h; a < h + n;) {
      auto it = host_regs_.upper_bound(a);
      DSV4_ASSERT(it != host_regs_.begin(), "copy_from_registered: a page not registered");
      --it;
      DSV4_ASSERT(a < it->second, "copy_from_registered: a page not registered");
      const uintptr_t b = std::min(h + n, it->second);
      CUDA_CHECK(
          cudaMemcpyAsync(dst + (a - h), reinterpret_cast<const void*>(a), b - a, cudaMemcpyHostToDevice, stream));
      a = b;
    }
  }
  void swiglu(const SwigluOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("swiglu") : std::string());
    launch_swiglu(ctx_, op);
    if (opts_.dup(CudaDupOp::SWIGLU) && op.out.data != op.gate.data && op.out.data != op.up.data)
      launch_swiglu(ctx_, op);  // --dup-ops
  }
  void add(const AddOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("add") : std::string());
    launch_add(ctx_, op);
  }
  void scale(const ScaleOp& op) override {
    use_device();
    Timed t(this, profiling_ ? op_profile_key("scale") : std::string());
    launch_scale(ctx_, op);
  }

 private:
  // Brackets one op with a pair of events on the stream (bench --profile);
  // take_profile() turns them into device times.
  struct Timed {
    CudaBackend* be;
    std::string key;
    cudaEvent_t start = nullptr;
    Timed(CudaBackend* b, std::string k) : be(b), key(std::move(k)) {
      if (key.empty()) return;
      start = be->event();
      CUDA_CHECK(cudaEventRecord(start, be->stream_));
    }
    ~Timed() {
      if (key.empty()) return;
      cudaEvent_t stop = be->event();
      CUDA_CHECK(cudaEventRecord(stop, be->stream_));
      be->records_.push_back({std::move(key), start, stop});
    }
  };
  struct Record {
    std::string key;
    cudaEvent_t start, stop;
  };
  cudaEvent_t event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  bool profiling_ = false;
  std::vector<Record> records_;
  struct Recording {
    cudaGraphExec_t exec = nullptr;
    uint64_t frees = 0, scratch_gen = 0, side_scratch_gen = 0;
  };
  std::unordered_map<uint64_t, Recording> recordings_;
  uint64_t last_recording_ = 0, frees_ = 0;
  bool capturing_ = false;
  // Branches (branch_begin): the second stream, its fork/join events, state.
  cudaStream_t side_ = nullptr;
  DeviceScratch side_scratch_;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  bool branches_ = true, in_branch_ = false, branch_open_ = false;
  std::vector<cudaEvent_t> free_events_;

  // The CUDA current device is per host thread; the engine may be driven from another thread than the one that made it.
  void use_device() const { CUDA_CHECK(cudaSetDevice(device_)); }

  void* device_malloc(size_t bytes, const char* what) {
    void* p = nullptr;
    const cudaError_t e = malloc_evicting(&p, bytes, gemm_cache_.get(), stream_);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      DSV4_ASSERT(false, "CUDA backend: out of device memory allocating %s of %zu bytes (%.2f GiB free of %.2f GiB)",
                  what, bytes, gib(free_b), gib(total_b));
    }
    CUDA_CHECK(e);
    std::lock_guard<std::mutex> lock(mu_);
    allocs_[p] = bytes;
    return p;
  }

  // Host -> device through two pinned staging buffers: the memcpy into one
  // buffer overlaps the DMA out of the other. Falls back to plain copies when
  // pinned memory is unavailable.
  void copy_to_device(void* dst, const void* host, size_t bytes) {
    if (bytes == 0) return;
    if (!staging_ready_) {
      staging_ready_ = true;
      for (int i = 0; i < 2; ++i) {
        if (cudaMallocHost(&staging_[i], k_staging_bytes) != cudaSuccess) {
          (void)cudaGetLastError();
          staging_[i] = nullptr;
        }
        CUDA_CHECK(cudaEventCreateWithFlags(&staged_[i], cudaEventDisableTiming));
      }
      if (!staging_[0] || !staging_[1]) log_warn("cuda: no pinned staging memory; weight uploads use pageable copies");
    }
    if (!staging_[0] || !staging_[1]) {
      CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
      return;
    }
    if (!copy_pool_) copy_pool_ = std::make_unique<ThreadPool>(k_copy_threads);
    for (size_t off = 0; off < bytes; off += k_staging_bytes) {
      const size_t len = std::min(k_staging_bytes, bytes - off);
      const int i = next_staging_;
      next_staging_ ^= 1;
      CUDA_CHECK(cudaEventSynchronize(staged_[i]));  // the DMA out of this buffer has finished
      // Page-cache reads (page faults + copy) run at ~5 GB/s on one core: split the
      // chunk over the copy threads, 1 MiB pieces.
      uint8_t* stage = static_cast<uint8_t*>(staging_[i]);
      const uint8_t* src = static_cast<const uint8_t*>(host) + off;
      const size_t piece = size_t{1} << 20, n_pieces = (len + piece - 1) / piece;
      copy_pool_->parallel_for(n_pieces, [&](size_t b, size_t e) {
        std::memcpy(stage + b * piece, src + b * piece, std::min(len, e * piece) - b * piece);
      });
      CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + off, staging_[i], len, cudaMemcpyHostToDevice, stream_));
      CUDA_CHECK(cudaEventRecord(staged_[i], stream_));
    }
  }

  int device_;
  CudaBackendOptions opts_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t copy_done_ = nullptr;   // copy_to: the last copy to another CUDA backend
  cudaEvent_t copy_ready_ = nullptr;  // copy_to from another CUDA backend: this stream's work before the copy
  std::set<int> peer_enabled_;        // devices this one's peer access was asked for
  void* tables_mem_ = nullptr;
  DeviceScratch scratch_;
  std::unique_ptr<Blas> blas_;
  std::unique_ptr<GemmWeightCache> gemm_cache_;  // declared after blas_: destroyed first
  CudaContext ctx_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> allocs_;
  std::map<uintptr_t, uintptr_t> host_regs_;       // registered host ranges [first, second), disjoint (map_host_weight)
  std::unique_ptr<HostExpertRunner> host_runner_;  // with host experts (map_host_weight) unless --cpu-experts off
  // Host experts that stay pageable (map_host_weight, --stream-experts) and the registered ones before them.
  std::unique_ptr<ExpertStreamRunner> expert_stream_;
  // Large batches' host experts copied in beside the attention (moe_prefetch); made at the first one.
  std::unique_ptr<ExpertPrefetcher> prefetcher_;
  HostRanges registered_;  // the host expert tensors registered (map_host_weight); ctx_.host_ranges
  uint64_t pinned_bytes_ = 0, streamed_bytes_ = 0;  // host expert tensors' bytes registered / streamed
  bool staging_ready_ = false;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staged_[2] = {nullptr, nullptr};
  int next_staging_ = 0;
  std::unique_ptr<ThreadPool> copy_pool_;  // host-side staging copies (made on the first upload)
  CudaUploadStats stats_;
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

bool cuda_device_present() { return cuda_device_count() > 0; }

expected<std::unique_ptr<Backend>> make_cuda_backend(int device, const CudaBackendOptions& options) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error("no usable CUDA device: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  if (count == 0) return make_error("no CUDA device found");
  if (device < 0 || device >= count)
    return make_error("CUDA device %d does not exist (%d device(s) found)", device, count);
  e = cudaSetDevice(device);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error("cannot use CUDA device %d: %s (%s)", device, cudaGetErrorName(e), cudaGetErrorString(e));
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  // Kernels for this device's architecture must be in the binary (CMAKE_CUDA_ARCHITECTURES).
  cudaFuncAttributes attr;
  e = cudaFuncGetAttributes(&attr, cuda::probe_kernel);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return make_error(
        "this build of dsv4 has no kernels for CUDA device %d (%s, compute capability %d.%d): %s; rebuild "
        "with -DCMAKE_CUDA_ARCHITECTURES=%d%d",
        device, prop.name, prop.major, prop.minor, cudaGetErrorString(e), prop.major, prop.minor);
  }
  DSV4_TRY(options.check());
  // cuBLAS for the prefill matmuls, with tensor cores only. "auto" falls back to the tile when the library is
  // missing (the start-up log says why); a library named by path must load.
  std::unique_ptr<Blas> blas;
  std::string blas_why = "tensor cores off";
  if (options.tensor_cores && prop.major >= 8) {
    blas = Blas::load(options.cublas, options.cublas_library, &blas_why);
    if (!blas && options.cublas == CublasMode::LIBRARY) return make_error("cuBLAS: %s", blas_why.c_str());
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, prop, options, std::move(blas), blas_why));
}

CudaUploadStats cuda_upload_stats(Backend& backend) {
  DSV4_ASSERT(backend.kind() == BackendKind::CUDA, "cuda_upload_stats on a %s backend", backend.name().c_str());
  return static_cast<CudaBackend&>(backend).upload_stats();
}

}  // namespace dsv4
