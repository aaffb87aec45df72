// Engine and Session: the public API over ModelFile + Backend + Model + KvState.
#include "dsv4/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#ifdef DSV4_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/log.h"
#include "core/progress.h"
#include "backend/options/cuda_options.h"
#include "kv/kv_file.h"
#include "kv/model_identity.h"
#include "kv/snapshot.h"
#include "model/model_file.h"
#include "model/pipeline.h"
#include "quant/quant.h"
#include "synth/synth.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {

// CUDA: 4,096 tokens per batch (measured on one H200 with the cuBLAS matmuls: +9% prefill over 2,048,
// 8,192 +6%; see PERFORMANCE.md; the state's fixed part grows with the batch, 114 MiB at 4,096).
int default_prefill_batch(bool cuda) { return cuda ? 4096 : 512; }

const char* backend_choice_name(BackendChoice b) {
  switch (b) {
    case BackendChoice::AUTO: return "auto";
    case BackendChoice::CPU: return "cpu";
    case BackendChoice::CUDA: return "cuda";
  }
  return "?";
}

expected<BackendChoice> backend_choice_from_name(std::string_view s) {
  if (s == "auto") return BackendChoice::AUTO;
  if (s == "cpu") return BackendChoice::CPU;
  if (s == "cuda") return BackendChoice::CUDA;
  return make_error("unknown backend \"%s\" (expected auto, cpu or cuda)", std::string(s).c_str());
}

std::string EngineOptions::describe() const {
  const std::string model = synthetic.empty() ? model_path
                                              : strfmt("synthetic:%s (seed %llu)", synthetic.c_str(),
                                                       static_cast<unsigned long long>(synthetic_seed));
  const std::string batch = prefill_batch > 0 ? std::to_string(prefill_batch) : "auto";
  const std::string skew = !synthetic.empty() && synthetic_router_skew > 0
                               ? strfmt(" router_skew=%g", synthetic_router_skew)
                               : std::string();
  const std::string stats = expert_stats.empty() ? std::string() : " expert_stats=" + expert_stats;
  const std::string switches = cuda ? cuda->describe() : std::string();
  const std::string drafters = (mtp_path.empty() ? std::string() : " mtp=" + mtp_path) +
                               (dspark_path.empty() ? std::string()
                                                    : strfmt(" dspark=%s dspark_confidence=%g", dspark_path.c_str(),
                                                             static_cast<double>(dspark_confidence)));
  const std::string stages = cpu_stages > 1 ? strfmt(" cpu_stages=%d", cpu_stages) : std::string();
  // Under fast numerics the inputs it leaves unquantised, the default's too (a CSV header says which set ran).
  const std::string skip = numerics == Numerics::FAST || fast_skip
                               ? " fast_skip=" + fast_sites_name(fast_skip.value_or(FAST_DEFAULT_SKIP))
                               : std::string();
  return strfmt("model=%s%s%s backend=%s%s numerics=%s%s ctx=%u threads=%d prefill_batch=%s%s%s%s", model.c_str(),
                skew.c_str(), drafters.c_str(), backend_choice_name(backend), stages.c_str(), numerics_name(numerics),
                skip.c_str(), ctx, threads, batch.c_str(), stats.c_str(), switches.empty() ? "" : " ",
                switches.c_str());
}

namespace {

// GPU memory a CUDA prefill batch works in beside the model's buffers (attention partials, the routed
// experts' activations and splits, the matmuls' splits); kept free when weights are placed (--gpu-memory).
constexpr uint64_t k_cuda_working_bytes = uint64_t{3} << 30;

double gib(uint64_t b) { return static_cast<double>(b) / static_cast<double>(uint64_t{1} << 30); }

// The backend named by --backend: cpu, cuda, or auto (CUDA when this build has
// it and a usable GPU is present, else CPU). `progress` (may be null) receives the
// bytes of weights uploaded so far (CUDA copies the weights to the device).
// `device`: the CUDA device (--gpus); `cpu_threads`: the CPU backend's threads (0: all cores).
expected<std::unique_ptr<Backend>> make_backend(const EngineOptions& o, int device, int cpu_threads,
                                                const std::function<void(uint64_t)>& progress) {
  const CudaOptions defaults;
  const CudaOptions& cuda = o.cuda ? *o.cuda : defaults;
#ifdef DSV4_HAS_CUDA
  if (o.backend == BackendChoice::CUDA || (o.backend == BackendChoice::AUTO && cuda_device_present())) {
    CudaBackendOptions co;
    static_cast<CudaOptions&>(co) = cuda;
    if (co.cpu_expert_threads == 0 && o.threads > 0) co.cpu_expert_threads = o.threads;  // --threads
    co.upload_progress = progress;
    auto be = make_cuda_backend(device, co);
    if (be) return std::move(*be);
    if (o.backend == BackendChoice::CUDA) return be.error().with_context("--backend cuda");
    // A cuBLAS library named by path asks for the GPU: no silent fall-back to the CPU.
    if (cuda.cublas == CublasMode::LIBRARY) return be.error().with_context("--cublas " + cuda.cublas_library);
    log_warn("--backend auto: the GPU is not usable (%s); using the CPU", be.error().message.c_str());
  }
#else
  (void)progress;
  (void)cuda;
  (void)device;
  if (o.backend == BackendChoice::CUDA)
    return make_error("this build of dsv4 has no CUDA backend (configure with -DDSV4_CUDA=ON)");
  if (!cuda.gpus.empty()) return make_error("--gpus: this build of dsv4 has no CUDA backend");
#endif
  return make_cpu_backend(cpu_threads);
}

// The CUDA devices of --gpus (all: every device; none: device 0).
expected<std::vector<int>> pipeline_devices(const EngineOptions& o) {
  const CudaOptions defaults;
  const CudaOptions& cuda = o.cuda ? *o.cuda : defaults;
  if (cuda.gpus.empty()) return std::vector<int>{0};
  if (cuda.gpus.front() >= 0) return cuda.gpus;
  std::vector<int> all;
#ifdef DSV4_HAS_CUDA
  for (int d = 0; d < cuda_device_count(); ++d) all.push_back(d);
#endif
  if (all.empty()) return make_error("--gpus all: no CUDA device");
  return all;
}

// The `dsv4 synth` model of o.synthetic built in a memfd and opened from there
// (the mapping keeps the memory once the descriptor is closed).
expected<std::unique_ptr<ModelFile>> open_synthetic(const EngineOptions& o) {
  DSV4_TRY_ASSIGN(Preset preset, find_preset(o.synthetic));
  SynthPlan plan = synth_plan(preset, o.synthetic_seed);
  plan.router_skew = o.synthetic_router_skew;
  std::unique_ptr<Progress> bar;
  const auto t0 = std::chrono::steady_clock::now();
  DSV4_TRY_ASSIGN(int fd, synth_memfd(plan, o.threads, [&](uint64_t done, uint64_t total) {
                    if (!o.show_progress) return;
                    if (!bar) bar = std::make_unique<Progress>("generating " + preset.name, total);
                    bar->update(done);
                  }));
  if (bar) bar->finish();
  auto file = open_model("/proc/self/fd/" + std::to_string(fd));
  ::close(fd);
  if (!file) return file.error().with_context("the synthetic " + preset.name + " model");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log_info("synthetic %s (seed %llu): %.2f GiB generated in memory in %.1f s", preset.name.c_str(),
           static_cast<unsigned long long>(o.synthetic_seed), static_cast<double>(plan.tensor_bytes) / (1ull << 30), s);
  return file;
}

// The model as a layer pipeline over `bes` (model/pipeline.h). The split from each stage's memory (CUDA:
// --gpu-memory, else the free memory, less 1 GiB and a prefill batch's working memory; CPU stages: equal
// shares): every weight resident when a split holds them all; else the split of the dense part, each stage
// keeping the routed experts that do not fit its GPU in host memory (as --gpu-memory does on one GPU).
expected<std::unique_ptr<Model>> load_pipeline(const std::vector<Backend*>& bes, const ModelWeights& w,
                                               const EngineOptions& o, const ModelOptions& mo) {
  const CudaOptions defaults;
  const CudaOptions& cuda = o.cuda ? *o.cuda : defaults;
  const uint64_t margin = uint64_t{1} << 30;
  std::vector<uint64_t> have, budgets;
  for (Backend* be : bes) {
    have.push_back(be->kind() != BackendKind::CUDA ? uint64_t{1} << 60
                   : cuda.gpu_memory               ? cuda.gpu_memory
                                                   : be->free_memory().value_or(0));
    const uint64_t keep = margin + (be->kind() == BackendKind::CUDA ? k_cuda_working_bytes : 0);
    budgets.push_back(have.back() > keep ? have.back() - keep : 0);
  }
  std::vector<StageMemory> memory;
  expected<std::vector<uint32_t>> first = plan_layer_split(layer_split_costs(w, mo, o.ctx, 1), budgets);
  if (!first) {
    const expected<std::vector<uint32_t>> dense =
        plan_layer_split(layer_split_costs(w, mo, o.ctx, 1, /*routed_experts=*/false), budgets);
    if (!dense) return dense.error().with_context("even with the routed experts in host memory");
    first = dense;
    for (size_t k = 0; k < bes.size(); ++k) {
      ModelOptions so = mo;
      so.layer_first = (*first)[k];
      so.layer_end = k + 1 < bes.size() ? (*first)[k + 1] : w.spec.n_layer;
      memory.push_back(StageMemory{have[k] > margin ? have[k] - margin : 1,
                                   kv_state_bytes(w.spec, so, false, o.ctx) + k_cuda_working_bytes});
    }
  }
  DSV4_TRY_ASSIGN(auto model, Model::create_pipeline(bes, w, *first, mo, memory));
  std::string plan;
  size_t k = 0;
  for (const Model* m = model.get(); m; m = m->next_stage(), ++k) {
    const WeightPlacement& p = m->placement();
    plan += strfmt("%slayers %u-%u on %s (%.2f GiB of weights", k ? ", " : "", m->layer_first(), m->layer_end() - 1,
                   bes[k]->name().c_str(), gib(p.dense_bytes + p.expert_bytes));
    plan +=
        p.host_expert_bytes ? strfmt("; %.2f GiB of routed experts in host memory)", gib(p.host_expert_bytes)) : ")";
  }
  log_info("pipeline: %s", plan.c_str());
  return model;
}

}  // namespace

struct Engine::Impl {
  EngineOptions opts;
  EngineInfo info;
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<GgufFile> mtp_file;
  MtpWeights mtp;
  std::unique_ptr<GgufFile> dspark_file;
  DSparkWeights dspark;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Backend> backend;
  std::vector<std::unique_ptr<Backend>> stage_backends;  // a layer pipeline's backends after the first
  std::unique_ptr<Model> model;
  std::string fingerprint;
  std::optional<ModelFileStamp> model_file;
  mutable std::mutex identity_mu;        // guards content_identity
  mutable std::string content_identity;  // "" until the first Engine::content_identity()
  ExpertStats stats_loaded;              // --expert-stats: the file's counts at load (empty: no file yet)
  ~Impl() { save_expert_stats(); }
  // Merges this run's routing counts into the --expert-stats file (a warning when that fails).
  void save_expert_stats() {
    if (opts.expert_stats.empty() || !model || model->routing_counts().empty()) return;
    ExpertStats all = model->routing_counts();
    const uint64_t counted = all.total();
    if (counted == 0) return;
    if (!stats_loaded.empty() && !all.merge(stats_loaded)) return;  // shapes checked at load
    if (Status st = expert_stats_save(opts.expert_stats, all); !st) {
      log_warn("routing statistics not saved: %s", st.error().message.c_str());
      return;
    }
    log_info(
        "routing statistics: %llu expert assignments counted, %llu in all, saved to %s (the most-used "
        "quarter of each layer's experts took %.0f%%)",
        static_cast<unsigned long long>(counted), static_cast<unsigned long long>(all.total()),
        opts.expert_stats.c_str(), 100.0 * all.top_share(0.25));
  }
};

struct Session::Impl {
  Engine::Impl* eng = nullptr;
  KvState state;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  struct Checkpoint {
    size_t n_tokens;
    std::vector<uint8_t> bytes;  // light snapshot
  };
  std::vector<Checkpoint> checkpoints;
  static constexpr size_t k_max_checkpoints = 4;

  ~Impl() {
    if (eng) eng->model->free_state(state);
  }
  Model& model() { return *eng->model; }
  uint32_t n_vocab() const { return eng->model->spec().n_vocab; }

  Status check_append(std::span<const int32_t> toks) const {
    if (tokens.size() + toks.size() > state.ctx)
      return make_error("context overflow: %zu tokens + %zu new exceed the session context of %u", tokens.size(),
                        toks.size(), state.ctx);
    for (size_t i = 0; i < toks.size(); ++i)
      if (toks[i] < 0 || static_cast<uint32_t>(toks[i]) >= n_vocab())
        return make_error("token id %d at index %zu is outside the vocabulary [0, %u)", toks[i], i, n_vocab());
    return {};
  }

  Status run(std::span<const int32_t> toks, const RunHooks& hooks) {
    DSV4_TRY(check_append(toks));
    const int64_t batch = model().options().max_batch;
    logits.resize(n_vocab());
    for (size_t b = 0; b < toks.size(); b += static_cast<size_t>(batch)) {
      if (hooks.cancelled && hooks.cancelled()) return make_error("cancelled");
      size_t nb = std::min(toks.size() - b, static_cast<size_t>(batch));
      DSV4_TRY(model().forward(state, toks.data() + b, static_cast<int64_t>(nb), static_cast<int64_t>(tokens.size()),
                               logits.data(), false));
      tokens.insert(tokens.end(), toks.begin() + static_cast<long>(b), toks.begin() + static_cast<long>(b + nb));
      if (hooks.progress) hooks.progress(b + nb, toks.size());
    }
    return {};
  }

  // After a verify pass of `toks` whose logits are `all` ([n][V]): commit the prefix `keep` chooses,
  // fill the MTP window from the kept rows, append them (Session::verify, Engine::step).
  expected<size_t> finish_verify(std::span<const int32_t> toks, const std::vector<float>& all,
                                 const std::function<size_t(std::span<const float>)>& keep) {
    const size_t V = n_vocab(), n = toks.size();
    const size_t asked = keep ? keep(std::span<const float>(all)) : n;
    // Commit whatever `keep` said (clamped): the verified rows must not stay half-applied.
    const size_t a = std::min(asked, n);
    DSV4_TRY(model().commit(state, static_cast<int64_t>(a)));
    // The MTP block's window from the kept rows: position p pairs p's state with token p + 1 (the last
    // kept position's next token is not known yet: the next draft writes that row).
    if (model().has_mtp() && a >= 2)
      DSV4_TRY(model().mtp_fill(state, toks.data() + 1, state.spec.hidden, static_cast<int64_t>(a - 1),
                                static_cast<int64_t>(tokens.size())));
    if (a > 0) {
      tokens.insert(tokens.end(), toks.begin(), toks.begin() + static_cast<long>(a));
      logits.assign(all.begin() + static_cast<long>((a - 1) * V), all.begin() + static_cast<long>(a * V));
    }
    if (asked > n) return make_error("verify: keep() returned %zu of %zu tokens", asked, n);
    return a;
  }

  void checkpoint() {
    if (tokens.empty()) return;
    if (!checkpoints.empty() && checkpoints.back().n_tokens == tokens.size()) return;
    checkpoints.push_back({tokens.size(), snapshot_save(model(), state, eng->fingerprint, tokens, logits, false)});
    if (checkpoints.size() > k_max_checkpoints) checkpoints.erase(checkpoints.begin());
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;
const EngineInfo& Engine::info() const { return impl_->info; }

const Tokenizer& Engine::tokenizer() const {
  DSV4_ASSERT(impl_->tokenizer != nullptr, "model has no tokenizer");
  return *impl_->tokenizer;
}

expected<std::unique_ptr<Engine>> Engine::load(const EngineOptions& o) {
  auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  impl->opts = o;
  const Numerics numerics = o.numerics;
  if (o.prefill_batch < 0 || o.prefill_batch > 65536)
    return make_error("prefill batch %d out of range [1, 65536] (0: the backend's default)", o.prefill_batch);
  if (o.fast_skip && (*o.fast_skip & ~FAST_ALL_SITES))
    return make_error("fast_skip 0x%x names no site (sites: 0x1 .. 0x40)", *o.fast_skip);
  if (o.fast_skip && numerics != Numerics::FAST)
    return make_error("--fast-skip %s needs --numerics fast (%s numerics quantises no input)",
                      fast_sites_name(*o.fast_skip).c_str(), numerics_name(numerics));
  // The CUDA switches are checked whichever backend runs (a typo must not depend on the machine).
  if (o.cuda) DSV4_TRY(o.cuda->check());
  if (o.synthetic.empty()) {
    DSV4_TRY_ASSIGN(impl->file, open_model(o.model_path));
  } else {
    DSV4_TRY_ASSIGN(impl->file, open_synthetic(o));
  }
  const ModelSpec& spec = impl->file->spec();
  if (!o.mtp_path.empty()) {
    DSV4_TRY_ASSIGN(impl->mtp_file, GgufFile::open(o.mtp_path));
    DSV4_TRY_ASSIGN(impl->mtp, bind_mtp_weights(*impl->mtp_file, spec));
  }
  if (!o.dspark_path.empty()) {
    if (!(o.dspark_confidence >= 0 && o.dspark_confidence < 1))
      return make_error("the DSpark confidence threshold %g is not in [0, 1)",
                        static_cast<double>(o.dspark_confidence));
    DSV4_TRY_ASSIGN(impl->dspark_file, GgufFile::open(o.dspark_path));
    DSV4_TRY_ASSIGN(impl->dspark, bind_dspark_weights(*impl->dspark_file, spec));
  }
  auto tok = Tokenizer::from_gguf(*impl->file->gguf);
  if (!tok) return tok.error().with_context("loading the tokenizer of " + o.model_path);
  impl->tokenizer = std::move(*tok);

  // Progress of weight uploads (CUDA); the bar appears with the first upload.
  uint64_t upload_total = impl->file->weights.n_bytes;
  for (const TensorRef& r : impl->mtp.head) upload_total += r.n_bytes;
  for (const TensorRef& r : impl->mtp.block.t) upload_total += r.n_bytes;
  uint64_t dspark_bytes = 0;
  for (const TensorRef& r : impl->dspark.head) dspark_bytes += r.n_bytes;
  for (const LayerWeights& l : impl->dspark.stages)
    for (const TensorRef& r : l.t) dspark_bytes += r.n_bytes;
  upload_total += dspark_bytes;
  // A layer pipeline (--gpus over several devices; cpu_stages): one backend per stage.
  DSV4_TRY_ASSIGN(const std::vector<int> devices, pipeline_devices(o));
  const size_t n_stages = o.cpu_stages > 1 ? static_cast<size_t>(o.cpu_stages) : devices.size();
  if (o.cpu_stages > 1 && (o.backend != BackendChoice::CPU || devices.size() > 1))
    return make_error("cpu stages %d: the CPU backend only, without --gpus", o.cpu_stages);
  if (n_stages > 1 && (!o.mtp_path.empty() || !o.dspark_path.empty()))
    return make_error(
        "--gpus over several GPUs runs without --mtp and --dspark (speculative decoding needs the "
        "whole model on one GPU)");
  if (devices.size() > 1 && o.backend == BackendChoice::CPU) return make_error("--gpus needs --backend cuda or auto");
  // Each hook lives as long as its backend: the shared state adds the devices' uploads for one bar.
  struct UploadBar {
    std::mutex mu;
    std::vector<uint64_t> done;
    std::unique_ptr<Progress> bar;
  };
  auto upload_bar = std::make_shared<UploadBar>();
  upload_bar->done.assign(n_stages, 0);
  auto hook = [upload_bar, upload_total, show = o.show_progress](size_t k) {
    return [upload_bar, upload_total, show, k](uint64_t done) {
      if (!show) return;
      std::lock_guard<std::mutex> lock(upload_bar->mu);
      upload_bar->done[k] = done;
      uint64_t sum = 0;
      for (uint64_t d : upload_bar->done) sum += d;
      if (!upload_bar->bar) upload_bar->bar = std::make_unique<Progress>("uploading weights", upload_total);
      upload_bar->bar->update(sum);
    };
  };
  // CPU stages share the cores (--threads, else all of them): each backend gets its part of them.
  const int cpu_threads =
      o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int stage_threads = o.cpu_stages > 1 ? std::max(1, cpu_threads / o.cpu_stages) : o.threads;
  DSV4_TRY_ASSIGN(impl->backend, make_backend(o, devices[0], stage_threads, hook(0)));
  for (size_t k = 1; k < n_stages; ++k) {
    DSV4_TRY_ASSIGN(auto be, make_backend(o, o.cpu_stages > 1 ? 0 : devices[k], stage_threads, hook(k)));
    if (be->kind() != impl->backend->kind()) return make_error("--gpus: GPU %d is not usable", devices[k]);
    impl->stage_backends.push_back(std::move(be));
  }
  ModelOptions mo;
  mo.numerics = numerics;
  mo.fast_sites = FAST_ALL_SITES & ~o.fast_skip.value_or(FAST_DEFAULT_SKIP);
  if (!o.expert_stats.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(o.expert_stats, ec)) {
      DSV4_TRY_ASSIGN(impl->stats_loaded, expert_stats_load(o.expert_stats));
      if (impl->stats_loaded.n_layer != spec.n_layer || impl->stats_loaded.n_expert != spec.n_expert)
        return make_error(
            "%s holds routing statistics of a model with %u layers x %u routed experts; this one has "
            "%u x %u (give another --expert-stats file)",
            o.expert_stats.c_str(), impl->stats_loaded.n_layer, impl->stats_loaded.n_expert, spec.n_layer,
            spec.n_expert);
      mo.expert_priority = impl->stats_loaded;
    }
    mo.count_routing = true;
  }
  const bool on_cuda = impl->backend->kind() == BackendKind::CUDA;
  mo.max_batch = o.prefill_batch > 0 ? o.prefill_batch : default_prefill_batch(on_cuda);
  impl->opts.prefill_batch = mo.max_batch;
  if (on_cuda && n_stages == 1) {
    // GPU memory for the model (--gpu-memory; auto: the free memory less 1 GiB), beside one session's state at
    // the default context and the backend's working memory of a prefill batch; routed experts beyond it stay
    // in host memory (Model::upload). Everything on the GPU when it fits.
    const CudaOptions defaults;
    const CudaOptions& cuda = o.cuda ? *o.cuda : defaults;
    const uint64_t margin = uint64_t{1} << 30;
    const uint64_t free_b = impl->backend->free_memory().value_or(0);
    mo.memory_budget = cuda.gpu_memory ? cuda.gpu_memory : (free_b > margin ? free_b - margin : 1);
    mo.reserve_bytes = kv_state_bytes(spec, mo, !o.mtp_path.empty(), o.ctx) + k_cuda_working_bytes + dspark_bytes;
  }
  if (n_stages > 1) {
    std::vector<Backend*> bes = {impl->backend.get()};
    for (const auto& be : impl->stage_backends) bes.push_back(be.get());
    DSV4_TRY_ASSIGN(impl->model, load_pipeline(bes, impl->file->weights, o, mo));
  } else {
    DSV4_TRY_ASSIGN(impl->model,
                    Model::create(*impl->backend, impl->file->weights, o.mtp_path.empty() ? nullptr : &impl->mtp, mo));
  }
  if (impl->dspark_file) {
    // The drafter's host reads (Model::DSparkHost): Markov rows dequantised from the mapped file as
    // needed, the confidence projection once.
    Model::DSparkHost host;
    const TensorRef w1 = impl->dspark[DSparkTensor::MARKOV_W1];
    host.markov_row = [w1](int32_t token, float* out) {
      quant::dequantize_row(w1.type, w1.row(static_cast<uint64_t>(token)), out, static_cast<int64_t>(w1.ne[0]));
    };
    const TensorRef& conf = impl->dspark[DSparkTensor::CONFIDENCE];
    host.confidence.resize(conf.ne[0]);
    quant::dequantize_row(conf.type, conf.data, host.confidence.data(), static_cast<int64_t>(conf.ne[0]));
    if (Status st = impl->model->attach_dspark(impl->dspark, std::move(host)); !st)
      return st.error().with_context("loading " + o.dspark_path);
  }
  if (const WeightPlacement& pl = impl->model->placement(); pl.host_expert_bytes > 0)
    log_info(
        "placement: %.2f GiB of dense weights, %.2f GiB of activations and %.2f GiB of routed experts (%u-%u of "
        "%u per layer, %s) on the GPU; %.2f GiB of routed experts read from host memory, gathered through a "
        "%.2f GiB stage (GPU memory budget %.2f GiB)",
        gib(pl.dense_bytes), gib(pl.scratch_bytes), gib(pl.expert_bytes), pl.min_resident, pl.max_resident, pl.n_expert,
        pl.by_usage ? ("the most-used of " + o.expert_stats).c_str() : "spread evenly", gib(pl.host_expert_bytes),
        gib(pl.stage_bytes), gib(mo.memory_budget));
#ifdef DSV4_HAS_CUDA
  if (impl->backend->kind() == BackendKind::CUDA) {
    const CudaUploadStats up = cuda_upload_stats(*impl->backend);
    upload_bar->bar.reset();
    log_info("cuda: uploaded %llu weight tensors, %.2f GiB in %.2f s (%.2f GB/s)",
             static_cast<unsigned long long>(up.tensors), static_cast<double>(up.bytes) / (1u << 30), up.seconds,
             up.rate_gbs());
    if (up.host_streamed_bytes > 0)
      log_info(
          "cuda: of the weights in host memory, %.2f GiB pinned for the GPU to read and %.2f GiB streamed from "
          "the model file by the host (--stream-experts)",
          gib(up.host_pinned_bytes), gib(up.host_streamed_bytes));
  }
#endif
  impl->fingerprint = model_fingerprint(spec, impl->file->weights);

  EngineInfo& info = impl->info;
  info.model_name = spec.recognise();
  info.model_path = o.synthetic.empty() ? o.model_path : "synthetic:" + o.synthetic;
  info.quant = impl->file->weights.mix.describe();
  {
    static const char* k_hex = "0123456789abcdef";
    for (unsigned char c : impl->fingerprint) {
      info.fingerprint += k_hex[c >> 4];
      info.fingerprint += k_hex[c & 15];
    }
  }
  if (o.synthetic.empty()) {
    const std::optional<FileStamp>& stamp = impl->file->gguf->mapping().stamp();
    DSV4_ASSERT(stamp.has_value(), "a model opened from a file has a file stamp");
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(o.model_path, ec);
    const std::filesystem::path path = ec ? std::filesystem::path(o.model_path) : abs;
    impl->model_file = ModelFileStamp{path.lexically_normal().string(), *stamp};
  }
  info.backend = impl->backend->name();
  for (const auto& be : impl->stage_backends) info.backend += " + " + be->name();
  info.prefill_batch = mo.max_batch;
  info.numerics = numerics;
  {
    const GgmlType kv = kv_row_type(spec, mo), ix = indexer_row_type(spec, mo);
    info.kv_rows = kv == GgmlType::F32 && ix == GgmlType::F32
                       ? "F32"
                       : strfmt("%s + %s (compact)", ggml_type_name(kv), ggml_type_name(ix));
    uint64_t grows = 0;  // over every stage of a layer pipeline
    for (const Model* m = impl->model.get(); m; m = m->next_stage())
      grows += m->state_bytes(1u << 20) - m->state_bytes(0);
    info.kv_bytes_per_token = static_cast<double>(grows) / (1u << 20);
  }
  info.n_vocab = spec.n_vocab;
  info.n_layer = spec.n_layer;
  info.max_ctx =
      spec.context_length ? static_cast<uint32_t>(std::min<uint64_t>(spec.context_length, 1u << 20)) : (1u << 20);
  info.weight_bytes = impl->file->weights.n_bytes;
  {
    // Every tensor is read once per token except: routed experts (k of E read),
    // the embedding table (one row) and hash tables (one row).
    const ModelWeights& w = impl->file->weights;
    uint64_t b = w.n_bytes;
    const TensorRef& emb = w[GlobalTensor::TOKEN_EMBD];
    b -= emb.n_bytes - emb.row_bytes();
    for (const auto& l : w.layers) {
      for (LayerTensor t : {LayerTensor::FFN_GATE_EXPS, LayerTensor::FFN_UP_EXPS, LayerTensor::FFN_DOWN_EXPS})
        b -= l[t].n_bytes - l[t].n_bytes / spec.n_expert * spec.n_expert_used;
      const TensorRef& h = l[LayerTensor::FFN_GATE_TID2EID];
      if (h) b -= h.n_bytes - h.row_bytes();
    }
    info.decode_bytes_per_token = b;
  }
  info.has_mtp = impl->model->has_mtp();
  info.has_dspark = impl->model->has_dspark();
  info.dspark_block = info.has_dspark ? impl->model->dspark_meta().block_size : 0;
  info.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (o.ctx == 0 || o.ctx > info.max_ctx)
    return make_error("context %u out of range [1, %u] for this model", o.ctx, info.max_ctx);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

KvIdentity Engine::kv_identity(const std::array<uint8_t, 32>& model) const {
  const QuantMix& mix = impl_->file->weights.mix;
  KvIdentity id;
  id.model = model;
  id.numerics = static_cast<uint32_t>(impl_->info.numerics);
  id.expert_gate_up_type = static_cast<uint32_t>(mix.expert_gate_up);
  id.expert_down_type = static_cast<uint32_t>(mix.expert_down);
  id.dense_type = static_cast<uint32_t>(mix.dense);
  id.routed_bits = static_cast<uint32_t>(mix.routed_bits());
  return id;
}

std::string Engine::content_identity() const {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.identity_mu);
  if (!m.content_identity.empty()) return m.content_identity;
  const MappedFile& file = m.file->gguf->mapping();
  const uint64_t leaves = (file.size() + k_identity_chunk_bytes - 1) / k_identity_chunk_bytes;
  const int cores =
      m.opts.threads > 0 ? m.opts.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = static_cast<int>(std::clamp<uint64_t>(leaves, 1, static_cast<uint64_t>(cores)));
  std::unique_ptr<Progress> bar;
  const auto t0 = std::chrono::steady_clock::now();
  const Digest id = model_content_identity(file, m.fingerprint, threads, [&](uint64_t done, uint64_t total) {
    if (!m.opts.show_progress) return;
    if (!bar) bar = std::make_unique<Progress>("hashing the model", total);
    bar->update(done);
  });
  if (bar) bar->finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double gib = static_cast<double>(file.size()) / (1ull << 30);
  log_info("model identity: hashed %.2f GiB in %.2f s (%.2f GiB/s, %d threads)", gib, s, s > 0 ? gib / s : 0.0,
           threads);
  m.content_identity = digest_hex(id);
  return m.content_identity;
}

std::optional<ModelFileStamp> Engine::model_file() const { return impl_->model_file; }

// A layer pipeline: the largest share of a session on one stage, and the least free memory of a stage.
uint64_t Engine::session_bytes(uint32_t ctx) const {
  uint64_t most = 0;
  for (const Model* m = impl_->model.get(); m; m = m->next_stage())
    most = std::max(most, m->state_bytes(ctx ? ctx : impl_->opts.ctx));
  return most;
}
std::optional<uint64_t> Engine::free_memory() const {
  std::optional<uint64_t> least = impl_->backend->free_memory();
  for (const auto& be : impl_->stage_backends)
    if (const std::optional<uint64_t> f = be->free_memory(); f && least) least = std::min(*least, *f);
  return least;
}

void Engine::set_op_profiling(bool on) { impl_->backend->set_profiling(on); }

std::string Engine::take_op_profile_report(double per, int max_rows) {
  std::vector<OpTiming> prof = impl_->backend->take_profile();
  double total = 0;
  for (const auto& t : prof) total += t.seconds;
  std::string out = strfmt("%-44s %9s %12s %7s\n", "op", "calls", "ms/unit", "share");
  int rows = 0;
  for (const auto& t : prof) {
    if (rows++ == max_rows) {
      out += strfmt("%-44s (%zu more)\n", "...", prof.size() - static_cast<size_t>(max_rows));
      break;
    }
    out += strfmt("%-44s %9llu %12.4f %6.1f%%\n", t.key.c_str(), static_cast<unsigned long long>(t.calls),
                  t.seconds * 1e3 / per, total > 0 ? 100.0 * t.seconds / total : 0.0);
  }
  out += strfmt("%-44s %9s %12.4f\n", "total", "", total * 1e3 / per);
  return out;
}

expected<std::unique_ptr<Session>> Engine::new_session(uint32_t ctx) {
  if (ctx == 0) ctx = impl_->opts.ctx;
  if (ctx > impl_->info.max_ctx)
    return make_error("context %u exceeds the model's maximum of %u", ctx, impl_->info.max_ctx);
  // A session's state is allocated whole; where the backend knows its free
  // memory, a session that cannot fit is an error here instead of a failed
  // allocation halfway (256 MiB kept for allocation rounding and scratch growth).
  if (const std::optional<uint64_t> free_b = free_memory()) {
    const uint64_t need = session_bytes(ctx), margin = uint64_t{256} << 20;
    if (need + margin > *free_b)
      return make_error(
          "not enough %s memory for a session of %u tokens: it needs %.2f GiB, %.2f GiB are free (a "
          "smaller --ctx or fewer --sessions)",
          impl_->backend->kind() == BackendKind::CUDA ? "GPU" : "backend", ctx, static_cast<double>(need) / (1 << 30),
          static_cast<double>(*free_b) / (1 << 30));
  }
  auto s = std::make_unique<Session::Impl>();
  s->eng = impl_.get();
  s->state = impl_->model->new_state(ctx);
  return std::unique_ptr<Session>(new Session(std::move(s)));
}

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;
uint32_t Session::ctx() const { return impl_->state.ctx; }
const std::vector<int32_t>& Session::tokens() const { return impl_->tokens; }
const std::vector<float>& Session::logits() const { return impl_->logits; }

Status Session::prefill(std::span<const int32_t> tokens, const RunHooks& hooks) {
  if (tokens.empty()) return {};
  Status st = impl_->run(tokens, hooks);
  impl_->checkpoint();
  return st;
}

Status Engine::step(std::span<const SessionStep> items) {
  if (items.empty()) return {};
  std::vector<StepItem> model_items;
  model_items.reserve(items.size());
  std::vector<std::vector<float>> all(items.size());  // verify items' logits after every token
  for (size_t k = 0; k < items.size(); ++k) {
    const SessionStep& it = items[k];
    if (!it.session || it.session->impl_->eng != impl_.get())
      return make_error("step: item %zu is not a session of this engine", k);
    if (it.tokens.empty()) return make_error("step: item %zu has no tokens", k);
    Session::Impl& si = *it.session->impl_;
    DSV4_TRY(si.check_append(it.tokens));
    StepItem m{&si.state, it.tokens.data(), static_cast<int64_t>(it.tokens.size()),
               static_cast<int64_t>(si.tokens.size()), nullptr};
    if (it.keep) {
      all[k].resize(it.tokens.size() * si.n_vocab());
      m.all_logits = all[k].data();
    } else {
      si.logits.resize(si.n_vocab());
      m.logits = si.logits.data();
    }
    model_items.push_back(m);
  }
  if (Status st = impl_->model->step(model_items); !st) {
    for (const SessionStep& it : items)  // a session without logits keeps none
      if (it.session->impl_->tokens.empty()) it.session->impl_->logits.clear();
    return st;
  }
  // Every item is appended now (the step succeeded): a verify item's keep() asking for more than it
  // was given keeps all (finish_verify clamps; Session::verify alone reports it).
  for (size_t k = 0; k < items.size(); ++k) {
    const SessionStep& it = items[k];
    Session::Impl& si = *it.session->impl_;
    if (it.keep) {
      auto a = si.finish_verify(it.tokens, all[k], *it.keep);
      if (it.kept) *it.kept = a ? *a : it.tokens.size();
      continue;
    }
    si.tokens.insert(si.tokens.end(), it.tokens.begin(), it.tokens.end());
  }
  return {};
}

Status Session::decode(int32_t token) { return impl_->run(std::span<const int32_t>(&token, 1), {}); }

expected<std::vector<float>> Session::prefill_all_logits(std::span<const int32_t> tokens) {
  if (tokens.empty()) return std::vector<float>{};
  DSV4_TRY(impl_->check_append(tokens));
  const size_t V = impl_->n_vocab();
  std::vector<float> all(tokens.size() * V);
  DSV4_TRY(impl_->model().forward(impl_->state, tokens.data(), static_cast<int64_t>(tokens.size()),
                                  static_cast<int64_t>(impl_->tokens.size()), all.data(), true));
  impl_->tokens.insert(impl_->tokens.end(), tokens.begin(), tokens.end());
  impl_->logits.assign(all.end() - static_cast<long>(V), all.end());
  impl_->checkpoint();
  return all;
}

void Session::reset() {
  impl_->model().reset_state(impl_->state);
  impl_->tokens.clear();
  impl_->logits.clear();
  impl_->checkpoints.clear();
}

void Session::checkpoint() { impl_->checkpoint(); }

Status Session::rewind(size_t n) {
  Impl& s = *impl_;
  if (n > s.tokens.size()) return make_error("cannot rewind to %zu tokens: the session holds %zu", n, s.tokens.size());
  if (n == s.tokens.size()) return {};
  std::vector<int32_t> keep(s.tokens.begin(), s.tokens.begin() + static_cast<long>(n));
  // Latest checkpoint at or before n; checkpoints past n no longer belong to the timeline.
  while (!s.checkpoints.empty() && s.checkpoints.back().n_tokens > n) s.checkpoints.pop_back();
  size_t from = 0;
  if (!s.checkpoints.empty()) {
    DSV4_TRY(snapshot_load(s.model(), s.state, s.eng->fingerprint, s.checkpoints.back().bytes, s.tokens, s.logits));
    from = s.tokens.size();
  } else {
    s.model().reset_state(s.state);
    s.tokens.clear();
    s.logits.clear();
  }
  if (from < n) DSV4_TRY(s.run(std::span<const int32_t>(keep.data() + from, n - from), {}));
  return {};
}

std::vector<uint8_t> Session::save() const {
  return snapshot_save(impl_->model(), impl_->state, impl_->eng->fingerprint, impl_->tokens, impl_->logits, true);
}

Status Session::load(std::span<const uint8_t> snapshot) {
  Impl& s = *impl_;
  DSV4_TRY_ASSIGN(SnapshotHeader h, snapshot_peek(snapshot));
  if (!h.with_rows) return make_error("this is a light checkpoint, not a full session snapshot");
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  DSV4_TRY(snapshot_load(s.model(), s.state, s.eng->fingerprint, snapshot, tokens, logits));
  s.tokens = std::move(tokens);
  s.logits = std::move(logits);
  if (s.tokens.empty()) s.logits.clear();
  s.checkpoints.clear();
  s.checkpoint();
  return {};
}

size_t Session::max_verify() { return static_cast<size_t>(Model::k_max_verify); }

expected<std::vector<int32_t>> Session::mtp_draft(int32_t next_token, int k, float min_margin) {
  Impl& s = *impl_;
  if (s.tokens.empty()) return make_error("MTP needs at least one fed token");
  if (k < 0) return make_error("mtp_draft: %d proposals", k);
  std::vector<int32_t> out;
  std::vector<float> lg(s.n_vocab());
  int32_t t = next_token;
  for (int i = 0; i < k; ++i) {
    // Proposal i sits at position n + i + 1; the MTP step that makes it runs at n - 1 + i.
    const int64_t p = static_cast<int64_t>(s.tokens.size()) - 1 + i;
    if (p + 2 >= static_cast<int64_t>(s.state.ctx)) break;
    DSV4_TRY(s.model().mtp_forward(s.state, t, p, lg.data(), /*chain=*/i > 0));
    t = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    if (min_margin > 0) {
      float second = -std::numeric_limits<float>::infinity();
      for (size_t v = 0; v < lg.size(); ++v)
        if (static_cast<int32_t>(v) != t) second = std::max(second, lg[v]);
      if (lg[static_cast<size_t>(t)] - second < min_margin) break;
    }
    out.push_back(t);
  }
  return out;
}

expected<size_t> Session::verify(std::span<const int32_t> tokens, const KeepFn& keep) {
  Impl& s = *impl_;
  DSV4_TRY(s.check_append(tokens));
  const size_t V = s.n_vocab(), n = tokens.size();
  std::vector<float> all(n * V);
  DSV4_TRY(s.model().verify(s.state, tokens.data(), static_cast<int64_t>(n), static_cast<int64_t>(s.tokens.size()),
                            all.data()));
  return s.finish_verify(tokens, all, keep);
}

expected<std::vector<int32_t>> Session::draft(int32_t next_token, int k, float mtp_margin) {
  Impl& s = *impl_;
  if (!s.model().has_dspark()) return mtp_draft(next_token, k, mtp_margin);
  if (k <= 0) return std::vector<int32_t>{};
  DSV4_TRY_ASSIGN(std::vector<int32_t> d, dspark_block());
  // d[0] stands for next_token's position: the rest are proposals after it only if it agrees.
  if (d.empty() || d[0] != next_token) return std::vector<int32_t>{};
  d.erase(d.begin());
  if (d.size() > static_cast<size_t>(k)) d.resize(static_cast<size_t>(k));
  return d;
}

expected<std::vector<int32_t>> Session::dspark_block() {
  Impl& s = *impl_;
  if (s.tokens.empty()) return make_error("DSpark needs at least one fed token");
  return s.model().dspark_draft(s.state, s.tokens.back(), static_cast<int64_t>(s.tokens.size()) - 1,
                                s.eng->opts.dspark_confidence);
}

expected<std::vector<float>> Session::mtp_logits(int32_t next_token) {
  Impl& s = *impl_;
  if (s.tokens.empty()) return make_error("MTP needs at least one fed token");
  std::vector<float> out(s.n_vocab());
  DSV4_TRY(s.model().mtp_forward(s.state, next_token, static_cast<int64_t>(s.tokens.size()) - 1, out.data()));
  return out;
}

}  // namespace dsv4
