#include "generate/generate.h"

#include <algorithm>
#include <chrono>

#include "generate/reply_stream.h"

namespace dsv4 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::STOP: return "stop";
    case FinishReason::LENGTH: return "length";
    case FinishReason::TOOL_CALLS: return "tool_calls";
    case FinishReason::CANCELLED: return "cancelled";
  }
  return "?";
}

namespace {

class DirectFeed final : public SessionFeed {
 public:
  Status prefill(Session& s, std::span<const int32_t> tokens, const RunHooks& hooks) override {
    return s.prefill(tokens, hooks);
  }
  Status decode(Session& s, int32_t token) override { return s.decode(token); }
  Status rewind(Session& s, size_t n) override { return s.rewind(n); }
  bool can_verify() const override { return true; }
  expected<size_t> verify(Session& s, std::span<const int32_t> tokens, const Session::KeepFn& keep) override {
    return s.verify(tokens, keep);
  }
};

}  // namespace

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(n), b.begin()).first -
                             a.begin());
}

SessionFeed& direct_feed() {
  static DirectFeed feed;
  return feed;
}

expected<size_t> sync_session(Session& session, std::span<const int32_t> prompt, const RunHooks& hooks,
                              SessionFeed& feed) {
  if (prompt.empty()) return make_error("empty prompt");
  const auto& have = session.tokens();
  const size_t lcp = common_prefix(have, prompt);
  if (lcp < have.size()) DSV4_TRY(feed.rewind(session, lcp));
  if (lcp < prompt.size()) DSV4_TRY(feed.prefill(session, prompt.subspan(lcp), hooks));
  return lcp;
}

expected<GenerateResult> generate(Session& session, const Tokenizer& tok, std::span<const int32_t> prompt,
                                  const GenerateOptions& o, const GenerateCallbacks& cb, SessionFeed& feed) {
  using clock = std::chrono::steady_clock;
  GenerateResult r;
  r.prompt_tokens = prompt.size();
  if (prompt.size() >= session.ctx())
    return make_error("the prompt has %zu tokens but the context holds %u; shorten the conversation or raise --ctx",
                      prompt.size(), session.ctx());

  auto t0 = clock::now();
  RunHooks hooks;
  hooks.progress = cb.on_prefill_progress;
  hooks.cancelled = cb.cancelled;
  auto reused = sync_session(session, prompt, hooks, feed);
  if (!reused) {
    if (cb.cancelled && cb.cancelled()) {
      r.finish = FinishReason::CANCELLED;
      return r;
    }
    return reused.error();
  }
  r.cached_tokens = *reused;
  r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  auto t1 = clock::now();
  Sampler sampler(o.sampling, static_cast<uint32_t>(session.logits().size()));
  ReplyStream reply(tok, o, cb, r);

  const int max_tokens = o.max_tokens > 0 ? o.max_tokens : static_cast<int>(session.ctx());
  r.finish = FinishReason::LENGTH;
  // Samples the next token from `logits` and reports it; true when generation ends with it.
  int count = 0;
  auto emit = [&](std::span<const float> logits) {
    const bool greedy = reply.in_dsml_structure();
    const int32_t t = sampler.sample(logits, r.tokens, greedy);
    if (o.logprobs >= 0) {
      TokenLogprob lp;
      lp.token = t;
      lp.text = std::string(tok.token_bytes(t));
      lp.logprob = token_logprob(logits, t);
      if (o.logprobs > 0) lp.top = top_logprobs(logits, o.logprobs);
      r.logprobs.push_back(std::move(lp));
    }
    r.tokens.push_back(t);
    ++count;
    if (cb.on_token) cb.on_token();
    if (t == tok.eos() && !o.ignore_eos) {
      r.finish = FinishReason::STOP;
      return true;
    }
    // ignore_eos: generation goes on; EOS adds no text
    if (t != tok.eos() && reply.push(t)) return true;
    return count >= max_tokens;
  };
  const bool speculate = o.draft > 0 && feed.can_verify();
  const size_t V = session.logits().size();
  // The last sampled token is not yet in the session: each round feeds it (with proposals for the
  // tokens after it, checked in the same pass) and samples what follows.
  // After a round without proposals the next 3 rounds skip the drafter (its pass is wasted while it
  // keeps missing; ds4-variants-mtp-dspark.md §4.5's no-draft pause).
  constexpr int k_no_draft_pause = 3;
  int pause = 0;
  bool done = max_tokens <= 0;
  if (!done && cb.cancelled && cb.cancelled()) {
    r.finish = FinishReason::CANCELLED;
    done = true;
  }
  if (!done) done = emit(session.logits());
  while (!done) {
    if (cb.cancelled && cb.cancelled()) {
      r.finish = FinishReason::CANCELLED;
      break;
    }
    if (session.n_tokens() >= session.ctx()) break;  // context full: "length"
    const int32_t last = r.tokens.back();
    // Proposals: room for them in the context and in max_tokens (each kept one is followed by a sample).
    const int64_t room =
        std::min<int64_t>({static_cast<int64_t>(session.ctx()) - static_cast<int64_t>(session.n_tokens()) - 1,
                           max_tokens - count - 1, static_cast<int64_t>(Session::max_verify()) - 1});
    int k = speculate ? static_cast<int>(std::min<int64_t>(o.draft, room)) : 0;
    if (k > 0 && pause > 0) {
      --pause;
      k = 0;
    }
    std::vector<int32_t> drafts;
    if (k > 0) {
      DSV4_TRY_ASSIGN(drafts, feed.propose([&]() -> SessionFeed::Proposals {
        if (o.drafter) return o.drafter(session, r.tokens, last, k);
        return session.draft(last, k, o.draft_margin);
      }));
      if (drafts.size() > static_cast<size_t>(k)) drafts.resize(static_cast<size_t>(k));
      if (drafts.empty()) pause = k_no_draft_pause;
    }
    if (drafts.empty()) {
      DSV4_TRY(feed.decode(session, last));
      done = emit(session.logits());
      continue;
    }
    std::vector<int32_t> rows{last};
    rows.insert(rows.end(), drafts.begin(), drafts.end());
    // Row j's logits follow rows[0..j]: sample from them; the walk goes on while the sample is the
    // proposal that row j + 1 fed. Rows walked = rows kept.
    auto keep = [&](std::span<const float> all) -> size_t {
      for (size_t j = 0; j < rows.size(); ++j) {
        done = emit(all.subspan(j * V, V));
        if (done || j + 1 == rows.size() || r.tokens.back() != rows[j + 1]) return j + 1;
      }
      return rows.size();
    };
    DSV4_TRY_ASSIGN(const size_t kept, feed.verify(session, rows, keep));
    r.spec.passes += 1;
    r.spec.proposed += drafts.size();
    r.spec.accepted += kept - 1;
  }
  // Feed the final token so the session ends exactly at the completion (the next
  // request of a conversation starts with it), unless generation was cancelled.
  if (!r.tokens.empty() && r.finish != FinishReason::CANCELLED && session.n_tokens() < session.ctx())
    DSV4_TRY(feed.decode(session, r.tokens.back()));

  reply.finish();
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace dsv4
