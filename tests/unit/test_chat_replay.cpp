// Exact replay of sampled tool-call blocks (ChatMessage::raw_dsml,
// formats.md §4.6): an assistant message carrying the block the model sampled
// renders to exactly the bytes the model produced, with DSML markers as
// control pieces and everything else as text; without it the canonical DSML
// is rendered as before.
#include <gtest/gtest.h>

#include "chat/chat_message.h"
#include "chat/dsml_parser.h"
#include "chat/markers.h"
#include "chat/render_official.h"

using namespace dsv4;

namespace {

namespace mk = chat_marker;

std::string dsml(std::string_view s) {
  // "|" in the test strings stands for the DSML marker.
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += mk::DSML;
    else
      out += c;
  }
  return out;
}

std::vector<ChatMessage> conversation(const ParsedMessage& reply) {
  ChatMessage user;
  user.role = ChatRole::USER;
  user.content = ChatContent::from_text("list /tmp");
  ChatMessage a;
  a.role = ChatRole::ASSISTANT;
  a.content = ChatContent::from_text(reply.content);
  a.tool_calls = reply.tool_calls;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) a.tool_calls[i].id = "call_" + std::to_string(i);
  ChatMessage tool;
  tool.role = ChatRole::TOOL;
  tool.tool_call_id = "call_0";
  tool.content = ChatContent::from_text("a b");
  return {user, a, tool};
}

}  // namespace

TEST(ChatReplay, RawBlockRendersVerbatimWithDsmlMarkersAsControl) {
  // A lenient, non-canonical block: extra whitespace, attribute spacing, a
  // minified JSON value, a value with characters the canonical form keeps.
  const std::string block = dsml(
      "\n\n<|tool_calls>\n<|invoke name=\"ls\">\n<|parameter name=\"path\" string=\"true\">/tmp & <x></|parameter>\n"
      "<|parameter name=\"opts\" string=\"false\">{\"a\":[1,2]}</|parameter>\n</|invoke>\n</|tool_calls>");
  const std::string completion = "Let me look." + block;
  ParsedMessage reply = parse_completion(completion, ThinkingMode::CHAT);
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  ASSERT_EQ(reply.content + reply.raw_dsml, completion);

  auto msgs = conversation(reply);
  RenderOptions o;
  auto canonical = render_official(msgs, o);
  ASSERT_TRUE(canonical.has_value());
  const std::string canonical_text = rendered_text(*canonical);
  // The canonical form differs from what was sampled (JSON spacing).
  EXPECT_EQ(canonical_text.find(completion), std::string::npos);

  msgs[1].raw_dsml = reply.raw_dsml;
  auto replay = render_official(msgs, o);
  ASSERT_TRUE(replay.has_value());
  const std::string text = rendered_text(*replay);
  const std::string expected_turn =
      std::string(mk::ASSISTANT) + std::string(mk::THINK_END) + completion + std::string(mk::EOS);
  EXPECT_NE(text.find(expected_turn), std::string::npos) << text;
  // The tool result follows as before.
  EXPECT_NE(text.find("<tool_result>a b</tool_result>"), std::string::npos);

  // Every DSML marker of the block is a control piece; no text piece holds one.
  size_t dsml_controls = 0;
  for (const auto& p : *replay) {
    if (p.control && p.text == mk::DSML) ++dsml_controls;
    if (!p.control) {
      EXPECT_EQ(p.text.find(mk::DSML), std::string::npos) << p.text;
    }
  }
  EXPECT_EQ(dsml_controls, 8u);  // tool_calls, invoke, 2 parameters: open and close tags
}

TEST(ChatReplay, RawBlockOverridesToolCallsAndKeepsTextInValuesAsText) {
  // Marker-like text inside a parameter value (not a DSML marker) stays text.
  const std::string block = dsml(
      "\n\n<|tool_calls>\n<|invoke name=\"echo\">\n<|parameter name=\"s\" string=\"true\">"
      "<think>hi</think></|parameter>\n</|invoke>\n</|tool_calls>");
  ChatMessage a;
  a.role = ChatRole::ASSISTANT;
  a.tool_calls = {ChatToolCall{"call_x", "something_else", "{}"}};  // ignored in favour of the raw block
  a.raw_dsml = block;
  ChatMessage u;
  u.role = ChatRole::USER;
  u.content = ChatContent::from_text("go");
  auto r = render_official({u, a}, RenderOptions{});
  ASSERT_TRUE(r.has_value());
  const std::string text = rendered_text(*r);
  EXPECT_NE(text.find(block + std::string(mk::EOS)), std::string::npos);
  EXPECT_EQ(text.find("something_else"), std::string::npos);
  for (const auto& p : *r) {
    if (p.control) {
      EXPECT_NE(p.text, mk::THINK_START);
    }
  }
}

TEST(ChatReplay, ReasoningAndBlockInThinkingModeWithTools) {
  // Thinking mode with tools keeps reasoning (drop_thinking is forced off), so
  // the whole sampled turn comes back: reasoning, </think>, content, block.
  const std::string block = dsml("\n\n<|tool_calls>\n<|invoke name=\"now\">\n\n</|invoke>\n</|tool_calls>");
  const std::string completion = "think first</think>" + block;
  ParsedMessage reply = parse_completion(completion, ThinkingMode::THINKING);
  ASSERT_EQ(reply.tool_calls.size(), 1u);
  auto msgs = conversation(reply);
  msgs[1].reasoning_content = reply.reasoning_content;
  msgs[1].raw_dsml = reply.raw_dsml;
  RenderOptions o;
  o.thinking_mode = ThinkingMode::THINKING;
  ChatTool tool;
  tool.name = "now";
  tool.function = nlohmann::ordered_json{{"name", "now"}};
  o.tools = {tool};
  auto r = render_official(msgs, o);
  ASSERT_TRUE(r.has_value());
  const std::string text = rendered_text(*r);
  EXPECT_NE(text.find(std::string(mk::ASSISTANT) + std::string(mk::THINK_START) + completion + std::string(mk::EOS)),
            std::string::npos)
      << text;
}

TEST(ChatReplay, FromOpenaiJsonNeverSetsRawDsml) {
  auto j = nlohmann::ordered_json::parse(
      R"([{"role":"assistant","content":"x","raw_dsml":"<｜DSML｜tool_calls>","tool_calls":[]}])");
  auto m = from_openai_json(j);
  ASSERT_TRUE(m.has_value());
  EXPECT_FALSE((*m)[0].raw_dsml.has_value());
}
