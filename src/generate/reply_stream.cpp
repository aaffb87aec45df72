#include "generate/reply_stream.h"

namespace dsv4 {

ReplyStream::ReplyStream(const Tokenizer& tok, const GenerateOptions& o, const GenerateCallbacks& cb, GenerateResult& r)
    : o_(o), cb_(cb), r_(r), decoder_(tok), stops_(o.stop), parser_(o.thinking) {}

void ReplyStream::deliver(std::string_view text) {
  if (text.empty()) return;
  if (o_.parse_chat) {
    events_.clear();
    parser_.feed(text, events_);
    if (cb_.on_event)
      for (const auto& e : events_) cb_.on_event(e);
  } else {
    r_.message.content.append(text);
    if (cb_.on_event) cb_.on_event(DsmlEvent{DsmlEventKind::CONTENT, 0, std::string(text)});
  }
}

bool ReplyStream::feed(const std::string& piece) {
  r_.text += piece;
  auto sr = stops_.push(piece);
  deliver(sr.emit);
  if (!sr.stopped) return false;
  r_.finish = FinishReason::STOP;
  r_.stop_string = sr.stop;
  return true;
}

bool ReplyStream::push(int32_t token) {
  if (feed(decoder_.push(token))) return true;
  if (o_.parse_chat && o_.stop_at_tool_calls && parser_.block_closed()) {
    r_.finish = FinishReason::TOOL_CALLS;
    return true;
  }
  return false;
}

void ReplyStream::finish() {
  if (r_.stop_string.empty() && !feed(decoder_.flush())) deliver(stops_.flush());
  if (o_.parse_chat) {
    events_.clear();
    parser_.finish(events_);
    if (cb_.on_event)
      for (const auto& e : events_) cb_.on_event(e);
    r_.message = parser_.message();
    if (!r_.message.tool_calls.empty() && r_.finish != FinishReason::CANCELLED) r_.finish = FinishReason::TOOL_CALLS;
  }
}

}  // namespace dsv4
