// The production Backend: a loaded Engine, up to N resident sessions
// (runtime/session_pool.h), the on-disk KV cache (kv/disk_cache.h,
// runtime/session_cache.h) and the shared generation loop (generate/generate.h).
//
// A job's life on the worker thread (docs/kv-cache-format.md §7, §9, §11):
//
//   begin_job   1. the pool picks the session whose tokens the prompt reuses
//                  most (extends > regenerates > new > displaced); a displaced
//                  session is saved first (reason "displaced", waits for the
//                  writer);
//               2. the prompt tokens for it (prompt_reuse.h: token prefix,
//                  text stitching, the visible-transcript anchor);
//               3. the disk cache is asked for an entry longer than that
//                  reuse (cache_restore; first waiting for a save of such a
//                  prefix still in the writer's queue); a hit replaces the
//                  session's state;
//               4. with no disk hit, the cold save length of the prompt
//                  (cold_store_length) becomes a save point.
//   generate    prefills up to each save point (the cold length, frontiers:
//               prefill_save_points), saves there, prefills the rest; while
//               decoding, saves at frontiers (frontier_due). Saves in the
//               generated part are skipped inside or after a DSML block, and
//               in thinking mode without tools (their keys hold reasoning the
//               client never sends back). cached_tokens = what the session
//               held when the call began (resident or restored).
//   end_job     thinking mode without tools: the session is bound to the
//               client-visible transcript of the turn (visible_transcript),
//               the anchor for the next request and the key of later saves.
//   shutdown    saves every live session (reason "shutdown") and waits for
//               the writer.
//
// Saving: the engine thread captures the state (cache_prepare_save, a copy)
// and the CacheWriter thread writes it. A file's key is the decoded tokens,
// or, for a session bound to a visible transcript, that transcript followed
// by the decoded tokens after it (CacheSave::visible_key). It carries the
// tool-call memory's entries whose DSML occurs in the key.
//
// Parallel jobs (BatchingOptions::parallel > 1): each job leases its own
// session from the pool (begin_job waits while every session that fits is
// in use: KV admission) and generates on its own worker thread; the forward
// passes of all of them go through one StepBatcher (step_batcher.h), whose
// engine lock also guards the pool, the sessions' states and the disk cache
// bookkeeping here. With parallel 1 the sessions are run directly.
//
// A disk cache that cannot be opened (unwritable, not a directory, another
// user's) is reported with a warning and the server runs without one; a
// write that fails (full disk) turns the cache read-only with a warning.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "runtime/save_policy.h"
#include "runtime/session_cache.h"
#include "runtime/session_pool.h"
#include "dsv4/engine.h"
#include "runtime/backend.h"
#include "runtime/cache_writer.h"
#include "runtime/batching_options.h"
#include "runtime/cache_options.h"
#include "runtime/step_batcher.h"

namespace dsv4::runtime {

class EngineBackend final : public Backend {
 public:
  // Creates the first session with context `ctx` (0: the engine default).
  // With batching.parallel > cache.sessions the pool gets parallel sessions.
  static expected<std::unique_ptr<EngineBackend>> create(std::unique_ptr<Engine> engine, uint32_t ctx,
                                                         const KvCacheOptions& cache = {},
                                                         const BatchingOptions& batching = {});
  ~EngineBackend() override;

  const Tokenizer& tokenizer() const override { return engine_->tokenizer(); }
  uint32_t context_size() const override { return ctx_; }
  std::string describe() const override;
  size_t parallel() const override { return batching_.parallel; }
  const std::vector<int32_t>& session_tokens() const override;
  expected<PromptChoice> begin_job(const JobInput& in, JobSlot& job) override;
  expected<GenerateResult> generate(JobSlot& job, std::span<const int32_t> prompt, const GenerateOptions& options,
                                    const GenerateCallbacks& callbacks) override;
  void end_job(JobSlot& job, const JobInput& in, const JobOutcome& outcome) override;
  void set_tool_memory(ToolMemory* memory) override;
  ToolDsmlMap find_tool_calls(const std::vector<std::string>& ids) override;
  CacheReport cache_report() const override;
  StepReport step_report() const override;
  size_t admission_waiting() const override;
  void shutdown(bool save_sessions) override;

  const Engine& engine() const { return *engine_; }

  // The current session (the one the last job ran on), for front ends that
  // keep one conversation (`dsv4 run`'s /reset, /save, /load). Worker
  // thread only: call while no job runs (Runtime::with_backend).
  size_t current_tokens() const { return session_tokens().size(); }
  std::vector<uint8_t> save_current() const;
  // A failed load leaves the session empty.
  Status load_current(std::span<const uint8_t> state);
  void reset_current();

  // One line for the start banner: sessions and the disk cache (or why there is none).
  std::string describe_cache() const;
  bool disk_enabled() const { return disk_ != nullptr; }

 private:
  // What the backend keeps per resident session (by pool slot).
  struct SlotState {
    RenderedPrompt visible;  // what a client renders for tokens [0, anchor.tokens)
    TextAnchor anchor;       // anchor.tokens == 0: no visible transcript
    size_t last_stored = 0;  // the longest prefix of this timeline already saved
  };
  enum class SaveWait { SKIP_IF_BUSY, WAIT };

  EngineBackend(std::unique_ptr<Engine> engine, uint32_t ctx, const KvCacheOptions& cache,
                const BatchingOptions& batching);
  // The engine, the pool and the sessions' states to the caller (the step
  // batcher's lock, so no step runs meanwhile).
  std::unique_lock<std::mutex> engine_lock();
  SessionFeed& feed();
  SlotState& state(size_t slot);
  size_t slot_of(const Session& s) const;
  // The session's visible-transcript anchor, when `rendered` starts with its transcript.
  const TextAnchor* anchor_for(size_t slot, const RenderedPrompt& rendered);
  void drop_visible(SlotState& st);
  // Whether a save of the first n tokens of `timeline` (the job's prompt or
  // session) is useful (see the header comment).
  bool save_allowed(const JobSlot& job, std::span<const int32_t> timeline, size_t n) const;
  // The engine lock held:
  void save_slot(size_t slot, SaveReason reason, SaveWait wait);
  void update_report();

  std::unique_ptr<Engine> engine_;
  uint32_t ctx_;
  KvCacheOptions options_;  // sessions: raised to --parallel, capped by --session-memory-mb
  const SavePolicy policy_;
  std::unique_ptr<DiskCache> disk_;
  std::string disk_off_;  // why there is no disk cache ("" when it was not asked for)
  std::unique_ptr<CacheWriter> writer_;
  std::unique_ptr<SessionPool> pool_;
  std::vector<SlotState> slots_;  // one per possible session (sized at start: jobs index it concurrently)
  ToolMemory* tools_ = nullptr;
  const BatchingOptions batching_;
  std::unique_ptr<StepBatcher> batcher_;      // parallel > 1
  std::mutex solo_mu_;                        // the engine lock without a batcher
  std::condition_variable admit_cv_;          // a session was released (engine lock)
  std::atomic<size_t> admission_waiting_{0};  // jobs waiting for a session

  size_t current_ = 0;  // the session of the last job (`dsv4 run`'s one conversation)

  mutable std::mutex report_mu_;
  CacheReport report_;  // sessions and counters; disk stats are read live
};

}  // namespace dsv4::runtime
