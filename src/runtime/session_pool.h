// Resident sessions (`dsv4 serve --sessions N`): up to N live Sessions, so
// several agents' conversations stay warm at once. For each request the pool
// picks the session to run it on; the caller then restores from the disk
// cache if that beats what the session keeps (session_cache.h), and runs
// generate(), which keeps the reusable prefix and prefills the rest.
//
// Choice, for a prompt whose reuse of a session's tokens is r (the longest
// common token prefix by default; a caller may pass a smarter measure, e.g.
// the server's text stitching), in order:
//   1. EXTENDS: a session the prompt keeps entirely (r == its tokens > 0) —
//      the one holding the most tokens. A conversation continuing.
//   2. REGENERATES: a session whose last request's prompt the new prompt
//      keeps entirely, diverging only inside the completion (r >= that prompt's
//      length) — the largest r. A retry or an edited reply; the old completion
//      is dropped, nothing else.
//   3. NEW: while fewer than N sessions are live (or one is empty), a new one.
//      A partially matching session (say a sibling conversation sharing the
//      system prompt) is not cut: its owner is likely to come back, and the
//      shared prefix is what the disk cache's cold files hold.
//      When a new session cannot be made (say the GPU has no room for its
//      state) and others are live, the pool keeps the ones it has from then
//      on (capacity() drops, logged once) and goes on to 4 instead of failing
//      the request; with none live the error is returned.
//   4. DISPLACED: the least recently used session; `on_displace` runs first
//      (the server saves it to the disk cache), then it is handed out as is
//      (generate() keeps whatever prefix it shares).
// Ties in 1, 2: the most recently used. Each choice marks the session used
// and remembers the prompt length for rule 2.
//
// Leases: a session handed out is in use until release(), and is not handed
// out again meanwhile (with `--parallel N` several jobs run at once, each on
// its own session). When every session that fits is in use, acquire() fails
// and in_use() == capacity(): the caller waits for a release (KV admission:
// a request whose state does not fit waits instead of failing).
//
// Threading: one thread at a time (the caller holds the engine lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/error.h"
#include "dsv4/engine.h"

namespace dsv4::runtime {

struct SessionPoolOptions {
  size_t max_sessions = 1;
  uint32_t ctx = 0;                           // context of new sessions (0: the engine default)
  std::function<void(Session&)> on_displace;  // before a session goes to an unrelated request
  // Makes a new session (null: engine.new_session(ctx)); tests inject failures.
  std::function<expected<std::unique_ptr<Session>>(uint32_t ctx)> make_session;
};

enum class PoolPick { EXTENDS, REGENERATES, NEW, DISPLACED };
const char* pool_pick_name(PoolPick p);

struct PoolLease {
  Session* session = nullptr;
  size_t slot = 0;
  size_t reused = 0;  // r for the chosen session (0 for a new one)
  PoolPick pick = PoolPick::NEW;
};

class SessionPool {
 public:
  // Reuse of a session's tokens by the request: how many leading tokens it
  // keeps. `slot` names the session (stable for the pool's lifetime), so a
  // caller can consult what it keeps per session (e.g. the server's
  // client-visible transcript of a thinking turn).
  using ReuseFn = std::function<size_t(size_t slot, const std::vector<int32_t>& session_tokens)>;

  SessionPool(Engine& engine, SessionPoolOptions options);
  ~SessionPool();
  SessionPool(const SessionPool&) = delete;
  SessionPool& operator=(const SessionPool&) = delete;

  // Reuse = the longest common prefix with `prompt`.
  expected<PoolLease> acquire(std::span<const int32_t> prompt);
  // Reuse given by `reuse`; `prompt_tokens` is the request's prompt length.
  expected<PoolLease> acquire(size_t prompt_tokens, const ReuseFn& reuse);

  // The session on `slot` is free for other requests again.
  void release(size_t slot);
  size_t in_use() const { return in_use_; }

  // The prompt length the request on `slot` actually used, when it differs
  // from what acquire() was told (the caller chose other tokens for the same
  // text, e.g. the session's sampled tokens + the rest): rule 2 compares the
  // next request's reuse with it.
  void set_prompt_tokens(size_t slot, size_t prompt_tokens);

  size_t size() const { return slots_.size(); }  // live sessions
  size_t capacity() const { return options_.max_sessions; }
  Session& session(size_t slot);
  // Visits every live session holding tokens, most recently used first (shutdown saves).
  void for_each(const std::function<void(Session&)>& fn);

 private:
  struct Slot {
    std::unique_ptr<Session> session;
    uint64_t last_use = 0;     // pool clock (acquire count)
    size_t prompt_tokens = 0;  // prompt length of the last request served
    bool in_use = false;       // leased, not released yet
  };
  PoolLease lease(size_t slot, size_t reused, PoolPick pick, size_t prompt_tokens);

  Engine& engine_;
  SessionPoolOptions options_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
  size_t in_use_ = 0;
};

}  // namespace dsv4::runtime
