#include "server/choices.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace dsv4::server {

ChoicesReply run_choices(runtime::Runtime& rt, PreparedRequest& p, const std::function<bool()>& client_gone) {
  ChoicesReply out;
  const size_t n = static_cast<size_t>(std::max(p.n, 1));
  std::vector<std::shared_ptr<runtime::Job>> jobs;
  const auto share = std::make_shared<runtime::PromptShare>();  // the prompt is prefilled once
  std::vector<ReplyAssembler> assemblers;
  auto cancel_all = [&] {
    for (auto& j : jobs) {
      j->cancel = true;
      rt.withdraw(j);
    }
  };
  for (size_t i = 0; i < n; ++i) {
    runtime::JobInput in = p.job;
    in.options.sampling.seed += i;
    in.share = share;
    auto job = std::make_shared<runtime::Job>(std::move(in));
    const runtime::Runtime::Admit admit = rt.submit(job);
    if (admit != runtime::Runtime::Admit::OK) {
      cancel_all();
      out.error = ApiError{ApiErrorKind::OVERLOADED,
                           admit == runtime::Runtime::Admit::STOPPING
                               ? std::string("the server is shutting down")
                               : strfmt("the server is busy: the queue has no room for %zu choices; retry later", n),
                           "", ""};
      return out;
    }
    jobs.push_back(std::move(job));
    assemblers.emplace_back(p.policy, rt.tool_memory());
  }
  // Wait for all, feeding each job's events to its assembler; a hang-up cancels them all.
  std::vector<bool> done(n, false);
  std::vector<DsmlEvent> events;
  std::vector<OutEvent> outs;
  for (size_t left = n; left > 0;) {
    for (size_t i = 0; i < n; ++i) {
      if (done[i]) continue;
      events.clear();
      done[i] = jobs[i]->wait(events, std::chrono::milliseconds(10));
      outs.clear();
      for (const auto& e : events) assemblers[i].on_event(e, outs);
      if (done[i]) --left;
    }
    if (left > 0 && client_gone && client_gone()) {
      cancel_all();
      out.client_gone = true;
      for (size_t i = 0; i < n; ++i)  // the jobs end within a token; their outcomes are not needed
        while (!done[i]) done[i] = jobs[i]->wait(events, std::chrono::milliseconds(10));
      return out;
    }
  }
  std::vector<FinalReply> replies;
  for (size_t i = 0; i < n; ++i) {
    const runtime::JobOutcome& o = jobs[i]->outcome();
    if (o.error) {
      out.error = api_error(*o.error);
      return out;
    }
    if (o.result.finish == FinishReason::CANCELLED) {
      out.cancelled = true;
      return out;
    }
    outs.clear();
    replies.push_back(assemblers[i].finish(o, outs));
    if (!satisfies_response_format(replies.back().content, p.response_format)) out.bad_format = true;
  }
  out.usage = replies[0];
  for (size_t i = 1; i < n; ++i) {
    out.usage.completion_tokens += replies[i].completion_tokens;
    out.usage.reasoning_tokens += replies[i].reasoning_tokens;
    // The prompt was prefilled once, by whichever job led; the others copied it: what it reused is the least.
    out.usage.cached_tokens = std::min(out.usage.cached_tokens, replies[i].cached_tokens);
  }
  out.body = p.writer->body(replies[0]);
  for (size_t i = 1; i < n; ++i) {
    nlohmann::ordered_json b = p.writer->body(replies[i]);
    nlohmann::ordered_json choice = b["choices"][0];
    choice["index"] = i;
    out.body["choices"].push_back(std::move(choice));
  }
  out.body["usage"] = p.writer->body(out.usage)["usage"];
  return out;
}

}  // namespace dsv4::server
