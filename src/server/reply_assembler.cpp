#include "server/reply_assembler.h"

namespace dsv4::server {

void ReplyAssembler::on_event(const DsmlEvent& e, std::vector<OutEvent>& out) {
  switch (e.kind) {
    case DsmlEventKind::CONTENT: out.push_back(OutEvent{OutKind::CONTENT, 0, e.text, ""}); return;
    case DsmlEventKind::REASONING: out.push_back(OutEvent{OutKind::REASONING, 0, e.text, ""}); return;
    case DsmlEventKind::TOOL_CALL_START: {
      if (ids_.size() <= e.index) ids_.resize(e.index + 1);
      ids_[e.index] = memory_.new_id(policy_.id_prefix);
      if (presented(e.index)) out.push_back(OutEvent{OutKind::CALL_START, e.index, e.text, ids_[e.index]});
      return;
    }
    case DsmlEventKind::TOOL_CALL_ARGS:
      if (presented(e.index)) out.push_back(OutEvent{OutKind::CALL_ARGS, e.index, e.text, ""});
      return;
    case DsmlEventKind::TOOL_CALL_END:
      if (presented(e.index)) out.push_back(OutEvent{OutKind::CALL_END, e.index, "", ""});
      return;
    case DsmlEventKind::TOOL_CALLS_ABORTED:
      if (policy_.allow_tool_calls && !ids_.empty()) out.push_back(OutEvent{OutKind::CALLS_ABORTED, 0, "", ""});
      ids_.clear();
      return;
  }
}

FinalReply ReplyAssembler::finish(const runtime::JobOutcome& outcome, std::vector<OutEvent>& out) {
  const GenerateResult& r = outcome.result;
  FinalReply f;
  f.content = r.message.content;
  f.reasoning = r.message.reasoning_content;
  f.finish = r.finish;
  f.stop_string = r.stop_string;
  f.prompt_tokens = r.prompt_tokens;
  f.cached_tokens = r.cached_tokens;
  f.completion_tokens = r.tokens.size();
  f.reasoning_tokens = outcome.reasoning_tokens;
  f.logprobs = r.logprobs;
  const auto& calls = r.message.tool_calls;
  if (calls.empty()) {
    if (f.finish == FinishReason::TOOL_CALLS) f.finish = FinishReason::STOP;
    return f;
  }
  if (!policy_.allow_tool_calls) {
    // The model wrote a block although no tool may be called: it is text.
    f.content += r.message.raw_dsml;
    out.push_back(OutEvent{OutKind::CONTENT, 0, r.message.raw_dsml, ""});
    if (f.finish == FinishReason::TOOL_CALLS) f.finish = FinishReason::STOP;
    return f;
  }
  const size_t n = policy_.parallel_tool_calls ? calls.size() : 1;
  runtime::ToolCallRecord rec;
  rec.raw_dsml = r.message.raw_dsml;
  rec.reasoning = r.message.reasoning_content;
  for (size_t i = 0; i < calls.size(); ++i) {
    // Every call got an id at its start event; the fallback covers a parser
    // that reported a call without one (it never does).
    const std::string id = i < ids_.size() && !ids_[i].empty() ? ids_[i] : memory_.new_id(policy_.id_prefix);
    if (i < n) f.calls.push_back(ReplyCall{id, calls[i].name, calls[i].arguments});
    rec.calls.push_back(ChatToolCall{id, calls[i].name, calls[i].arguments});
  }
  if (n == calls.size() && !rec.raw_dsml.empty() && r.finish != FinishReason::CANCELLED)
    memory_.remember(std::move(rec));
  return f;
}

}  // namespace dsv4::server
