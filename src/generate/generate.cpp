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
  bool pending = false;  // the last sampled token still has to be fed to the session
  for (int i = 0; i < max_tokens; ++i) {
    if (cb.cancelled && cb.cancelled()) {
      r.finish = FinishReason::CANCELLED;
      break;
    }
    if (pending) {
      if (session.n_tokens() >= session.ctx()) break;  // context full: "length"
      DSV4_TRY(feed.decode(session, r.tokens.back()));
      pending = false;
    }
    const auto& logits = session.logits();
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
    pending = true;
    if (cb.on_token) cb.on_token();
    if (t == tok.eos()) {
      if (!o.ignore_eos) {
        r.finish = FinishReason::STOP;
        break;
      }
      continue;  // ignore_eos: generation goes on; EOS adds no text
    }
    if (reply.push(t)) break;
  }
  // Feed the final token so the session ends exactly at the completion (the next
  // request of a conversation starts with it), unless generation was cancelled.
  if (pending && r.finish != FinishReason::CANCELLED && session.n_tokens() < session.ctx())
    DSV4_TRY(feed.decode(session, r.tokens.back()));

  reply.finish();
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace dsv4
