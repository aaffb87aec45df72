#include "runtime/session_pool.h"

#include <algorithm>

#include "core/log.h"
#include "generate/generate.h"

namespace dsv4::runtime {

const char* pool_pick_name(PoolPick p) {
  switch (p) {
    case PoolPick::EXTENDS: return "extends";
    case PoolPick::REGENERATES: return "regenerates";
    case PoolPick::NEW: return "new";
    case PoolPick::DISPLACED: return "displaced";
  }
  return "?";
}

SessionPool::SessionPool(Engine& engine, SessionPoolOptions options) : engine_(engine), options_(std::move(options)) {
  DSV4_ASSERT(options_.max_sessions >= 1, "a session pool holds at least one session");
}

SessionPool::~SessionPool() = default;

Session& SessionPool::session(size_t slot) {
  DSV4_ASSERT(slot < slots_.size());
  return *slots_[slot].session;
}

PoolLease SessionPool::lease(size_t slot, size_t reused, PoolPick pick, size_t prompt_tokens) {
  Slot& s = slots_[slot];
  DSV4_ASSERT(!s.in_use, "a session handed out twice");
  s.in_use = true;
  ++in_use_;
  s.last_use = ++clock_;
  s.prompt_tokens = prompt_tokens;
  return PoolLease{s.session.get(), slot, reused, pick};
}

expected<PoolLease> SessionPool::acquire(std::span<const int32_t> prompt) {
  return acquire(prompt.size(), [&](size_t, const std::vector<int32_t>& have) { return common_prefix(have, prompt); });
}

expected<PoolLease> SessionPool::acquire(size_t prompt_tokens, const ReuseFn& reuse) {
  std::vector<size_t> r(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) r[i] = reuse(i, slots_[i].session->tokens());
  // Best slot among those `ok` accepts: larger key first, then the most recently used.
  auto best = [&](auto ok, auto key) {
    size_t pick = slots_.size();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].in_use || !ok(i)) continue;
      if (pick == slots_.size() || key(i) > key(pick) ||
          (key(i) == key(pick) && slots_[i].last_use > slots_[pick].last_use))
        pick = i;
    }
    return pick;
  };
  auto n = [&](size_t i) { return slots_[i].session->n_tokens(); };
  // 1. EXTENDS
  size_t i = best([&](size_t k) { return n(k) > 0 && r[k] == n(k); }, n);
  if (i < slots_.size()) return lease(i, r[i], PoolPick::EXTENDS, prompt_tokens);
  // 2. REGENERATES
  i = best([&](size_t k) { return n(k) > 0 && slots_[k].prompt_tokens > 0 && r[k] >= slots_[k].prompt_tokens; },
           [&](size_t k) { return r[k]; });
  if (i < slots_.size()) return lease(i, r[i], PoolPick::REGENERATES, prompt_tokens);
  // 3. NEW: an empty session, or a new one while below capacity.
  i = best([&](size_t k) { return n(k) == 0; }, [](size_t) { return 0; });
  if (i < slots_.size()) return lease(i, 0, PoolPick::NEW, prompt_tokens);
  if (slots_.size() < options_.max_sessions) {
    expected<std::unique_ptr<Session>> s =
        options_.make_session ? options_.make_session(options_.ctx) : engine_.new_session(options_.ctx);
    if (s) {
      slots_.push_back(Slot{std::move(*s), 0, 0});
      return lease(slots_.size() - 1, 0, PoolPick::NEW, prompt_tokens);
    }
    if (slots_.empty()) return s.error();
    log_warn("no room for resident session %zu of %zu (%s): keeping %zu", slots_.size() + 1, options_.max_sessions,
             s.error().message.c_str(), slots_.size());
    options_.max_sessions = slots_.size();
  }
  // 4. DISPLACED: the least recently used of those not in use.
  i = slots_.size();
  for (size_t k = 0; k < slots_.size(); ++k)
    if (!slots_[k].in_use && (i == slots_.size() || slots_[k].last_use < slots_[i].last_use)) i = k;
  if (i == slots_.size()) return make_error("every session (%zu) is in use by a running request", slots_.size());
  if (options_.on_displace) options_.on_displace(*slots_[i].session);
  return lease(i, r[i], PoolPick::DISPLACED, prompt_tokens);
}

void SessionPool::release(size_t slot) {
  DSV4_ASSERT(slot < slots_.size() && slots_[slot].in_use, "releasing a session that is not in use");
  slots_[slot].in_use = false;
  --in_use_;
}

void SessionPool::set_prompt_tokens(size_t slot, size_t prompt_tokens) {
  DSV4_ASSERT(slot < slots_.size());
  slots_[slot].prompt_tokens = prompt_tokens;
}

void SessionPool::for_each(const std::function<void(Session&)>& fn) {
  std::vector<size_t> order;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].session->n_tokens() > 0) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return slots_[a].last_use > slots_[b].last_use; });
  for (size_t i : order) fn(*slots_[i].session);
}

}  // namespace dsv4::runtime
