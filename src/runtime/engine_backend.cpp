#include "runtime/engine_backend.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/log.h"
#include "runtime/tool_memory.h"

namespace dsv4::runtime {

namespace {

KvCacheOptions with_parallel_sessions(KvCacheOptions c, const BatchingOptions& b) {
  c.sessions = std::max(c.sessions, b.parallel);
  return c;
}

}  // namespace

EngineBackend::EngineBackend(std::unique_ptr<Engine> engine, uint32_t ctx, const KvCacheOptions& cache,
                             const BatchingOptions& batching)
    : engine_(std::move(engine)),
      ctx_(ctx),
      options_(with_parallel_sessions(cache, batching)),
      policy_(cache.policy()),
      batching_(batching) {}

expected<std::unique_ptr<EngineBackend>> EngineBackend::create(std::unique_ptr<Engine> engine, uint32_t ctx,
                                                               const KvCacheOptions& cache,
                                                               const BatchingOptions& batching) {
  if (cache.sessions < 1) return make_error("--sessions must be at least 1");
  if (cache.write_queue < 1) return make_error("the cache writer needs room for at least one save");
  if (batching.parallel < 1) return make_error("--parallel must be at least 1");
  const size_t batch = static_cast<size_t>(engine->info().prefill_batch);
  const size_t step_tokens = batching.step_tokens > 0 ? batching.step_tokens : batch;
  if (batching.parallel > 1 && (step_tokens < batching.parallel || step_tokens > batch))
    return make_error(
        "--step-tokens %zu: a step takes one token of each of the %zu parallel requests and at most the prefill "
        "batch (%zu tokens)",
        step_tokens, batching.parallel, batch);
  std::unique_ptr<EngineBackend> b(new EngineBackend(std::move(engine), ctx, cache, batching));
  if (cache.session_memory_mb > 0) {
    // The memory budget caps the pool: a request beyond it waits for a session (KV admission).
    const uint64_t each = std::max<uint64_t>(b->engine_->session_bytes(ctx), 1);  // ctx 0: the default
    const size_t fit = static_cast<size_t>(std::max<uint64_t>(1, (cache.session_memory_mb << 20) / each));
    if (fit < b->options_.sessions) {
      log_info("--session-memory-mb %llu: room for %zu session%s of %.1f MiB; requests beyond %zu wait for a free one",
               static_cast<unsigned long long>(cache.session_memory_mb), fit, fit == 1 ? "" : "s",
               static_cast<double>(each) / (1 << 20), fit);
      b->options_.sessions = fit;
    }
  }
  b->slots_.resize(b->options_.sessions);
  if (batching.parallel > 1) {
    StepBatcherOptions so;
    so.step_tokens = step_tokens;
    so.shared_prefill_tokens = batching.prefill_chunk > 0 ? std::min(batching.prefill_chunk, step_tokens)
                                                          : std::max<size_t>(1, step_tokens / 4);
    b->batcher_ = std::make_unique<StepBatcher>(*b->engine_, so);
  }
  SessionPoolOptions po;
  po.max_sessions = b->options_.sessions;
  po.ctx = ctx;
  EngineBackend* self = b.get();
  po.on_displace = [self](Session& s) { self->save_slot(self->slot_of(s), SaveReason::DISPLACED, SaveWait::WAIT); };
  b->pool_ = std::make_unique<SessionPool>(*b->engine_, std::move(po));
  // The first session now, so a context the engine cannot hold fails at start.
  DSV4_TRY_ASSIGN(PoolLease first, b->pool_->acquire(std::span<const int32_t>{}));
  b->pool_->release(first.slot);
  b->current_ = first.slot;
  b->ctx_ = first.session->ctx();
  // The other sessions are made when requests need them; say now if they will not all fit.
  const size_t sessions = b->options_.sessions;
  if (const std::optional<uint64_t> free_b = b->engine_->free_memory(); free_b && sessions > 1) {
    const uint64_t each = b->engine_->session_bytes(b->ctx_);
    const uint64_t fit = 1 + *free_b / std::max<uint64_t>(each + (uint64_t{256} << 20), 1);
    if (fit < sessions)
      log_warn(
          "--sessions %zu: the backend has room for about %llu sessions of %u tokens (%.2f GiB each, %.2f GiB free "
          "after the first); the pool will keep the ones that fit, and requests beyond them wait for a free one",
          sessions, static_cast<unsigned long long>(fit), b->ctx_, static_cast<double>(each) / (1 << 30),
          static_cast<double>(*free_b) / (1 << 30));
  }

  if (!cache.disk_dir.empty()) {
    DiskCacheOptions o;
    o.dir = cache.disk_dir;
    o.budget_bytes = cache.disk_space_mb << 20;
    // The identity is resolved once the directory is known to be usable: remembered there, or the model is hashed.
    const Engine& eng = *b->engine_;
    auto disk = DiskCache::open(o, [&eng](ModelIdentityStore& s) { return cache_identity(eng, s).identity; });
    if (disk) {
      b->disk_ = std::move(*disk);
      b->writer_ = std::make_unique<CacheWriter>(*b->disk_, cache.write_queue);
    } else {
      b->disk_off_ = disk.error().message;
      log_warn("KV disk cache disabled, serving without it: %s", b->disk_off_.c_str());
    }
  }
  b->update_report();
  return b;
}

EngineBackend::~EngineBackend() {
  batcher_.reset();  // joins the step thread (no job runs any more)
  if (writer_) writer_->flush();
}

std::unique_lock<std::mutex> EngineBackend::engine_lock() {
  return batcher_ ? batcher_->lock() : std::unique_lock<std::mutex>(solo_mu_);
}

SessionFeed& EngineBackend::feed() { return batcher_ ? static_cast<SessionFeed&>(*batcher_) : direct_feed(); }

std::string EngineBackend::describe() const {
  const EngineInfo& i = engine_->info();
  return strfmt("%s (%s, %s backend, %s numerics, ctx %u)", i.model_name.c_str(), i.quant.c_str(), i.backend.c_str(),
                numerics_name(i.numerics), ctx_);
}

std::string EngineBackend::describe_cache() const {
  const double session_mib = static_cast<double>(engine_->session_bytes(ctx_)) / (1 << 20);
  const EngineInfo& i = engine_->info();
  std::string s = strfmt("up to %zu resident session%s (%.1f MiB each; KV %s, %.0f bytes/token)", options_.sessions,
                         options_.sessions == 1 ? "" : "s", session_mib, i.kv_rows.c_str(), i.kv_bytes_per_token);
  if (batcher_)
    s += strfmt(
        "; %zu requests generate at once, batched steps of up to %zu tokens (prompt chunks of %zu beside "
        "decoding rows)",
        batching_.parallel, batcher_->step_tokens(), batcher_->shared_prefill_tokens());
  if (disk_) {
    const CacheStats st = disk_->stats();
    s += strfmt("; KV disk cache %s: %llu files, %.1f of %.0f MiB; saves from %zu tokens, frontier %zu, align %zu",
                disk_->dir().c_str(), static_cast<unsigned long long>(st.files),
                static_cast<double>(st.bytes) / (1 << 20), static_cast<double>(st.budget_bytes) / (1 << 20),
                policy_.min_tokens, policy_.frontier, policy_.align);
  } else if (!disk_off_.empty()) {
    s += "; KV disk cache off (" + disk_off_ + ")";
  } else {
    s += "; KV disk cache off (no --kv-disk-dir)";
  }
  return s;
}

EngineBackend::SlotState& EngineBackend::state(size_t slot) {
  DSV4_ASSERT(slot < slots_.size());
  return slots_[slot];
}

size_t EngineBackend::slot_of(const Session& s) const {
  for (size_t i = 0; i < pool_->size(); ++i)
    if (&pool_->session(i) == &s) return i;
  DSV4_ASSERT(false, "a session that is not in the pool");
  return 0;
}

const std::vector<int32_t>& EngineBackend::session_tokens() const { return pool_->session(current_).tokens(); }

const TextAnchor* EngineBackend::anchor_for(size_t slot, const RenderedPrompt& rendered) {
  SlotState& st = state(slot);
  if (st.anchor.tokens == 0 || rendered.empty()) return nullptr;
  if (st.anchor.tokens > pool_->session(slot).n_tokens() || !starts_with_pieces(rendered, st.visible)) return nullptr;
  return &st.anchor;
}

void EngineBackend::drop_visible(SlotState& st) {
  st.visible.clear();
  st.anchor = TextAnchor{};
}

expected<PromptChoice> EngineBackend::begin_job(const JobInput& in, JobSlot& job) {
  const Tokenizer& tok = tokenizer();
  auto reuse = [&](size_t slot, const std::vector<int32_t>& live) {
    return reusable_tokens(tok, live, in.prompt, in.rendered, anchor_for(slot, in.rendered));
  };
  if (batcher_ && !job.batch_active) {  // from now on steps cap the others' prompt chunks
    batcher_->arrive();
    job.batch_active = true;
  }
  auto engine = engine_lock();
  expected<PoolLease> leased = pool_->acquire(in.prompt.size(), reuse);
  // KV admission: while every session that fits runs a job, wait for one to end.
  while (!leased && pool_->in_use() > 0 && pool_->in_use() >= pool_->capacity()) {
    ++admission_waiting_;
    admit_cv_.wait(engine);
    --admission_waiting_;
    leased = pool_->acquire(in.prompt.size(), reuse);
  }
  if (!leased) return leased.error();
  const PoolLease lease = *leased;
  job.session = lease.slot;
  job.leased = true;
  current_ = lease.slot;
  Session& s = *lease.session;
  SlotState& st = state(job.session);
  const TextAnchor* anchor = anchor_for(job.session, in.rendered);
  PromptChoice choice = choose_prompt_tokens(tok, s.tokens(), in.prompt, in.rendered, anchor);
  // The transcript stays bound only while the prompt keeps all of the tokens it stands for.
  if (!anchor || choice.reused < st.anchor.tokens) drop_visible(st);

  size_t restored = 0;
  if (disk_ && choice.reused < choice.tokens.size()) {
    // A state of this prompt still on its way to disk (typically this agent's
    // session, displaced a moment ago) is worth the wait: prefilling it again costs more.
    const std::string text = rendered_text(in.rendered);
    writer_->wait_while_pending([&](const PreparedSave& p) {
      if (p.tokens.size() <= choice.reused) return false;
      const bool by_tokens =
          p.tokens.size() <= in.prompt.size() && std::equal(p.tokens.begin(), p.tokens.end(), in.prompt.begin());
      return by_tokens || (!text.empty() && text.compare(0, p.key.size(), p.key) == 0);
    });
    CacheQuery q;
    q.tokens = in.prompt;
    q.rendered = in.rendered.empty() ? nullptr : &in.rendered;
    q.min_tokens = choice.reused + 1;
    const auto t_restore = std::chrono::steady_clock::now();
    if (auto hit = cache_restore(*disk_, tok, s, q)) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_restore).count();
      log_info("KV disk cache: restored %zu of %zu prompt tokens from %s in %.0f ms (%s, %s match; %zu were resident)",
               hit->cached_tokens, hit->prompt.size(), hit->file.c_str(), ms, save_reason_name(hit->reason),
               hit->by_tokens ? "token" : "text", choice.reused);
      restored = hit->cached_tokens;
      choice.tokens = std::move(hit->prompt);
      choice.reused = hit->cached_tokens;
      choice.stitched = !hit->by_tokens;
      drop_visible(st);
      if (!hit->decoded_key && hit->text_bytes > 0 && q.rendered) {
        // A transcript key: the file's tokens stand for the rendered prompt's first text_bytes bytes.
        st.visible = rendered_prefix(in.rendered, hit->text_bytes);
        st.anchor = TextAnchor{hit->cached_tokens, hit->text_bytes};
      }
      st.last_stored = hit->cached_tokens;
    }
  }
  job.share = in.share;
  pool_->set_prompt_tokens(job.session, choice.tokens.size());
  job.prompt_tokens = choice.tokens.size();
  job.first_call = true;
  job.hidden_reasoning = in.hidden_reasoning;
  job.cold_save = disk_ && restored == 0 ? cold_store_length(choice.tokens, tok, policy_) : 0;
  log_debug("session %zu (%s): %zu of %zu prompt tokens reused, %zu restored from disk, cold save at %zu", job.session,
            pool_pick_name(lease.pick), choice.reused, choice.tokens.size(), restored, job.cold_save);
  {
    std::lock_guard<std::mutex> lock(report_mu_);
    ++report_.picks[static_cast<size_t>(lease.pick)];
    report_.restored_tokens += restored;
  }
  update_report();
  return choice;
}

std::vector<uint8_t> EngineBackend::save_current() const { return pool_->session(current_).save(); }

Status EngineBackend::load_current(std::span<const uint8_t> state) {
  auto engine = engine_lock();
  Session& s = pool_->session(current_);
  SlotState& st = this->state(current_);
  drop_visible(st);
  st.last_stored = 0;
  Status loaded = s.load(state);
  if (!loaded) s.reset();  // a failed load may have written part of the state
  update_report();
  return loaded;
}

void EngineBackend::reset_current() {
  auto engine = engine_lock();
  SlotState& st = state(current_);
  drop_visible(st);
  st.last_stored = 0;
  pool_->session(current_).reset();
  update_report();
}

bool EngineBackend::save_allowed(const JobSlot& job, std::span<const int32_t> timeline, size_t n) const {
  if (n <= job.prompt_tokens) return true;  // the client's rendered prompt
  // Generated (or forced) tokens: a thinking turn's reasoning never comes back
  // from the client, and a DSML block is re-rendered by it.
  if (job.hidden_reasoning) return false;
  const int32_t dsml = tokenizer().dsml();
  const size_t end = std::min(n, timeline.size());
  return std::find(timeline.begin() + static_cast<std::ptrdiff_t>(job.prompt_tokens),
                   timeline.begin() + static_cast<std::ptrdiff_t>(end),
                   dsml) == timeline.begin() + static_cast<std::ptrdiff_t>(end);
}

expected<GenerateResult> EngineBackend::generate(JobSlot& job, std::span<const int32_t> prompt,
                                                 const GenerateOptions& o, const GenerateCallbacks& cb) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  DSV4_ASSERT(job.leased, "generate() without a session");
  const size_t slot = job.session;
  Session* sp = nullptr;
  size_t lcp = 0;
  {
    auto engine = engine_lock();
    sp = &pool_->session(slot);
    SlotState& st = state(slot);
    lcp = common_prefix(sp->tokens(), prompt);
    st.last_stored = std::min(st.last_stored, lcp);
    if (st.anchor.tokens > lcp) drop_visible(st);
  }
  // The session is this job's until end_job(); the step thread touches it only inside feed() calls.
  Session& s = *sp;
  SlotState& st = state(slot);
  const size_t cold = job.first_call ? job.cold_save : 0;
  job.first_call = false;
  auto report = [&] {
    auto engine = engine_lock();
    update_report();
  };

  // n > 1: the prompt is prefilled once, by the first of the request's jobs, and copied (prompt_share.h).
  std::shared_ptr<PromptShare> lead;  // this job prefills the prompt for the others
  if (std::shared_ptr<PromptShare> share = std::move(job.share); share && prompt.size() < s.ctx()) {
    if (share->lead()) {
      lead = std::move(share);
    } else if (std::shared_ptr<const std::vector<uint8_t>> copy = share->wait(cb.cancelled)) {
      auto engine = engine_lock();
      drop_visible(st);
      st.last_stored = 0;
      if (!s.load(*copy)) s.reset();            // a failed load: prefill as usual
      lcp = common_prefix(s.tokens(), prompt);  // the prompt tokens of the copy count as reused
    }
  }
  struct Unpublished {  // a leader leaving early (error, cancelled) publishes nothing: the others prefill
    std::shared_ptr<PromptShare>& share;
    ~Unpublished() {
      if (share) share->publish(nullptr);
    }
  } unpublished{lead};
  std::optional<StepBatcher::Member> member;  // steps wait for this job's rows (not while it waits above)
  if (batcher_) member.emplace(*batcher_);

  // Prefill up to each save point, save there (the copy is taken now; the file is written meanwhile).
  if (disk_ && prompt.size() < s.ctx()) {
    for (size_t p : prefill_save_points(lcp, prompt.size(), cold, st.last_stored, policy_)) {
      if (!save_allowed(job, prompt, p)) continue;
      RunHooks hooks;
      hooks.cancelled = cb.cancelled;
      auto synced = sync_session(s, prompt.first(p), hooks, feed());
      if (!synced) {
        report();
        if (cb.cancelled && cb.cancelled()) {
          GenerateResult r;
          r.finish = FinishReason::CANCELLED;
          r.prompt_tokens = prompt.size();
          r.cached_tokens = lcp;
          r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
          return r;
        }
        return synced.error();
      }
      auto engine = engine_lock();
      save_slot(slot, p == cold ? SaveReason::COLD : SaveReason::FRONTIER, SaveWait::SKIP_IF_BUSY);
    }
  }
  if (lead) {  // the whole prompt now, then its state for the others (nullptr when that failed: they prefill)
    std::shared_ptr<const std::vector<uint8_t>> state;
    RunHooks hooks;
    hooks.cancelled = cb.cancelled;
    hooks.progress = cb.on_prefill_progress;
    if (sync_session(s, prompt, hooks, feed())) {
      auto engine = engine_lock();
      state = std::make_shared<const std::vector<uint8_t>>(s.save());
    }
    lead->publish(std::move(state));
  }
  const double pre_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  // Frontiers while decoding: generate() polls `cancelled` before every token,
  // when the session holds exactly the tokens fed so far.
  GenerateCallbacks inner = cb;
  if (disk_ && policy_.frontier > 0) {
    const size_t n_prompt = prompt.size();
    inner.cancelled = [this, &cb, &s, &st, &job, slot, n_prompt] {
      if (cb.cancelled && cb.cancelled()) return true;
      const size_t n = s.n_tokens();
      if (n > n_prompt && frontier_due(n, st.last_stored, policy_) && save_allowed(job, s.tokens(), n)) {
        auto engine = engine_lock();
        save_slot(slot, SaveReason::FRONTIER, SaveWait::SKIP_IF_BUSY);
      }
      return false;
    };
  }
  GenerateOptions go = o;  // (the step batcher verifies proposals too: Engine::step's verify items)
  if (go.draft == 0) {
    go.draft = batching_.draft;
    go.draft_margin = batching_.draft_margin;
  }
  auto r = dsv4::generate(s, tokenizer(), prompt, go, inner, feed());
  if (r) {
    r->cached_tokens = lcp;
    r->prefill_seconds += pre_seconds;
  }
  report();
  return r;
}

void EngineBackend::end_job(JobSlot& job, const JobInput& in, const JobOutcome& out) {
  if (job.batch_active) {
    batcher_->depart();
    job.batch_active = false;
  }
  if (!job.leased) return;
  auto engine = engine_lock();
  const Session& s = pool_->session(job.session);
  SlotState& st = state(job.session);
  if (in.hidden_reasoning && !out.error) {
    auto v = visible_transcript(tokenizer(), in.rendered, out.result);
    if (v && s.n_tokens() == job.prompt_tokens + out.result.tokens.size()) {
      st.anchor = TextAnchor{s.n_tokens(), rendered_text(*v).size()};
      st.visible = std::move(*v);
    }
  }
  pool_->release(job.session);
  job.leased = false;
  admit_cv_.notify_all();
}

void EngineBackend::save_slot(size_t slot, SaveReason reason, SaveWait wait) {
  if (!disk_) return;
  const Session& s = pool_->session(slot);
  const size_t n = s.n_tokens();
  if (!worth_saving(n, policy_)) return;
  SlotState& st = state(slot);
  switch (wait) {
    case SaveWait::SKIP_IF_BUSY:
      if (!writer_->has_room()) {
        log_debug("KV disk cache: the writer is busy; %s save of %zu tokens skipped", save_reason_name(reason), n);
        std::lock_guard<std::mutex> lock(report_mu_);
        ++report_.skipped_busy;
        return;
      }
      break;
    case SaveWait::WAIT: writer_->wait_for_room(); break;
  }
  const Tokenizer& tok = tokenizer();
  CacheSave cs;
  cs.reason = reason;
  if (st.anchor.tokens > 0 && st.anchor.tokens <= n)
    cs.visible_key = rendered_text(st.visible) +
                     tok.decode(std::vector<int32_t>(s.tokens().begin() + static_cast<std::ptrdiff_t>(st.anchor.tokens),
                                                     s.tokens().end()));
  ToolDsmlMap calls;
  if (tools_ && std::find(s.tokens().begin(), s.tokens().end(), tok.dsml()) != s.tokens().end())
    calls = tools_->calls_in(cs.visible_key ? *cs.visible_key : tok.decode(s.tokens()));
  cs.tools = calls.empty() ? nullptr : &calls;
  auto prepared = cache_prepare_save(*disk_, tok, s, cs);
  if (!prepared) {
    log_warn("KV disk cache: cannot capture the session for saving: %s", prepared.error().message.c_str());
    return;
  }
  st.last_stored = std::max(st.last_stored, n);
  if (prepared->skipped) {
    log_debug("KV disk cache: %s save of %zu tokens skipped: %s", save_reason_name(reason), n,
              store_outcome_name(prepared->skipped->outcome));
    std::lock_guard<std::mutex> lock(report_mu_);
    if (prepared->skipped->outcome == StoreOutcome::ALREADY_PRESENT) ++report_.skipped_present;
    return;
  }
  log_debug("KV disk cache: saving %zu tokens of session %zu (%s%s)", n, slot, save_reason_name(reason),
            cs.visible_key ? ", visible transcript key" : "");
  {
    std::lock_guard<std::mutex> lock(report_mu_);
    const uint32_t r = static_cast<uint32_t>(reason);
    if (r >= 1 && r <= report_.saves.size()) ++report_.saves[r - 1];
  }
  writer_->submit(std::move(*prepared));
}

void EngineBackend::set_tool_memory(ToolMemory* memory) { tools_ = memory; }

ToolDsmlMap EngineBackend::find_tool_calls(const std::vector<std::string>& ids) {
  if (!disk_ || ids.empty()) return {};
  return disk_->find_tool_calls(ids);
}

void EngineBackend::update_report() {
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < pool_->size(); ++i) sizes.push_back(pool_->session(i).n_tokens());
  const size_t capacity = pool_->capacity();  // --sessions, or fewer when the backend had no room for more
  std::lock_guard<std::mutex> lock(report_mu_);
  report_.session_tokens = std::move(sizes);
  report_.max_sessions = capacity;
}

CacheReport EngineBackend::cache_report() const {
  CacheReport r;
  {
    std::lock_guard<std::mutex> lock(report_mu_);
    r = report_;
  }
  r.session_bytes = engine_->session_bytes(ctx_);
  if (disk_) {
    r.disk_enabled = true;
    r.disk = disk_->stats();
    r.write_failures = writer_->stats().failed;
  }
  return r;
}

StepReport EngineBackend::step_report() const { return batcher_ ? batcher_->report() : StepReport{}; }

size_t EngineBackend::admission_waiting() const { return admission_waiting_.load(); }

void EngineBackend::shutdown(bool save_sessions) {
  if (!disk_) return;
  auto engine = engine_lock();
  if (save_sessions) {
    size_t n = 0;
    pool_->for_each([&](Session& s) {
      if (!worth_saving(s.n_tokens(), policy_)) return;
      save_slot(slot_of(s), SaveReason::SHUTDOWN, SaveWait::WAIT);
      ++n;
    });
    if (n > 0) log_info("KV disk cache: saving %zu live session%s before exit", n, n == 1 ? "" : "s");
  }
  writer_->flush();
  update_report();
}

}  // namespace dsv4::runtime
