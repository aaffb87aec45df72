#include "runtime/step_batcher.h"

#include <algorithm>
#include <vector>

#include "core/log.h"

namespace dsv4::runtime {

StepBatcher::StepBatcher(Engine& engine, StepBatcherOptions options) : engine_(engine), options_(options) {
  DSV4_ASSERT(options_.step_tokens >= 1, "a step takes at least one token");
  thread_ = std::thread([this] { loop(); });
}

StepBatcher::~StepBatcher() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

std::unique_lock<std::mutex> StepBatcher::lock() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++lockers_;
  }
  std::unique_lock<std::mutex> engine(engine_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    --lockers_;
  }
  work_cv_.notify_all();
  return engine;
}

void StepBatcher::arrive() {
  std::lock_guard<std::mutex> lk(mu_);
  ++active_;
}

void StepBatcher::depart() {
  std::lock_guard<std::mutex> lk(mu_);
  DSV4_ASSERT(active_ > 0);
  --active_;
}

void StepBatcher::join() {
  std::lock_guard<std::mutex> lk(mu_);
  ++members_;
}

void StepBatcher::leave() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    DSV4_ASSERT(members_ > 0);
    --members_;
  }
  work_cv_.notify_all();  // the others may be complete now
}

expected<size_t> StepBatcher::feed(Session& session, std::span<const int32_t> tokens, const Session::KeepFn* keep) {
  DSV4_ASSERT(!tokens.empty());
  if (keep && tokens.size() > std::min(options_.step_tokens, Session::max_verify()))
    return make_error("a verify pass of %zu tokens exceeds a step of %zu", tokens.size(),
                      std::min(options_.step_tokens, Session::max_verify()));
  Request r;
  r.session = &session;
  r.tokens = tokens;
  r.keep = keep;
  r.arrived = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_) return make_error("the engine is shutting down");
  pending_.push_back(&r);
  work_cv_.notify_all();
  done_cv_.wait(lk, [&] { return r.done; });
  if (!r.status) return r.status.error();
  return keep ? r.kept : r.taken;
}

expected<size_t> StepBatcher::verify(Session& session, std::span<const int32_t> tokens, const Session::KeepFn& keep) {
  return feed(session, tokens, &keep);
}

Status StepBatcher::prefill(Session& session, std::span<const int32_t> tokens, const RunHooks& hooks) {
  size_t done = 0;
  while (done < tokens.size()) {
    if (hooks.cancelled && hooks.cancelled()) return make_error("cancelled");
    DSV4_TRY_ASSIGN(size_t k, feed(session, tokens.subspan(done)));
    done += k;
    if (hooks.progress) hooks.progress(done, tokens.size());
  }
  if (!tokens.empty()) {
    auto engine = lock();
    session.checkpoint();
  }
  return {};
}

Status StepBatcher::decode(Session& session, int32_t token) {
  DSV4_TRY(feed(session, std::span<const int32_t>(&token, 1)));
  return {};
}

Status StepBatcher::rewind(Session& session, size_t n_tokens) {
  auto engine = lock();
  return session.rewind(n_tokens);
}

void StepBatcher::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, nothing asked
    // Gather: wait for the members still sampling, up to `gather` after the oldest request or the last step.
    work_cv_.wait_until(lk, std::max(pending_.front()->arrived, last_step_end_) + options_.gather,
                        [&] { return stop_ || pending_.size() >= members_; });
    // Threads waiting for the engine lock (a new request's session, a save) go first.
    work_cv_.wait(lk, [&] { return lockers_ == 0; });
    std::vector<Request*> batch;
    size_t budget = options_.step_tokens;
    for (Request* r : pending_)  // decode rows and verify passes, whole
      if (r->whole() && budget >= r->tokens.size()) {
        r->taken = r->tokens.size();
        budget -= r->taken;
        batch.push_back(r);
      }
    // Prompt chunks: the whole budget for a prompt alone, the shared budget beside other active jobs.
    const size_t prompts = static_cast<size_t>(
        std::count_if(pending_.begin(), pending_.end(), [](const Request* r) { return !r->whole(); }));
    if ((!batch.empty() || prompts > 1 || active_ > prompts) && options_.shared_prefill_tokens > 0)
      budget = std::min(budget, options_.shared_prefill_tokens);
    for (Request* r : pending_)
      if (!r->whole() && budget > 0) {
        r->taken = std::min(r->tokens.size(), budget);
        budget -= r->taken;
        batch.push_back(r);
      }
    std::erase_if(pending_, [](const Request* r) { return r->taken > 0; });
    lk.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    run(batch);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lk.lock();
    last_step_end_ = std::chrono::steady_clock::now();
    record(batch, seconds);
    for (Request* r : batch) r->done = true;
    done_cv_.notify_all();
  }
}

void StepBatcher::run(std::span<Request* const> batch) {
  auto engine = lock();
  std::vector<SessionStep> items;
  items.reserve(batch.size());
  for (Request* r : batch) items.push_back(SessionStep{r->session, r->tokens.first(r->taken), r->keep, &r->kept});
  Status st = engine_.step(items);
  if (st || batch.size() == 1) {
    for (Request* r : batch) r->status = st;
    return;
  }
  // Nothing was appended: each request alone, so only the one at fault fails.
  log_debug("step of %zu sessions failed (%s): running them one by one", batch.size(), st.error().message.c_str());
  for (size_t k = 0; k < batch.size(); ++k) batch[k]->status = engine_.step(std::span<const SessionStep>(&items[k], 1));
}

void StepBatcher::record(std::span<Request* const> batch, double seconds) {
  StepRecord one;
  one.rows = batch.size();
  one.seconds = seconds;
  for (const Request* q : batch) (q->whole() ? one.decode_rows : one.prefill_tokens) += q->taken;
  if (options_.on_step) options_.on_step(one);
  StepReport& r = report_;
  ++r.steps;
  r.rows += batch.size();
  r.seconds += seconds;
  for (const Request* q : batch) {
    if (!q->status) continue;
    (q->whole() ? r.decode_tokens : r.prefill_tokens) += q->taken;
  }
  const auto rb = std::lower_bound(StepReport::k_row_bounds.begin(), StepReport::k_row_bounds.end(), batch.size());
  ++r.steps_by_rows[static_cast<size_t>(rb - StepReport::k_row_bounds.begin())];
  const auto sb = std::lower_bound(StepReport::k_second_bounds.begin(), StepReport::k_second_bounds.end(), seconds);
  ++r.steps_by_seconds[static_cast<size_t>(sb - StepReport::k_second_bounds.begin())];
}

StepReport StepBatcher::report() const {
  std::lock_guard<std::mutex> lk(mu_);
  StepReport r = report_;
  r.members = members_;
  r.waiting = pending_.size();
  return r;
}

}  // namespace dsv4::runtime
