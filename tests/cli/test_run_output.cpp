// How `dsv4 run` lays out a streamed reply (tools/run_output.h): the
// thinking fence, colours, tool calls, withdrawn blocks, and the statistics
// line. Events come from the real DSML parser where possible.
#include <gtest/gtest.h>

#include <cstdio>

#include "chat/dsml_parser.h"
#include "run_output.h"

using namespace dsv4;
using namespace dsv4::tools;

namespace {

// Feeds `events` to a printer writing into a temporary file; returns what it wrote.
std::string print(const std::vector<DsmlEvent>& events, bool color = false) {
  std::FILE* f = std::tmpfile();
  EXPECT_NE(f, nullptr);
  {
    ReplyPrinter p(color, f);
    for (const auto& e : events) p.on_event(e);
    p.finish();
  }
  std::rewind(f);
  std::string out;
  char buf[256];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// The events of a whole completion, fed in small chunks like tokens.
std::vector<DsmlEvent> parse_events(std::string_view text, ThinkingMode mode) {
  DsmlParser parser(mode);
  std::vector<DsmlEvent> events;
  for (size_t i = 0; i < text.size(); i += 3) parser.feed(text.substr(i, 3), events);
  parser.finish(events);
  return events;
}

DsmlEvent ev(DsmlEventKind kind, std::string text, size_t index = 0) { return DsmlEvent{kind, index, std::move(text)}; }

}  // namespace

TEST(ReplyPrinter, FencesReasoningOffFromTheAnswer) {
  auto events = parse_events("let me think</think>The answer.<｜end▁of▁sentence｜>", ThinkingMode::THINKING);
  EXPECT_EQ(print(events), "[thinking]\nlet me think\n[/thinking]\n\nThe answer.\n");
  // Reasoning that already ends a line gets no extra line break.
  EXPECT_EQ(print({ev(DsmlEventKind::REASONING, "r\n"), ev(DsmlEventKind::CONTENT, "a")}),
            "[thinking]\nr\n[/thinking]\n\na\n");
  // A reply cut off inside the reasoning still closes the fence.
  EXPECT_EQ(print({ev(DsmlEventKind::REASONING, "still going")}), "[thinking]\nstill going\n[/thinking]\n\n");
  // Chat mode: just the content, ending with a line break.
  EXPECT_EQ(print(parse_events("Hello there", ThinkingMode::CHAT)), "Hello there\n");
  EXPECT_EQ(print(parse_events("two lines\n", ThinkingMode::CHAT)), "two lines\n");
  EXPECT_EQ(print({}), "");
}

TEST(ReplyPrinter, DimsReasoningOnlyWithColour) {
  const std::string out = print({ev(DsmlEventKind::REASONING, "r"), ev(DsmlEventKind::CONTENT, "a")}, true);
  EXPECT_EQ(out, "\x1b[2m[thinking]\nr\n[/thinking]\x1b[0m\n\na\n");
  EXPECT_EQ(print({ev(DsmlEventKind::CONTENT, "a")}, true), "a\n");
}

TEST(ReplyPrinter, ShowsToolCallsReadably) {
  const std::string completion =
      "reason</think>Listing.\n\n<｜DSML｜tool_calls>\n"
      "<｜DSML｜invoke name=\"ls\">\n"
      "<｜DSML｜parameter name=\"path\" string=\"true\">/tmp</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"depth\" string=\"false\">2</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>\n"
      "<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>\n"
      "</｜DSML｜tool_calls>";
  EXPECT_EQ(print(parse_events(completion, ThinkingMode::THINKING)),
            "[thinking]\nreason\n[/thinking]\n\nListing.\n"
            "[tool call] ls {\"path\": \"/tmp\", \"depth\": 2}\n"
            "[tool call] now {}\n");
  // With colour the call is cyan, its name bold, and the colour is reset after it.
  const std::string coloured = print({ev(DsmlEventKind::TOOL_CALL_START, "f"), ev(DsmlEventKind::TOOL_CALL_ARGS, "{}"),
                                      ev(DsmlEventKind::TOOL_CALL_END, "")},
                                     true);
  EXPECT_EQ(coloured, "\x1b[36m[tool call] \x1b[1mf\x1b[0m\x1b[36m {}\x1b[0m\n");
}

TEST(ReplyPrinter, AnnouncesAWithdrawnBlock) {
  // A block that opens an invoke and is then cut off by EOS is withdrawn and
  // its text comes back as content.
  const std::string completion =
      "Hi\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"ls\">\n<｜DSML｜parameter name=\"p\" string=\"true\">x"
      "<｜end▁of▁sentence｜>";
  const auto events = parse_events(completion, ThinkingMode::CHAT);
  bool aborted = false;
  for (const auto& e : events) aborted |= e.kind == DsmlEventKind::TOOL_CALLS_ABORTED;
  ASSERT_TRUE(aborted);
  const std::string out = print(events);
  EXPECT_TRUE(out.starts_with("Hi\n[tool call] ls {")) << out;
  const size_t note = out.find("\n[the tool-call block above was malformed; its text follows as plain output]\n");
  ASSERT_NE(note, std::string::npos) << out;
  EXPECT_NE(out.find("<｜DSML｜invoke name=\"ls\">", note), std::string::npos) << out;
}

TEST(StatsLine, ReportsCountsAndRates) {
  GenerateResult r;
  r.prompt_tokens = 25;
  r.cached_tokens = 12;
  r.prefill_seconds = 0.1;
  r.tokens.assign(20, 5);
  r.decode_seconds = 0.5;
  r.finish = FinishReason::LENGTH;
  EXPECT_EQ(stats_line(r, 45, 32768),
            "[prompt 25 tokens (12 cached), prefill 130.0 t/s | generated 20 tokens, decode 40.0 t/s | finish length | "
            "context 45/32768]");
  // Nothing prefilled (all cached) and nothing generated: no rates.
  GenerateResult c;
  c.prompt_tokens = 7;
  c.cached_tokens = 7;
  c.finish = FinishReason::CANCELLED;
  EXPECT_EQ(stats_line(c, 7, 64),
            "[prompt 7 tokens (7 cached), prefill - t/s | generated 0 tokens, decode - t/s | finish cancelled | "
            "context 7/64]");
}
