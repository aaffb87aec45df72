// dsv4 public API: load a DeepSeek V4 model (Engine) and run sequences on it
// (Session). The CLI, server, benchmark and tests use only this header plus
// the tokenizer; tensors, backends and kernels stay behind it.
//
// Threading: an Engine and its Sessions belong to one thread at a time (the
// server's engine worker). Sessions share the engine's scratch memory, so only
// one session computes at a time.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/numerics.h"
#include "core/file_stamp.h"

namespace dsv4 {

class Tokenizer;
class Session;

struct CudaOptions;  // the CUDA backend's switches (backend/options/cuda_options.h)
struct KvIdentity;   // what a KV-cache file is bound to (kv/kv_file.h)

// Which backend runs the model.
enum class BackendChoice {
  AUTO,  // CUDA when this build has it and a usable GPU is present, else the CPU
  CPU,
  CUDA,
};
const char* backend_choice_name(BackendChoice b);  // "auto", "cpu", "cuda"
expected<BackendChoice> backend_choice_from_name(std::string_view s);

struct EngineOptions {
  std::string model_path;
  std::string mtp_path;            // optional MTP block GGUF (--mtp)
  std::string dspark_path;         // optional DSpark support GGUF (--dspark): the drafter Session::draft uses
  float dspark_confidence = 0.7f;  // --dspark-confidence: DSpark proposals stop below this confidence (0: all)
  BackendChoice backend = BackendChoice::AUTO;
  Numerics numerics = Numerics::REFERENCE;
  // Under fast numerics, the inputs left unquantised (FastSite bits, core/numerics.h; 0: none; unset:
  // FAST_DEFAULT_SKIP, the attention's input): a measurement of the accuracy / speed trade
  // (`dsv4 logits|bench --fast-skip`). Set, it needs fast numerics. Snapshots record the numerics only, not
  // this set.
  std::optional<unsigned> fast_skip;
  uint32_t ctx = 32768;  // default context of new sessions
  int threads = 0;       // CPU threads (0 = all cores)
  // Tokens per forward batch; 0 = the backend's default (default_prefill_batch):
  // CUDA 4096 (the grouped experts get ~96 tokens per expert to share each
  // decoded weight tile; PERFORMANCE.md), CPU 512.
  int prefill_batch = 0;
  bool show_progress = true;  // progress bar while loading
  // The CUDA backend's switches (tools/engine_flags.h parses them); nullptr:
  // the defaults. Checked whichever backend runs (a typo must not depend on
  // the machine); the CPU backend ignores them.
  std::shared_ptr<const CudaOptions> cuda;
  // Instead of model_path: the weights of this `dsv4 synth` preset (with this
  // seed), generated into memory (the exact bytes `dsv4 synth` writes; the
  // model file is never on disk). Needs RAM for the whole model.
  std::string synthetic;
  uint64_t synthetic_seed = 1;
  // With `synthetic`: the router's skew (SynthPlan::router_skew; 0: uniform routing).
  double synthetic_router_skew = 0;
  // Routing statistics (--expert-stats FILE): read at load when the file exists (the most-used routed experts
  // go to the GPU first when not all fit), counted during the run and merged into the file when the engine
  // is destroyed. "": none.
  std::string expert_stats;
  // The CPU backend as a layer pipeline of this many stages (model/pipeline.h; each a CPU backend with its
  // share of the threads): what --gpus does over GPUs, here for tests on machines without one. 0, 1: none.
  int cpu_stages = 0;

  std::string describe() const;  // one line, printed at start
};

// The prefill batch EngineOptions::prefill_batch = 0 selects for a backend kind.
int default_prefill_batch(bool cuda);

struct EngineInfo {
  std::string model_name;  // "DeepSeek V4 Flash" or "custom ..."
  std::string model_path;
  std::string quant;  // quant mix description
  // 64 hex: SHA-256 of the hyperparameters and tensor table (kv/snapshot.h);
  // session snapshots load only into an engine with the same value. The
  // weights themselves: Engine::content_identity.
  std::string fingerprint;
  std::string backend;    // backend name incl. device
  int prefill_batch = 0;  // tokens per forward batch in use (the resolved EngineOptions value)
  Numerics numerics = Numerics::REFERENCE;
  uint32_t n_vocab = 0;
  uint32_t n_layer = 0;
  uint32_t max_ctx = 0;  // largest context a session may ask for
  uint64_t weight_bytes = 0;
  uint64_t decode_bytes_per_token = 0;  // weight bytes one decoded token reads (k of E experts, one embedding row)
  std::string kv_rows;                  // storage of the KV rows: "KV_FP8 + KV_FP4 (compact)" or "F32"
  double kv_bytes_per_token = 0;        // session state growth per context token (average over 1M tokens)
  bool has_mtp = false;
  bool has_dspark = false;
  uint32_t dspark_block = 0;  // proposals per DSpark pass (its block size; the first is the model's own next token)
  double load_seconds = 0;
};

// A model file as the engine opened it.
struct ModelFileStamp {
  std::string path;  // absolute
  FileStamp stamp;   // when it was mapped
};

// Per-call hooks of long operations.
struct RunHooks {
  std::function<void(uint64_t done, uint64_t total)> progress;  // after each batch
  std::function<bool()> cancelled;                              // polled between batches
};

// One session's part of Engine::step.
struct SessionStep {
  Session* session = nullptr;
  std::span<const int32_t> tokens;  // appended to the session (at least one)
  // Set: a speculative verify item (Session::verify's contract: at most Session::max_verify() tokens,
  // `keep` chooses how many stay, written to *kept). `keep` runs inside the step, on the thread that
  // calls step(), with the engine busy: it must not use the engine or wait for what does.
  const std::function<size_t(std::span<const float> all_logits)>* keep = nullptr;
  size_t* kept = nullptr;
};

class Engine {
 public:
  static expected<std::unique_ptr<Engine>> load(const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineInfo& info() const;
  const Tokenizer& tokenizer() const;
  // 64 hex: the model's content identity (kv/model_identity.h), a tree hash
  // of every byte of the model file and the layout fingerprint, so models
  // with one layout but different weights (q2 vs q2-imatrix, fine-tunes, one
  // changed byte) differ; KV-cache files load only into an engine with the
  // same value. Reads the whole model on all cores at the first call (what
  // load() does not: only a KV disk cache needs it), then memoised. Safe to
  // call from any thread, also concurrently.
  std::string content_identity() const;
  // What a KV-cache file of this engine is bound to: `model` (the content
  // identity as bytes, or one remembered for this file), the numerics and
  // the quant mix. Callers include kv/kv_file.h.
  KvIdentity kv_identity(const std::array<uint8_t, 32>& model) const;
  // The model file as mapped at load; nullopt for a synthetic model (no file:
  // its content identity is that of the bytes `dsv4 synth` would write).
  std::optional<ModelFileStamp> model_file() const;
  // A new empty session with context `ctx` (0: the engine default).
  expected<std::unique_ptr<Session>> new_session(uint32_t ctx = 0);
  // Bytes of state a session of `ctx` tokens takes in backend memory.
  uint64_t session_bytes(uint32_t ctx) const;
  // Backend memory still free for sessions where the backend knows it (CUDA:
  // the GPU's), else nullopt. new_session() refuses a session that cannot fit.
  std::optional<uint64_t> free_memory() const;

  // Continuous batching: appends tokens to several sessions of this engine in
  // one forward pass — a decoding session adds one token, a prefilling one a
  // chunk; their rows share every weight read (dense matmuls, the union of
  // their routed experts) while attention, compressors and indexer run per
  // session. At most info().prefill_batch tokens in all, each session once.
  // Afterwards every session's logits() are those after its last token,
  // exactly what prefill()/decode() alone give (bitwise on the CPU backend;
  // the CUDA backend within its op tolerances); a verify item keeps what its
  // `keep` chooses, as Session::verify alone. On an error nothing is appended.
  Status step(std::span<const SessionStep> items);

  // Per-op timing (device time on GPUs) for `dsv4 bench --profile`: while on,
  // every backend op is timed; the report lists op kinds by total time
  // (divided by `per` units, e.g. decoded tokens) and clears the counters.
  void set_op_profiling(bool on);
  std::string take_op_profile_report(double per = 1.0, int max_rows = 30);

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  uint32_t ctx() const;
  const std::vector<int32_t>& tokens() const;
  size_t n_tokens() const { return tokens().size(); }
  // Logits for the next token after the last fed token (empty before any token).
  const std::vector<float>& logits() const;

  // Appends tokens (processed in batches). Fails with a clear error on context
  // overflow or invalid ids, leaving the session unchanged; a cancelled call
  // leaves the session at the last completed batch.
  Status prefill(std::span<const int32_t> tokens, const RunHooks& hooks = {});
  Status decode(int32_t token);
  // Appends tokens and returns the logits after every one of them ([n][V]).
  expected<std::vector<float>> prefill_all_logits(std::span<const int32_t> tokens);

  // Remembers the current state as a point rewind() restores from
  // (prefill() does so at its end; Engine::step does not).
  void checkpoint();

  // Back to the first n tokens of the timeline (exact: restores the nearest
  // earlier checkpoint and recomputes the rest).
  Status rewind(size_t n_tokens);
  // Drops every token.
  void reset();

  // Exact state as bytes (see src/kv/snapshot.h) and back.
  std::vector<uint8_t> save() const;
  Status load(std::span<const uint8_t> snapshot);

  // MTP draft logits for the token after `next_token` (requires --mtp).
  expected<std::vector<float>> mtp_logits(int32_t next_token);

  // Speculative decoding (docs/SPECULATIVE.md).
  // Greedy MTP proposals for the k tokens after `next_token` (the token that follows the session's
  // last one): proposal i is the argmax of the MTP block chained on proposal i - 1. The chain stops
  // at the first argmax whose lead over the runner-up logit is below `min_margin` (an unsure
  // proposal costs a verify row and is likely rejected; 0: never). Leaves the session's tokens and
  // logits as they are. Requires the engine's MTP block (--mtp).
  expected<std::vector<int32_t>> mtp_draft(int32_t next_token, int k, float min_margin = 0);
  // Appends `tokens` (1 to max_verify()) in one forward pass and gives `keep` the logits after each
  // of them ([n][V]); `keep` returns how many of them the session keeps (0..n). The session then
  // holds exactly those, and the logits after the last kept one, as if only they had been fed
  // (bitwise on the CPU backend; CUDA within its batched-step tolerance), without running the model
  // again. Returns the number kept.
  using KeepFn = std::function<size_t(std::span<const float> all_logits)>;
  expected<size_t> verify(std::span<const int32_t> tokens, const KeepFn& keep);
  static size_t max_verify();
  // Proposals for the k tokens after `next_token` from the engine's drafter: DSpark when loaded
  // (none when its first proposal is not `next_token`: the rest follow from it), else MTP
  // (mtp_draft with `mtp_margin`). Leaves the session as it is.
  expected<std::vector<int32_t>> draft(int32_t next_token, int k, float mtp_margin = 0);
  // The DSpark drafter's whole block after the session's last token (Model::dspark_draft): the
  // proposals for the next block_size tokens, cut by the confidence threshold.
  expected<std::vector<int32_t>> dspark_block();

  struct Impl;

 private:
  friend class Engine;
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4
