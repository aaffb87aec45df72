// Fuzz target: the incremental DSML parser on arbitrary completions.
//
// Input: byte 0 selects the thinking mode (bit 0) and seeds the chunking
// (bits 1-7); the rest is the completion text. Checked on every input:
//   * the text fed whole, byte by byte and in pseudo-random chunks gives the
//     same final message and the same event stream (adjacent deltas merged);
//   * replaying each run's events rebuilds its message, every started call
//     ends, and every final tool call's arguments are valid JSON;
//   * with tool calls, [reasoning "</think>"] content raw_dsml is a prefix of
//     the completion.
// The parsed message is then rendered back as conversation history, and an
// input that is JSON goes through from_openai_json + render_official, so the
// renderer sees arbitrary names, arguments and contents too.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_cli.h"
#include "chat/dsml_parser.h"
#include "chat/markers.h"
#include "chat/render_official.h"

namespace {

using namespace dsv4;

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "fuzz_dsml: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

struct Run {
  std::vector<DsmlEvent> events;
  ParsedMessage msg;
};

Run run(std::string_view text, ThinkingMode mode, uint32_t seed) {
  Run r;
  DsmlParser p(mode);
  size_t pos = 0;
  uint32_t state = seed;
  while (pos < text.size()) {
    size_t n = text.size();
    if (seed == 1) {
      n = 1;
    } else if (seed > 1) {
      state = state * 1103515245u + 12345u;
      n = 1 + (state >> 16) % 13;
    }
    n = std::min(n, text.size() - pos);
    p.feed(text.substr(pos, n), r.events);
    (void)p.in_dsml_structure();
    pos += n;
  }
  p.finish(r.events);
  r.msg = p.message();
  return r;
}

std::vector<DsmlEvent> normalized(const std::vector<DsmlEvent>& ev) {
  std::vector<DsmlEvent> out;
  for (const auto& e : ev) {
    const bool delta = e.kind == DsmlEventKind::CONTENT || e.kind == DsmlEventKind::REASONING ||
                       e.kind == DsmlEventKind::TOOL_CALL_ARGS;
    if (delta && !out.empty() && out.back().kind == e.kind && out.back().index == e.index)
      out.back().text += e.text;
    else
      out.push_back(e);
  }
  return out;
}

void check_replay(const Run& r) {
  std::string content, reasoning;
  std::vector<ChatToolCall> calls;
  std::vector<bool> open;
  for (const auto& e : r.events) {
    switch (e.kind) {
      case DsmlEventKind::CONTENT: content += e.text; break;
      case DsmlEventKind::REASONING: reasoning += e.text; break;
      case DsmlEventKind::TOOL_CALL_START:
        FUZZ_CHECK(e.index == calls.size());
        calls.push_back(ChatToolCall{"", e.text, ""});
        open.push_back(true);
        break;
      case DsmlEventKind::TOOL_CALL_ARGS:
        FUZZ_CHECK(e.index < calls.size() && open[e.index]);
        calls[e.index].arguments += e.text;
        break;
      case DsmlEventKind::TOOL_CALL_END:
        FUZZ_CHECK(e.index < calls.size() && open[e.index]);
        open[e.index] = false;
        break;
      case DsmlEventKind::TOOL_CALLS_ABORTED:
        calls.clear();
        open.clear();
        break;
    }
  }
  FUZZ_CHECK(content == r.msg.content);
  FUZZ_CHECK(reasoning == r.msg.reasoning_content);
  FUZZ_CHECK(calls.size() == r.msg.tool_calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    FUZZ_CHECK(!open[i]);
    FUZZ_CHECK(calls[i].name == r.msg.tool_calls[i].name);
    FUZZ_CHECK(calls[i].arguments == r.msg.tool_calls[i].arguments);
    FUZZ_CHECK(nlohmann::json::accept(calls[i].arguments));
  }
}

void check_same(const Run& a, const Run& b) {
  const auto na = normalized(a.events), nb = normalized(b.events);
  FUZZ_CHECK(na.size() == nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    FUZZ_CHECK(na[i].kind == nb[i].kind);
    FUZZ_CHECK(na[i].index == nb[i].index);
    FUZZ_CHECK(na[i].text == nb[i].text);
  }
  FUZZ_CHECK(a.msg.content == b.msg.content);
  FUZZ_CHECK(a.msg.reasoning_content == b.msg.reasoning_content);
  FUZZ_CHECK(a.msg.raw_dsml == b.msg.raw_dsml);
  FUZZ_CHECK(a.msg.warnings == b.msg.warnings);
  FUZZ_CHECK(a.msg.saw_eos == b.msg.saw_eos);
  FUZZ_CHECK(a.msg.tool_calls.size() == b.msg.tool_calls.size());
  for (size_t i = 0; i < a.msg.tool_calls.size(); ++i) {
    FUZZ_CHECK(a.msg.tool_calls[i].name == b.msg.tool_calls[i].name);
    FUZZ_CHECK(a.msg.tool_calls[i].arguments == b.msg.tool_calls[i].arguments);
  }
}

void render_history(const ParsedMessage& m, ThinkingMode mode) {
  std::vector<ChatMessage> msgs(2);
  msgs[0].role = ChatRole::USER;
  msgs[0].content = ChatContent::from_text("q");
  msgs[1].role = ChatRole::ASSISTANT;
  msgs[1].content = ChatContent::from_text(m.content);
  msgs[1].reasoning_content = m.reasoning_content;
  msgs[1].tool_calls = m.tool_calls;
  RenderOptions o;
  o.thinking_mode = mode;
  auto r = render_official(msgs, o);
  FUZZ_CHECK(r.has_value());
  for (const auto& piece : *r) FUZZ_CHECK(!piece.text.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const ThinkingMode mode = (data[0] & 1) ? ThinkingMode::THINKING : ThinkingMode::CHAT;
  const uint32_t seed = 2u + (data[0] >> 1);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  const Run whole = run(text, mode, 0);
  check_replay(whole);
  for (uint32_t s : {1u, seed}) {
    const Run other = run(text, mode, s);
    check_replay(other);
    check_same(whole, other);
  }
  if (!whole.msg.tool_calls.empty()) {
    std::string prefix =
        mode == ThinkingMode::THINKING ? whole.msg.reasoning_content + std::string(chat_marker::THINK_END) : "";
    prefix += whole.msg.content + whole.msg.raw_dsml;
    FUZZ_CHECK(text.substr(0, prefix.size()) == prefix);
  }
  render_history(whole.msg, mode);

  if (auto in = render_input_from_json_text(text)) {
    RenderOptions o;
    o.thinking_mode = mode;
    o.tools = in->tools;
    (void)render_official(in->messages, o);
  }
  return 0;
}
