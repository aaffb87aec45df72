#include "runtime/scripted_backend.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "generate/reply_stream.h"
#include "chat/json_fields.h"

namespace dsv4::runtime {

expected<std::vector<ScriptedReply>> scripted_replies_from_json(const nlohmann::ordered_json& script) {
  if (!script.is_object()) return make_error("the script must be a JSON object with \"replies\"");
  JsonFields top(script);
  DSV4_TRY_ASSIGN(const ordered_json* replies, top.array("replies"));
  if (!replies || replies->empty()) return make_error("the script needs a non-empty \"replies\" array");
  std::vector<ScriptedReply> out;
  for (size_t i = 0; i < replies->size(); ++i) {
    const ordered_json& r = (*replies)[i];
    const std::string where = "replies[" + std::to_string(i) + "]";
    if (!r.is_object()) return make_error("%s must be an object", where.c_str());
    JsonFields f(r, where);
    ScriptedReply reply;
    DSV4_TRY_ASSIGN(auto match, f.string("match"));
    DSV4_TRY_ASSIGN(auto text, f.string("text"));
    DSV4_TRY_ASSIGN(auto token_delay, f.integer("token_delay_ms", 0, 60000));
    DSV4_TRY_ASSIGN(auto prefill_delay, f.integer("prefill_delay_ms", 0, 600000));
    if (!text) return make_error("%s needs a string \"text\"", where.c_str());
    reply.match = match.value_or("");
    reply.text = *text;
    reply.token_delay_ms = static_cast<int>(token_delay.value_or(0));
    reply.prefill_delay_ms = static_cast<int>(prefill_delay.value_or(0));
    out.push_back(std::move(reply));
  }
  return out;
}

ScriptedBackend::ScriptedBackend(std::unique_ptr<Tokenizer> tokenizer, uint32_t ctx, std::vector<ScriptedReply> replies)
    : tok_(std::move(tokenizer)), ctx_(ctx), replies_(std::move(replies)) {}

std::string ScriptedBackend::describe() const {
  return strfmt("scripted replies (%zu in the script; no model), vocabulary of %zu tokens, ctx %u", replies_.size(),
                tok_->n_vocab(), ctx_);
}

std::vector<std::vector<int32_t>> ScriptedBackend::prompts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prompts_;
}

const ScriptedReply* ScriptedBackend::pick(std::span<const int32_t> prompt) const {
  const std::string text = tok_->decode(std::vector<int32_t>(prompt.begin(), prompt.end()));
  const size_t u = text.rfind(k_token_user);
  const std::string_view last_turn = u == std::string::npos ? std::string_view(text) : std::string_view(text).substr(u);
  for (const auto& r : replies_)
    if (r.match.empty() || last_turn.find(r.match) != std::string_view::npos) return &r;
  return nullptr;
}

namespace {

// Sleeps `ms` in short slices; false when cancelled meanwhile.
bool pause(int ms, const GenerateCallbacks& cb) {
  using namespace std::chrono;
  const auto end = steady_clock::now() + milliseconds(ms);
  while (steady_clock::now() < end) {
    if (cb.cancelled && cb.cancelled()) return false;
    std::this_thread::sleep_for(std::min<steady_clock::duration>(milliseconds(5), end - steady_clock::now()));
  }
  return true;
}

}  // namespace

expected<GenerateResult> ScriptedBackend::generate(JobSlot& job, std::span<const int32_t> prompt,
                                                   const GenerateOptions& o, const GenerateCallbacks& cb) {
  (void)job;  // one simulated session
  using clock = std::chrono::steady_clock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prompts_.emplace_back(prompt.begin(), prompt.end());
  }
  GenerateResult r;
  r.prompt_tokens = prompt.size();
  if (prompt.empty()) return make_error("empty prompt");
  if (prompt.size() >= ctx_)
    return make_error("the prompt has %zu tokens but the context holds %u; shorten the conversation or raise --ctx",
                      prompt.size(), ctx_);
  const ScriptedReply* reply = pick(prompt);
  if (!reply) return make_error("no scripted reply matches this prompt");

  auto t0 = clock::now();
  const bool extends_session =
      prompt.size() >= session_.size() && std::equal(session_.begin(), session_.end(), prompt.begin());
  const size_t start = reply == last_reply_ && !last_done_ && extends_session ? last_pos_ : 0;
  last_reply_ = reply;
  last_pos_ = start;
  last_done_ = false;
  const size_t lcp = common_prefix(session_, prompt);
  if (reply->prefill_delay_ms > 0 && !pause(reply->prefill_delay_ms, cb)) {
    session_.resize(lcp);
    r.finish = FinishReason::CANCELLED;
    return r;
  }
  session_.assign(prompt.begin(), prompt.end());
  r.cached_tokens = lcp;
  if (cb.on_prefill_progress) cb.on_prefill_progress(prompt.size() - lcp, prompt.size() - lcp);
  r.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();

  auto t1 = clock::now();
  const std::vector<int32_t> script = tok_->encode_with_specials(reply->text);
  ReplyStream stream(*tok_, o, cb, r);

  const int max_tokens = o.max_tokens > 0 ? o.max_tokens : static_cast<int>(ctx_);
  r.finish = FinishReason::LENGTH;
  for (int i = 0; i < max_tokens; ++i) {
    if (cb.cancelled && cb.cancelled()) {
      r.finish = FinishReason::CANCELLED;
      break;
    }
    if (session_.size() >= ctx_) break;  // context full: "length"
    if (reply->token_delay_ms > 0 && !pause(reply->token_delay_ms, cb)) {
      r.finish = FinishReason::CANCELLED;
      break;
    }
    // The script, then the end-of-sentence token.
    const size_t at = start + static_cast<size_t>(i);
    const int32_t t = at < script.size() ? script[at] : tok_->eos();
    if (at >= script.size())
      last_done_ = true;
    else
      last_pos_ = at + 1;
    if (o.logprobs >= 0) {
      // The scripted token has probability 1; alternatives are reported as very unlikely.
      TokenLogprob lp;
      lp.token = t;
      lp.text = std::string(tok_->token_bytes(t));
      lp.logprob = 0.0f;
      if (o.logprobs > 0) lp.top.emplace_back(t, 0.0f);
      for (int32_t alt = 0; static_cast<int>(lp.top.size()) < o.logprobs && alt < static_cast<int32_t>(tok_->n_vocab());
           ++alt)
        if (alt != t) lp.top.emplace_back(alt, -100.0f);
      r.logprobs.push_back(std::move(lp));
    }
    r.tokens.push_back(t);
    session_.push_back(t);
    if (cb.on_token) cb.on_token();
    if (t == tok_->eos()) {
      if (!o.ignore_eos) {
        last_done_ = true;
        r.finish = FinishReason::STOP;
        break;
      }
      continue;  // ignore_eos: as generate(), EOS adds no text
    }
    if (stream.push(t)) break;
  }
  if (r.finish == FinishReason::CANCELLED && !r.tokens.empty()) {  // as generate(): the last token is not fed
    session_.pop_back();
    if (!last_done_) --last_pos_;
    last_done_ = false;
  }
  stream.finish();
  r.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace dsv4::runtime
