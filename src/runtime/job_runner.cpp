#include "runtime/job_runner.h"

#include <algorithm>

#include "runtime/prompt_reuse.h"

namespace dsv4::runtime {

RenderedPrompt forced_tool_opener(const std::string& name) {
  // "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"" [NAME "\">\n"]  (formats.md §4.4)
  RenderedPrompt p;
  auto text = [&](std::string s) { p.push_back(TextPiece{std::move(s), false}); };
  auto dsml = [&] { p.push_back(TextPiece{std::string(k_token_dsml), true}); };
  text("\n\n<");
  dsml();
  text("tool_calls>\n<");
  dsml();
  text(name.empty() ? "invoke name=\"" : "invoke name=\"" + name + "\">\n");
  return p;
}

namespace {

size_t count_reasoning_tokens(const Tokenizer& tok, const std::vector<int32_t>& tokens, bool thinking) {
  if (!thinking) return 0;
  auto it = std::find(tokens.begin(), tokens.end(), tok.think_end());
  return it == tokens.end() ? tokens.size() : static_cast<size_t>(it - tokens.begin()) + 1;
}

JobOutcome failed(const Error& e) {
  JobOutcome o;
  o.error = runtime_error(RuntimeErrorKind::INTERNAL, e);
  return o;
}

JobOutcome failed(RuntimeError e) {
  JobOutcome o;
  o.error = std::move(e);
  return o;
}

void append(std::vector<int32_t>& a, const std::vector<int32_t>& b) { a.insert(a.end(), b.begin(), b.end()); }

}  // namespace

namespace {

JobOutcome run_phases(Backend& backend, JobSlot& job, const JobInput& in, const JobHooks& hooks,
                      const PromptChoice& choice) {
  const Tokenizer& tok = backend.tokenizer();
  const uint32_t ctx = backend.context_size();
  if (choice.tokens.size() >= ctx)
    return failed(RuntimeError{
        RuntimeErrorKind::CONTEXT_LENGTH,
        strfmt("the prompt has %zu tokens but the context holds %u tokens", choice.tokens.size(), ctx), ""});

  GenerateCallbacks cb;
  cb.on_event = hooks.on_event;
  cb.cancelled = hooks.cancelled;
  cb.on_prefill_progress = hooks.on_prefill_progress;
  cb.on_token = hooks.on_token;
  const GenerateOptions& o = in.options;
  const bool thinking = o.parse_chat && o.thinking == ThinkingMode::THINKING;
  const int room = static_cast<int>(ctx - choice.tokens.size());
  const int max_tokens = o.max_tokens > 0 ? std::min(o.max_tokens, room) : room;
  const bool forced = o.parse_chat && in.forced_tool != ForcedTool::NONE;
  const bool budget = thinking && in.thinking_budget >= 0 && in.thinking_budget < max_tokens;

  JobOutcome out;
  if (!forced && !budget) {
    auto r = backend.generate(job, choice.tokens, o, cb);
    if (!r) return failed(r.error());
    out.result = std::move(*r);
    out.reasoning_tokens = count_reasoning_tokens(tok, out.result.tokens, thinking);
    return out;
  }

  GenerateResult& m = out.result;          // merged over the phases
  m.prompt_tokens = choice.tokens.size();  // (the first phase reports the reuse it found)
  std::vector<int32_t> prompt = choice.tokens;
  int remaining = max_tokens;
  bool first_phase = true;
  // Usage: every token the job puts after the prompt, sampled or forced, is a completion token (m.tokens), and
  // only the prompt's tokens are prompt tokens. A phase's prompt is the job's prompt plus the tokens of the
  // phases before it, plus `n_forced` tokens appended for it (the forced tool-call opener); those are in m.tokens
  // already, so a first phase reports r.prompt_tokens - n_forced prompt tokens (prompt_tokens + completion_tokens
  // is then the length of the session after the job), and of its cached tokens only those within the prompt.
  auto absorb = [&](GenerateResult& r, size_t n_forced = 0) {
    if (first_phase) {
      m.prompt_tokens = r.prompt_tokens - std::min(r.prompt_tokens, n_forced);
      m.cached_tokens = std::min(r.cached_tokens, m.prompt_tokens);
      first_phase = false;
    }
    m.prefill_seconds += r.prefill_seconds;
    m.decode_seconds += r.decode_seconds;
    m.spec.passes += r.spec.passes;
    m.spec.proposed += r.spec.proposed;
    m.spec.accepted += r.spec.accepted;
    append(m.tokens, r.tokens);
    m.text += r.text;
    m.logprobs.insert(m.logprobs.end(), std::make_move_iterator(r.logprobs.begin()),
                      std::make_move_iterator(r.logprobs.end()));
    m.finish = r.finish;
    m.stop_string = r.stop_string;
    remaining -= static_cast<int>(r.tokens.size());
  };

  std::string reasoning;
  if (thinking) {
    // Phase R: the reasoning, up to </think> or the budget.
    GenerateOptions ro = o;
    ro.stop.insert(ro.stop.begin(), std::string(k_token_think_end));
    ro.max_tokens = budget ? in.thinking_budget : max_tokens;
    auto r = backend.generate(job, prompt, ro, cb);
    if (!r) return failed(r.error());
    const bool closed = r->stop_string == k_token_think_end;
    const bool out_of_budget =
        budget && r->finish == FinishReason::LENGTH && static_cast<int>(r->tokens.size()) >= in.thinking_budget;
    reasoning = r->message.reasoning_content;
    m.message = r->message;
    absorb(*r);
    if (!closed && !out_of_budget) {
      out.reasoning_tokens = count_reasoning_tokens(tok, m.tokens, true);
      return out;
    }
    m.stop_string.clear();
    append(prompt, m.tokens);
    if (!closed) {  // (a matched stop string is part of r->text already)
      prompt.push_back(tok.think_end());
      m.tokens.push_back(tok.think_end());
      m.text += k_token_think_end;
      --remaining;
    }
    if (remaining <= 0) {
      m.finish = FinishReason::LENGTH;
      out.reasoning_tokens = count_reasoning_tokens(tok, m.tokens, true);
      return out;
    }
  }

  // Phase C: the content after </think> (or after the prompt in chat mode).
  GenerateOptions co = o;
  co.thinking = ThinkingMode::CHAT;
  co.max_tokens = remaining;
  if (!forced) {
    auto r = backend.generate(job, prompt, co, cb);
    if (!r) return failed(r.error());
    ParsedMessage msg = r->message;
    msg.reasoning_content = reasoning;
    absorb(*r);
    m.message = std::move(msg);
    out.reasoning_tokens = count_reasoning_tokens(tok, m.tokens, true);
    return out;
  }

  const RenderedPrompt opener = forced_tool_opener(in.forced_tool == ForcedTool::NAMED ? in.forced_name : "");
  auto opener_tokens = tok.encode_prompt(opener);
  if (!opener_tokens) return failed(opener_tokens.error());
  if (prompt.size() + opener_tokens->size() >= ctx || static_cast<int>(opener_tokens->size()) >= remaining) {
    m.finish = FinishReason::LENGTH;
    out.reasoning_tokens = count_reasoning_tokens(tok, m.tokens, thinking);
    return out;
  }
  append(prompt, *opener_tokens);
  append(m.tokens, *opener_tokens);
  remaining -= static_cast<int>(opener_tokens->size());

  const std::string close_tag = "</" + std::string(k_token_dsml) + "tool_calls>";
  DsmlParser parser(ThinkingMode::CHAT);
  std::vector<DsmlEvent> events;
  auto feed = [&](std::string_view text) {
    events.clear();
    parser.feed(text, events);
    if (hooks.on_event)
      for (const auto& e : events) hooks.on_event(e);
  };
  const std::string opener_text = rendered_text(opener);
  feed(opener_text);
  co.parse_chat = false;
  co.max_tokens = remaining;
  co.stop.insert(co.stop.begin(), close_tag);
  GenerateCallbacks fcb;
  fcb.cancelled = hooks.cancelled;
  fcb.on_prefill_progress = hooks.on_prefill_progress;
  fcb.on_token = hooks.on_token;
  fcb.on_event = [&](const DsmlEvent& e) { feed(e.text); };
  auto r = backend.generate(job, prompt, co, fcb);
  if (!r) return failed(r.error());
  const bool block_closed = r->stop_string == close_tag;
  m.text += opener_text;  // the forced opener precedes the generated text
  absorb(*r, opener_tokens->size());
  if (block_closed) {  // the closing tag was cut as a stop string: it is part of the reply
    feed(close_tag);
    m.stop_string.clear();
  }
  events.clear();
  parser.finish(events);
  if (hooks.on_event)
    for (const auto& e : events) hooks.on_event(e);
  ParsedMessage msg = parser.message();
  msg.reasoning_content = reasoning;
  m.message = std::move(msg);
  if (!m.message.tool_calls.empty() && m.finish != FinishReason::CANCELLED)
    m.finish = FinishReason::TOOL_CALLS;
  else if (block_closed)
    m.finish = FinishReason::STOP;
  out.reasoning_tokens = count_reasoning_tokens(tok, m.tokens, thinking);
  return out;
}

}  // namespace

JobOutcome run_job(Backend& backend, const JobInput& in, const JobHooks& hooks) {
  JobSlot job;
  auto choice = backend.begin_job(in, job);
  JobOutcome out = choice ? run_phases(backend, job, in, hooks, *choice) : failed(choice.error());
  backend.end_job(job, in, out);
  return out;
}

}  // namespace dsv4::runtime
