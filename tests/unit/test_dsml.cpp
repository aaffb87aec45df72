// DSML completion parser: the official parse fixtures; identical results for
// every chunking; the event stream agrees with the final message; lenient
// syntax; malformed output degrades to content; the structure flag.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "chat/chat_cli.h"
#include "chat/dsml_parser.h"
#include "chat/markers.h"
#include "core/utf8.h"
#include "test_chat_util.h"

using namespace dsv4;

namespace {

const std::string EOS(chat_marker::EOS);
const std::string TE(chat_marker::THINK_END);
const std::string DS(chat_marker::DSML);

struct ParseRun {
  std::vector<DsmlEvent> events;
  ParsedMessage msg;
  std::vector<bool> structure;  // in_dsml_structure() after each chunk
};

ParseRun run_chunks(std::string_view text, ThinkingMode mode, const std::vector<size_t>& sizes) {
  ParseRun r;
  DsmlParser p(mode);
  size_t pos = 0, k = 0;
  while (pos < text.size()) {
    size_t n = sizes.empty() ? text.size() : std::min(sizes[k++ % sizes.size()], text.size() - pos);
    p.feed(text.substr(pos, n), r.events);
    r.structure.push_back(p.in_dsml_structure());
    pos += n;
  }
  p.finish(r.events);
  r.msg = p.message();
  return r;
}

ParseRun run_whole(std::string_view text, ThinkingMode mode) { return run_chunks(text, mode, {}); }

// Adjacent deltas of one kind (and call) merged: equal for every chunking.
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

std::string describe(const std::vector<DsmlEvent>& ev) {
  std::string s;
  for (const auto& e : ev)
    s += std::string(dsml_event_kind_name(e.kind)) + "#" + std::to_string(e.index) + "[" + e.text + "] ";
  return s;
}

// Replaying the events rebuilds the final message.
void expect_events_match_message(const ParseRun& r) {
  std::string content, reasoning;
  std::vector<ChatToolCall> calls;
  std::vector<bool> open;
  for (const auto& e : r.events) {
    switch (e.kind) {
      case DsmlEventKind::CONTENT: content += e.text; break;
      case DsmlEventKind::REASONING: reasoning += e.text; break;
      case DsmlEventKind::TOOL_CALL_START:
        ASSERT_EQ(e.index, calls.size());
        calls.push_back(ChatToolCall{"", e.text, ""});
        open.push_back(true);
        break;
      case DsmlEventKind::TOOL_CALL_ARGS:
        ASSERT_LT(e.index, calls.size());
        ASSERT_TRUE(open[e.index]);
        calls[e.index].arguments += e.text;
        break;
      case DsmlEventKind::TOOL_CALL_END:
        ASSERT_LT(e.index, calls.size());
        open[e.index] = false;
        break;
      case DsmlEventKind::TOOL_CALLS_ABORTED:
        calls.clear();
        open.clear();
        break;
    }
  }
  EXPECT_EQ(content, r.msg.content);
  EXPECT_EQ(reasoning, r.msg.reasoning_content);
  ASSERT_EQ(calls.size(), r.msg.tool_calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_FALSE(open[i]) << "call " << i << " never ended";
    EXPECT_EQ(calls[i].name, r.msg.tool_calls[i].name);
    EXPECT_EQ(calls[i].arguments, r.msg.tool_calls[i].arguments);
    EXPECT_TRUE(nlohmann::json::accept(calls[i].arguments)) << calls[i].arguments;
  }
  if (!r.msg.tool_calls.empty()) {
    EXPECT_FALSE(r.msg.raw_dsml.empty());
  }
}

void expect_same(const ParseRun& a, const ParseRun& b, const std::string& what) {
  EXPECT_EQ(describe(normalized(a.events)), describe(normalized(b.events))) << what;
  EXPECT_EQ(a.msg.content, b.msg.content) << what;
  EXPECT_EQ(a.msg.reasoning_content, b.msg.reasoning_content) << what;
  EXPECT_EQ(a.msg.raw_dsml, b.msg.raw_dsml) << what;
  EXPECT_EQ(a.msg.warnings, b.msg.warnings) << what;
  EXPECT_EQ(a.msg.saw_eos, b.msg.saw_eos) << what;
  ASSERT_EQ(a.msg.tool_calls.size(), b.msg.tool_calls.size()) << what;
  for (size_t i = 0; i < a.msg.tool_calls.size(); ++i) {
    EXPECT_EQ(a.msg.tool_calls[i].name, b.msg.tool_calls[i].name) << what;
    EXPECT_EQ(a.msg.tool_calls[i].arguments, b.msg.tool_calls[i].arguments) << what;
  }
}

// Whole, byte by byte, and random chunkings agree, and each run's events
// rebuild its message; returns the whole-text run.
ParseRun check_all_chunkings(std::string_view text, ThinkingMode mode) {
  ParseRun whole = run_whole(text, mode);
  expect_events_match_message(whole);
  ParseRun bytes = run_chunks(text, mode, {1});
  expect_events_match_message(bytes);
  expect_same(whole, bytes, "1-byte chunks");
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<size_t> sizes;
    for (int i = 0; i < 64; ++i) sizes.push_back(1 + rng() % (trial < 4 ? 4 : 24));
    ParseRun r = run_chunks(text, mode, sizes);
    expect_events_match_message(r);
    expect_same(whole, r, "random chunks, trial " + std::to_string(trial));
  }
  // Every split into two chunks.
  for (size_t cut = 1; cut < text.size(); ++cut) {
    ParseRun r = run_chunks(text, mode, {cut, text.size()});
    expect_same(whole, r, "split at " + std::to_string(cut));
    if (::testing::Test::HasFailure()) break;
  }
  return whole;
}

std::string block(const std::string& body) {
  return "\n\n<" + DS + "tool_calls>\n" + body + "\n</" + DS + "tool_calls>";
}
std::string invoke(const std::string& name, const std::string& params) {
  return "<" + DS + "invoke name=\"" + name + "\">\n" + params + "\n</" + DS + "invoke>";
}
std::string param(const std::string& name, const std::string& is_str, const std::string& value) {
  return "<" + DS + "parameter name=\"" + name + "\" string=\"" + is_str + "\">" + value + "</" + DS + "parameter>";
}

bool has_warning(const ParsedMessage& m, std::string_view needle) {
  for (const auto& w : m.warnings)
    if (w.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(DsmlParse, OfficialFixtures) {
  auto fixtures = test::load_chat_fixtures("parse_");
  ASSERT_GE(fixtures.size(), 4u) << "fixtures missing in " << test::chat_fixture_dir();
  for (const auto& [name, fx] : fixtures) {
    SCOPED_TRACE(name);
    ASSERT_FALSE(fx.is_discarded());
    const auto mode = *thinking_mode_from_string(fx["thinking_mode"].get<std::string>());
    const std::string text = fx["completion"].get<std::string>();
    ParseRun r = check_all_chunkings(text, mode);
    EXPECT_EQ(parsed_message_to_json(r.msg), fx["expected_message"]);
    EXPECT_TRUE(r.msg.warnings.empty()) << r.msg.warnings.front();
    EXPECT_TRUE(r.msg.saw_eos);
    // content + raw_dsml + EOS (+ reasoning) is exactly the completion.
    std::string rebuilt = mode == ThinkingMode::THINKING ? r.msg.reasoning_content + TE : "";
    EXPECT_EQ(rebuilt + r.msg.content + r.msg.raw_dsml + EOS, text);
    // Without the trailing EOS the message is the same.
    ParseRun no_eos = run_whole(std::string_view(text).substr(0, text.size() - EOS.size()), mode);
    EXPECT_EQ(parsed_message_to_json(no_eos.msg), fx["expected_message"]);
    EXPECT_FALSE(no_eos.msg.saw_eos);
  }
}

TEST(DsmlParse, StreamingEventsForAToolCall) {
  const std::string text =
      "Sure." + block(invoke("f", param("path", "true", "a\"b") + "\n" + param("n", "false", "[1, 2]"))) + EOS;
  DsmlParser p(ThinkingMode::CHAT);
  std::vector<DsmlEvent> ev;
  p.feed("Sure.\n\n", ev);
  ASSERT_EQ(ev.size(), 1u);  // the whitespace is held: it belongs to the block if one follows
  EXPECT_EQ(ev[0].text, "Sure.");
  p.feed("<" + DS + "tool", ev);
  EXPECT_EQ(ev.size(), 1u);
  EXPECT_FALSE(p.in_dsml_structure());
  p.feed("_calls>\n<" + DS + "invoke name=\"f\">", ev);
  EXPECT_TRUE(p.in_dsml_structure());
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[1].kind, DsmlEventKind::TOOL_CALL_START);
  EXPECT_EQ(ev[1].text, "f");
  EXPECT_EQ(ev[2].text, "{");
  p.feed("\n<" + DS + "parameter name=\"path\" string=\"true\">a", ev);
  EXPECT_FALSE(p.in_dsml_structure());  // a free string value
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[3].text, "\"path\": \"");
  EXPECT_EQ(ev[4].text, "a");
  p.feed("\"b</", ev);
  EXPECT_TRUE(p.in_dsml_structure());  // "</" may start the closing tag
  EXPECT_EQ(ev.back().text, "\\\"b");
  p.feed(DS + "parameter>\n<" + DS + "parameter name=\"n\" string=\"false\">[1, ", ev);
  EXPECT_TRUE(p.in_dsml_structure());      // JSON outside a string literal
  EXPECT_EQ(ev.back().text, ", \"n\": ");  // JSON values wait for validation
  p.feed("2]</" + DS + "parameter>\n</" + DS + "invoke>\n</" + DS + "tool_calls>", ev);
  EXPECT_TRUE(p.block_closed());
  EXPECT_EQ(ev.back().kind, DsmlEventKind::TOOL_CALL_END);
  p.feed(EOS, ev);
  p.finish(ev);
  const auto& m = p.message();
  EXPECT_EQ(m.content, "Sure.");
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].arguments, "{\"path\": \"a\\\"b\", \"n\": [1, 2]}");
  EXPECT_EQ(m.content + m.raw_dsml + EOS, text);
  check_all_chunkings(text, ThinkingMode::CHAT);
}

TEST(DsmlParse, JsonStringLiteralsAreFree) {
  DsmlParser p(ThinkingMode::CHAT);
  std::vector<DsmlEvent> ev;
  p.feed("\n\n<" + DS + "tool_calls>\n", ev);
  p.feed("<" + DS + "invoke name=\"f\">\n<" + DS + "parameter name=\"o\" string=\"false\">{\"k\": \"v", ev);
  EXPECT_FALSE(p.in_dsml_structure());
  p.feed("\\\"x\"", ev);
  EXPECT_TRUE(p.in_dsml_structure());
  p.feed(", \"", ev);
  EXPECT_FALSE(p.in_dsml_structure());
}

TEST(DsmlParse, ThinkingMode) {
  ParseRun r =
      check_all_chunkings("a <｜DSML｜tool_calls> b</think>" + std::string("\n\nc") + EOS, ThinkingMode::THINKING);
  EXPECT_EQ(r.msg.reasoning_content, "a <｜DSML｜tool_calls> b");  // markers inside reasoning are text
  EXPECT_EQ(r.msg.content, "\n\nc");
  // No </think>: everything is reasoning, with a warning.
  ParseRun cut = check_all_chunkings("still thinking" + EOS, ThinkingMode::THINKING);
  EXPECT_EQ(cut.msg.reasoning_content, "still thinking");
  EXPECT_EQ(cut.msg.content, "");
  EXPECT_TRUE(has_warning(cut.msg, "no </think>"));
  ParseRun cut2 = check_all_chunkings("still thinking</thi", ThinkingMode::THINKING);
  EXPECT_EQ(cut2.msg.reasoning_content, "still thinking</thi");
}

TEST(DsmlParse, ContentEdgeCases) {
  EXPECT_EQ(check_all_chunkings("Hello\n\n" + EOS, ThinkingMode::CHAT).msg.content, "Hello\n\n");
  EXPECT_EQ(check_all_chunkings("a <b> <tool_callsX> <｜end▁of", ThinkingMode::CHAT).msg.content,
            "a <b> <tool_callsX> <｜end▁of");
  EXPECT_EQ(check_all_chunkings("x <tool_calls   ", ThinkingMode::CHAT).msg.content, "x <tool_calls   ");
  EXPECT_EQ(check_all_chunkings("", ThinkingMode::CHAT).msg.content, "");
  ParseRun opener = check_all_chunkings("c\n\n<" + DS + "tool_ca", ThinkingMode::CHAT);  // cut off before the block
  EXPECT_EQ(opener.msg.content, "c\n\n<" + DS + "tool_ca");
  EXPECT_FALSE(has_warning(opener.msg, "malformed"));
  ParseRun after = check_all_chunkings("done" + EOS + "junk", ThinkingMode::CHAT);
  EXPECT_EQ(after.msg.content, "done");
  EXPECT_TRUE(has_warning(after.msg, "after the end-of-sentence"));
  // In chat mode a stray </think> is content, flagged.
  ParseRun stray = check_all_chunkings("a</think>b" + EOS, ThinkingMode::CHAT);
  EXPECT_EQ(stray.msg.content, "a</think>b");
  EXPECT_TRUE(has_warning(stray.msg, "special token </think>"));
}

TEST(DsmlParse, Utf8IsNeverSplitAcrossDeltas) {
  const std::string text =
      "h\xc3\xa9llo \xf0\x9f\x98\x80" + block(invoke("f", param("s", "true", "\xe4\xbd\xa0\xe5\xa5\xbd"))) + EOS;
  ParseRun r = check_all_chunkings(text, ThinkingMode::CHAT);
  ParseRun bytes = run_chunks(text, ThinkingMode::CHAT, {1});
  for (const auto& e : bytes.events) EXPECT_TRUE(utf8_valid(e.text)) << e.text;
  EXPECT_EQ(r.msg.tool_calls.at(0).arguments, "{\"s\": \"\xe4\xbd\xa0\xe5\xa5\xbd\"}");
  ParseRun think = run_chunks("\xe4\xbd\xa0</think>\xe5\xa5\xbd", ThinkingMode::THINKING, {1});
  for (const auto& e : think.events) EXPECT_TRUE(utf8_valid(e.text));
}

TEST(DsmlParse, LenientSyntax) {
  // Whitespace between tags and inside tags, attributes in any order, missing
  // string attribute (string), entities in attributes and string bodies.
  const std::string text = "x\n<" + DS + "tool_calls >  \n<" + DS + "invoke  name = \"a&amp;b\" >" + "<" + DS +
                           "parameter string=\"false\" name=\"n\"> 3 </" + DS + "parameter >\t<" + DS +
                           "parameter name=\"s\">1 &lt; 2 &amp;&amp; &quot;q&quot; &apos; &am; &</" + DS +
                           "parameter>\n</" + DS + "invoke  >\n</" + DS + "tool_calls>" + EOS;
  ParseRun r = check_all_chunkings(text, ThinkingMode::CHAT);
  EXPECT_EQ(r.msg.content, "x");
  ASSERT_EQ(r.msg.tool_calls.size(), 1u);
  EXPECT_EQ(r.msg.tool_calls[0].name, "a&b");
  EXPECT_EQ(r.msg.tool_calls[0].arguments, "{\"n\":  3 , \"s\": \"1 < 2 && \\\"q\\\" ' &am; &\"}");
  EXPECT_TRUE(r.msg.warnings.empty());
  EXPECT_EQ(r.msg.content + r.msg.raw_dsml + EOS, text);
}

TEST(DsmlParse, NonCanonicalPrefixes) {
  for (const std::string& prefix : {std::string("DSML｜"), std::string("")}) {
    SCOPED_TRACE(prefix);
    const std::string text = "c\n\n<" + prefix + "tool_calls>\n<" + prefix + "invoke name=\"f\">\n<" + prefix +
                             "parameter name=\"k\" string=\"true\">v</" + prefix + "parameter>\n</" + prefix +
                             "invoke>\n</" + prefix + "tool_calls>" + EOS;
    ParseRun r = check_all_chunkings(text, ThinkingMode::CHAT);
    ASSERT_EQ(r.msg.tool_calls.size(), 1u);
    EXPECT_EQ(r.msg.tool_calls[0].arguments, "{\"k\": \"v\"}");
    EXPECT_TRUE(has_warning(r.msg, "non-canonical"));
  }
}

TEST(DsmlParse, NonStringValuesAreAlwaysValidJson) {
  ParseRun r =
      check_all_chunkings(block(invoke("f", param("e", "false", " ") + "\n" + param("bad", "false", "/tmp/x") + "\n" +
                                                param("ok", "false", "{\"a\": \"</x>\", \"b\": [true, null, 1.5e3]}") +
                                                "\n" + param("half", "false", "[1, 2"))) +
                              EOS,
                          ThinkingMode::CHAT);
  ASSERT_EQ(r.msg.tool_calls.size(), 1u);
  EXPECT_EQ(
      r.msg.tool_calls[0].arguments,
      "{\"e\": null, \"bad\": \"/tmp/x\", \"ok\": {\"a\": \"</x>\", \"b\": [true, null, 1.5e3]}, \"half\": \"[1, 2\"}");
  EXPECT_TRUE(has_warning(r.msg, "empty non-string"));
  EXPECT_TRUE(has_warning(r.msg, "'bad'"));
  EXPECT_TRUE(has_warning(r.msg, "'half'"));
}

TEST(DsmlParse, NulInANonStringValueIsNotJson) {
  // nlohmann's accept() stops at a NUL byte, so "2\0 " once passed as the JSON value 2 followed by
  // raw bytes that broke the arguments object (found by fuzz_dsml; corpus/fuzz_dsml/nul_in_json_value).
  const std::string nul_num("2\0 ", 3), nul_obj("{\"recent\": true\0\x01}", 18);
  ParseRun r = check_all_chunkings(
      block(invoke("f", param("top_k", "false", nul_num) + "\n" + param("filters", "false", nul_obj))) + EOS,
      ThinkingMode::CHAT);
  ASSERT_EQ(r.msg.tool_calls.size(), 1u);
  EXPECT_TRUE(nlohmann::json::accept(r.msg.tool_calls[0].arguments)) << r.msg.tool_calls[0].arguments;
  EXPECT_EQ(r.msg.tool_calls[0].arguments,
            "{\"top_k\": \"2\\u0000 \", \"filters\": \"{\\\"recent\\\": true\\u0000\\u0001}\"}");
  EXPECT_TRUE(has_warning(r.msg, "'top_k'"));
  EXPECT_TRUE(has_warning(r.msg, "'filters'"));
}

TEST(DsmlParse, ZeroArgumentCallsAndEmptyBlocks) {
  ParseRun r = check_all_chunkings(block(invoke("now", "")) + EOS, ThinkingMode::CHAT);
  ASSERT_EQ(r.msg.tool_calls.size(), 1u);
  EXPECT_EQ(r.msg.tool_calls[0].arguments, "{}");
  ParseRun e = check_all_chunkings("c" + block("") + EOS, ThinkingMode::CHAT);
  EXPECT_TRUE(e.msg.tool_calls.empty());
  EXPECT_EQ(e.msg.content, "c");
  EXPECT_TRUE(has_warning(e.msg, "empty"));
}

TEST(DsmlParse, TextAfterTheBlockIsDropped) {
  const std::string good = "c" + block(invoke("f", param("k", "true", "v")));
  ParseRun r = check_all_chunkings(good + "\n  trailing words\n" + EOS + "more", ThinkingMode::CHAT);
  ASSERT_EQ(r.msg.tool_calls.size(), 1u);
  EXPECT_EQ(r.msg.content, "c");
  EXPECT_EQ(r.msg.raw_dsml, good.substr(1));
  EXPECT_TRUE(has_warning(r.msg, "after the tool_calls block"));
  EXPECT_TRUE(r.msg.saw_eos);
  ParseRun ws = check_all_chunkings(good + "\n\n" + EOS, ThinkingMode::CHAT);
  EXPECT_TRUE(ws.msg.warnings.empty());
}

TEST(DsmlParse, MalformedBlocksDegradeToContent) {
  const std::string open = "\n\n<" + DS + "tool_calls>\n";
  const std::string good_invoke = invoke("f", param("k", "true", "v"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"truncated in invoke tag", "c" + open + "<" + DS + "invoke name=\"f"},
      {"truncated in string body", "c" + open + "<" + DS + "invoke name=\"f\">\n<" + DS + "parameter name=\"k\">val"},
      {"truncated closing tag", "c" + open + good_invoke + "\n</" + DS + "tool_ca"},
      {"eos in string body", "c" + open + "<" + DS + "invoke name=\"f\">\n<" + DS + "parameter name=\"k\">va" + EOS},
      {"eos in json body",
       "c" + open + "<" + DS + "invoke name=\"f\">\n<" + DS + "parameter name=\"k\" string=\"false\">[1" + EOS},
      {"eos in tag", "c" + open + "<" + DS + "invoke name=\"f" + EOS},
      {"eos before close", "c" + open + good_invoke + EOS},
      {"unterminated invoke",
       "c" + open + "<" + DS + "invoke name=\"f\">\n" + param("k", "true", "v") + "\n</" + DS + "tool_calls>" + EOS},
      {"bad string attr", "c" + open + invoke("f", param("k", "maybe", "v")) + "\n</" + DS + "tool_calls>" + EOS},
      {"missing invoke name", "c" + open + "<" + DS + "invoke>\n</" + DS + "invoke>\n</" + DS + "tool_calls>" + EOS},
      {"unquoted attribute",
       "c" + open + "<" + DS + "invoke name=f>\n</" + DS + "invoke>\n</" + DS + "tool_calls>" + EOS},
      {"no space before attribute",
       "c" + open + "<" + DS + "invokename=\"f\">\n</" + DS + "invoke>\n</" + DS + "tool_calls>" + EOS},
      {"junk between tags", "c" + open + good_invoke + "\njunk\n</" + DS + "tool_calls>" + EOS},
      {"junk in invoke",
       "c" + open + "<" + DS + "invoke name=\"f\">\nhello\n</" + DS + "invoke>\n</" + DS + "tool_calls>" + EOS},
      {"nested garbage",
       "c" + open + invoke("f", param("k", "true", "<" + DS + "parameter name=\"x\">y</" + DS + "parameter>")) +
           "\n</" + DS + "tool_calls>" + EOS},
      {"duplicate parameter", "c" + open + invoke("f", param("k", "true", "1") + "\n" + param("k", "true", "2")) +
                                  "\n</" + DS + "tool_calls>" + EOS},
      {"malformed close", "c" + open + good_invoke + "\n</" + DS + "tool_calls x>" + EOS},
      {"tag too long", "c" + open + "<" + DS + "invoke name=\"" + std::string(5000, 'a') + EOS},
      {"second opener", "c" + open + open + EOS},
  };
  for (const auto& [what, text] : cases) {
    SCOPED_TRACE(what);
    ParseRun r = check_all_chunkings(text, ThinkingMode::CHAT);
    EXPECT_TRUE(r.msg.tool_calls.empty());
    EXPECT_TRUE(r.msg.raw_dsml.empty());
    EXPECT_TRUE(has_warning(r.msg, "malformed tool_calls block")) << (r.msg.warnings.empty() ? "" : r.msg.warnings[0]);
    // Nothing is lost: the content is the completion up to EOS.
    const size_t eos = text.find(EOS);
    EXPECT_EQ(r.msg.content, text.substr(0, eos));
    EXPECT_EQ(r.msg.saw_eos, eos != std::string::npos);
  }
}

TEST(DsmlParse, AbortWithdrawsStartedCalls) {
  const std::string text = "c\n\n<" + DS + "tool_calls>\n" + invoke("f", param("k", "true", "v")) + "\n<" + DS +
                           "invoke name=\"g\">\n<oops>" + EOS;
  ParseRun r = check_all_chunkings(text, ThinkingMode::CHAT);
  auto ev = normalized(r.events);
  size_t starts = 0, aborts = 0;
  for (const auto& e : ev) {
    starts += e.kind == DsmlEventKind::TOOL_CALL_START;
    aborts += e.kind == DsmlEventKind::TOOL_CALLS_ABORTED;
  }
  EXPECT_EQ(starts, 2u);
  EXPECT_EQ(aborts, 1u);
  EXPECT_EQ(ev.back().kind, DsmlEventKind::CONTENT);
  EXPECT_TRUE(r.msg.tool_calls.empty());
  EXPECT_EQ(r.msg.content, text.substr(0, text.size() - EOS.size()));
}

TEST(DsmlParse, RandomMutationsNeverBreakInvariants) {
  // Deterministic mutations of the fixtures' completions: each must parse the
  // same way under every chunking (the fuzz target does this at scale).
  std::vector<std::pair<std::string, ThinkingMode>> seeds;
  for (const auto& [name, fx] : test::load_chat_fixtures("parse_"))
    seeds.emplace_back(fx["completion"].get<std::string>(),
                       *thinking_mode_from_string(fx["thinking_mode"].get<std::string>()));
  ASSERT_FALSE(seeds.empty());
  std::mt19937 rng(42);
  for (int i = 0; i < 150; ++i) {
    auto [text, mode] = seeds[rng() % seeds.size()];
    const int n_mut = 1 + rng() % 3;
    for (int k = 0; k < n_mut && !text.empty(); ++k) {
      const size_t at = rng() % text.size();
      switch (rng() % 4) {
        case 0: text.erase(at, 1 + rng() % 8); break;
        case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), "<>\"=/ \n&"[rng() % 8]); break;
        case 2: text.insert(at, text.substr(rng() % text.size(), 1 + rng() % 20)); break;
        default: text.resize(at); break;
      }
    }
    SCOPED_TRACE(text);
    ParseRun whole = run_whole(text, mode);
    expect_events_match_message(whole);
    std::vector<size_t> sizes;
    for (int j = 0; j < 32; ++j) sizes.push_back(1 + rng() % 7);
    ParseRun chunked = run_chunks(text, mode, sizes);
    expect_events_match_message(chunked);
    expect_same(whole, chunked, "mutation " + std::to_string(i));
    if (::testing::Test::HasFailure()) break;
  }
}

TEST(DsmlParse, InvalidUtf8NeverReachesTheArgumentsJson) {
  // A cut-off sequence in a string body, a stray byte in a JSON value and in a
  // parameter name: the arguments stay valid JSON (U+FFFD per bad byte), the
  // content keeps the sampled bytes.
  const std::string text = "c\xff" +
                           block(invoke("f", param("s\x80", "true",
                                                   "a\xe4\xbd"
                                                   "b") +
                                                 "\n" + param("j", "false", "\"x\xc3\""))) +
                           EOS;
  ParseRun r = check_all_chunkings(text, ThinkingMode::CHAT);
  EXPECT_EQ(r.msg.content, "c\xff");
  ASSERT_EQ(r.msg.tool_calls.size(), 1u);
  EXPECT_EQ(r.msg.tool_calls[0].arguments,
            "{\"s\xef\xbf\xbd\": \"a\xef\xbf\xbd\xef\xbf\xbd"
            "b\", \"j\": \"x\xef\xbf\xbd\"}");
}
