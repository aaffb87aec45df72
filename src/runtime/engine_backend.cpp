#include "runtime/engine_backend.h"

#include <algorithm>
#include <chrono>

#include "core/log.h"
#include "runtime/tool_memory.h"

namespace dsv4::runtime {

EngineBackend::EngineBackend(std::unique_ptr<Engine> engine, uint32_t ctx, const KvCacheOptions& cache)
    : engine_(std::move(engine)), ctx_(ctx), options_(cache), policy_(cache.policy()) {}

expected<std::unique_ptr<EngineBackend>> EngineBackend::create(std::unique_ptr<Engine> engine, uint32_t ctx,
                                                               const KvCacheOptions& cache) {
  if (cache.sessions < 1) return make_error("--sessions must be at least 1");
  if (cache.write_queue < 1) return make_error("the cache writer needs room for at least one save");
  std::unique_ptr<EngineBackend> b(new EngineBackend(std::move(engine), ctx, cache));
  SessionPoolOptions po;
  po.max_sessions = cache.sessions;
  po.ctx = ctx;
  EngineBackend* self = b.get();
  po.on_displace = [self](Session& s) { self->save_slot(self->slot_of(s), SaveReason::DISPLACED, SaveWait::WAIT); };
  b->pool_ = std::make_unique<SessionPool>(*b->engine_, std::move(po));
  // The first session now, so a context the engine cannot hold fails at start.
  DSV4_TRY_ASSIGN(PoolLease first, b->pool_->acquire(std::span<const int32_t>{}));
  b->current_ = first.slot;
  b->ctx_ = first.session->ctx();
  b->state(first.slot);
  // The other sessions are made when requests need them; say now if they will not all fit.
  if (const std::optional<uint64_t> free_b = b->engine_->free_memory(); free_b && cache.sessions > 1) {
    const uint64_t each = b->engine_->session_bytes(b->ctx_);
    const uint64_t fit = 1 + *free_b / std::max<uint64_t>(each + (uint64_t{256} << 20), 1);
    if (fit < cache.sessions)
      log_warn(
          "--sessions %zu: the backend has room for about %llu sessions of %u tokens (%.2f GiB each, %.2f GiB free "
          "after the first); the pool will keep the ones that fit",
          cache.sessions, static_cast<unsigned long long>(fit), b->ctx_, static_cast<double>(each) / (1 << 30),
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
  if (writer_) writer_->flush();
}

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
  if (slots_.size() <= slot) slots_.resize(slot + 1);
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

expected<PromptChoice> EngineBackend::begin_job(const JobInput& in) {
  const Tokenizer& tok = tokenizer();
  auto reuse = [&](size_t slot, const std::vector<int32_t>& live) {
    return reusable_tokens(tok, live, in.prompt, in.rendered, anchor_for(slot, in.rendered));
  };
  DSV4_TRY_ASSIGN(PoolLease lease, pool_->acquire(in.prompt.size(), reuse));
  current_ = lease.slot;
  Session& s = *lease.session;
  SlotState& st = state(current_);
  const TextAnchor* anchor = anchor_for(current_, in.rendered);
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
  pool_->set_prompt_tokens(current_, choice.tokens.size());
  job_prompt_ = choice.tokens.size();
  job_first_call_ = true;
  job_hidden_reasoning_ = in.hidden_reasoning;
  job_cold_ = disk_ && restored == 0 ? cold_store_length(choice.tokens, tok, policy_) : 0;
  log_debug("session %zu (%s): %zu of %zu prompt tokens reused, %zu restored from disk, cold save at %zu", current_,
            pool_pick_name(lease.pick), choice.reused, choice.tokens.size(), restored, job_cold_);
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
  SlotState& st = state(current_);
  drop_visible(st);
  st.last_stored = 0;
  pool_->session(current_).reset();
  update_report();
}

bool EngineBackend::save_allowed(std::span<const int32_t> timeline, size_t n) const {
  if (n <= job_prompt_) return true;  // the client's rendered prompt
  // Generated (or forced) tokens: a thinking turn's reasoning never comes back
  // from the client, and a DSML block is re-rendered by it.
  if (job_hidden_reasoning_) return false;
  const int32_t dsml = tokenizer().dsml();
  const size_t end = std::min(n, timeline.size());
  return std::find(timeline.begin() + static_cast<std::ptrdiff_t>(job_prompt_),
                   timeline.begin() + static_cast<std::ptrdiff_t>(end),
                   dsml) == timeline.begin() + static_cast<std::ptrdiff_t>(end);
}

expected<GenerateResult> EngineBackend::generate(std::span<const int32_t> prompt, const GenerateOptions& o,
                                                 const GenerateCallbacks& cb) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  Session& s = pool_->session(current_);
  SlotState& st = state(current_);
  size_t lcp = 0;
  while (lcp < s.n_tokens() && lcp < prompt.size() && s.tokens()[lcp] == prompt[lcp]) ++lcp;
  st.last_stored = std::min(st.last_stored, lcp);
  if (st.anchor.tokens > lcp) drop_visible(st);
  const size_t cold = job_first_call_ ? job_cold_ : 0;
  job_first_call_ = false;

  // Prefill up to each save point, save there (the copy is taken now; the file is written meanwhile).
  if (disk_ && prompt.size() < s.ctx()) {
    for (size_t p : prefill_save_points(lcp, prompt.size(), cold, st.last_stored, policy_)) {
      if (!save_allowed(prompt, p)) continue;
      RunHooks hooks;
      hooks.cancelled = cb.cancelled;
      auto synced = sync_session(s, prompt.first(p), hooks);
      if (!synced) {
        if (cb.cancelled && cb.cancelled()) {
          GenerateResult r;
          r.finish = FinishReason::CANCELLED;
          r.prompt_tokens = prompt.size();
          r.cached_tokens = lcp;
          r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
          update_report();
          return r;
        }
        update_report();
        return synced.error();
      }
      save_slot(current_, p == cold ? SaveReason::COLD : SaveReason::FRONTIER, SaveWait::SKIP_IF_BUSY);
    }
  }
  const double pre_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  // Frontiers while decoding: generate() polls `cancelled` before every token,
  // when the session holds exactly the tokens fed so far.
  GenerateCallbacks inner = cb;
  if (disk_ && policy_.frontier > 0) {
    const size_t n_prompt = prompt.size();
    inner.cancelled = [this, &cb, &s, &st, n_prompt] {
      if (cb.cancelled && cb.cancelled()) return true;
      const size_t n = s.n_tokens();
      if (n > n_prompt && frontier_due(n, st.last_stored, policy_) && save_allowed(s.tokens(), n))
        save_slot(current_, SaveReason::FRONTIER, SaveWait::SKIP_IF_BUSY);
      return false;
    };
  }
  auto r = dsv4::generate(s, tokenizer(), prompt, o, inner);
  if (r) {
    r->cached_tokens = lcp;
    r->prefill_seconds += pre_seconds;
  }
  update_report();
  return r;
}

void EngineBackend::end_job(const JobInput& in, const JobOutcome& out) {
  if (!in.hidden_reasoning || out.error) return;
  const Session& s = pool_->session(current_);
  SlotState& st = state(current_);
  auto v = visible_transcript(tokenizer(), in.rendered, out.result);
  if (!v || s.n_tokens() != job_prompt_ + out.result.tokens.size()) return;
  st.anchor = TextAnchor{s.n_tokens(), rendered_text(*v).size()};
  st.visible = std::move(*v);
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
  std::lock_guard<std::mutex> lock(report_mu_);
  report_.session_tokens = std::move(sizes);
}

CacheReport EngineBackend::cache_report() const {
  CacheReport r;
  {
    std::lock_guard<std::mutex> lock(report_mu_);
    r = report_;
  }
  r.max_sessions = pool_->capacity();  // --sessions, or fewer when the backend had no room for more
  r.session_bytes = engine_->session_bytes(ctx_);
  if (disk_) {
    r.disk_enabled = true;
    r.disk = disk_->stats();
    r.write_failures = writer_->stats().failed;
  }
  return r;
}

void EngineBackend::shutdown(bool save_sessions) {
  if (!disk_) return;
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
