// Request parsing of every dialect adapter, the thinking/sampling mapping of
// formats.md §4.7, request validation and the error shapes. No model: the
// tokenizer is a synthetic vocabulary with the real special tokens.
#include <gtest/gtest.h>

#include "server/anthropic_messages.h"
#include "server/json_util.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"
#include "server_test_util.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;

namespace {

ordered_json J(const char* text) { return ordered_json::parse(text); }

struct Ctx {
  std::unique_ptr<Tokenizer> tok = test::make_tokenizer();
  ToolMemory memory;
  ServeContext ctx{*tok, 4096, ModelCatalog{"tiny", {"my-alias"}}, memory};
};

std::string prompt_text(const PreparedRequest& p) { return rendered_text(p.job.rendered); }

}  // namespace

TEST(ServerOpenAIChat, ParsesEveryField) {
  auto r = parse_openai_chat(J(R"({
    "model": "deepseek-chat",
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": null, "reasoning_content": "r",
                  "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                 {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "parallel_tool_calls": false, "stream": true, "stream_options": {"include_usage": true},
    "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "seed": 7,
    "max_tokens": 100, "max_completion_tokens": 50, "stop": ["END", "STOP"],
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "logprobs": true, "top_logprobs": 3,
    "reasoning_effort": "max", "response_format": {"type": "json_object"}, "n": 1, "user": "ignored"})"));
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ(r->model, "deepseek-chat");
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[2].tool_calls.at(0).id, "call_1");
  EXPECT_EQ(*r->messages[2].reasoning_content, "r");
  EXPECT_EQ(r->messages[3].role, ChatRole::TOOL);
  ASSERT_EQ(r->tools.size(), 1u);
  EXPECT_EQ(r->tool_choice.mode, ToolChoiceMode::FUNCTION);
  EXPECT_EQ(r->tool_choice.name, "f");
  EXPECT_FALSE(r->parallel_tool_calls);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_FLOAT_EQ(*r->temperature, 0.5f);
  EXPECT_FLOAT_EQ(*r->top_p, 0.9f);
  EXPECT_EQ(*r->top_k, 40);
  EXPECT_FLOAT_EQ(*r->min_p, 0.1f);
  EXPECT_EQ(*r->seed, 7u);
  EXPECT_EQ(*r->max_tokens, 50);  // max_completion_tokens wins
  EXPECT_EQ(r->stop, (std::vector<std::string>{"END", "STOP"}));
  EXPECT_FLOAT_EQ(*r->presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(*r->frequency_penalty, -0.5f);
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_EQ(*r->thinking.level, ThinkingLevel::MAX);
  EXPECT_EQ(r->response_format, ResponseFormat::JSON_OBJECT);
}

TEST(ServerOpenAIChat, RejectsBadInputWithTheFieldNamed) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"([1, 2])", "JSON object"},
      {R"({"model": "m"})", "'messages' is required"},
      {R"({"messages": "hi"})", "'messages' must be an array"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "'temperature' must be a number"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", "'temperature' must be between"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "'max_tokens' must be between"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1.5})", "'max_tokens' must be an integer"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 17})", "'n' is at most 16"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "requires 'logprobs'"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 1}})", "logit_bias"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})", "unknown role"},
      {R"({"messages": [{"role": "user", "content": 5}]})", "content"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", "'stop' must be a string"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "'stream' must be a boolean"},
      {R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"})", "reasoning_effort"},
      {R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}})", "response_format"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]})",
       "unsupported tool type"},
  };
  for (const auto& [body, needle] : cases) {
    auto r = parse_openai_chat(J(body));
    ASSERT_FALSE(r.has_value()) << body;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << body << " -> " << r.error().message;
  }
}

TEST(ServerThinking, MappingFollowsFormats47) {
  using A = ModelCatalog::Alias;
  auto level = [](ThinkingControl t, A alias, uint32_t ctx = 4096) { return resolve_thinking(t, alias, ctx); };
  ThinkingControl none;
  EXPECT_EQ(level(none, A::SERVED), ThinkingLevel::HIGH);  // on by default
  EXPECT_EQ(level(none, A::CHAT), ThinkingLevel::NONE);
  EXPECT_EQ(level(none, A::REASONER), ThinkingLevel::HIGH);
  ThinkingControl off;
  off.enabled = false;
  EXPECT_EQ(level(off, A::SERVED), ThinkingLevel::NONE);
  EXPECT_EQ(level(off, A::REASONER), ThinkingLevel::NONE);
  ThinkingControl on;
  on.enabled = true;
  EXPECT_EQ(level(on, A::CHAT), ThinkingLevel::HIGH);  // explicit control beats the alias
  for (const char* e : {"xhigh", "high", "medium", "low", "minimal"}) {
    ThinkingControl t;
    t.level = *thinking_level_from_string(e);
    EXPECT_EQ(level(t, A::CHAT), ThinkingLevel::HIGH) << e;
  }
  ThinkingControl max;
  max.level = ThinkingLevel::MAX;
  EXPECT_EQ(level(max, A::SERVED, 4096), ThinkingLevel::HIGH);  // ctx < 393216: max runs as high
  EXPECT_EQ(level(max, A::SERVED, 393216), ThinkingLevel::MAX);
  ThinkingControl effort_none;
  effort_none.level = ThinkingLevel::NONE;
  EXPECT_EQ(level(effort_none, A::REASONER), ThinkingLevel::NONE);
}

TEST(ServerThinking, SamplingIsFixedWhileThinkingAndTheClientsOtherwise) {
  ChatRequest r;
  r.temperature = 0.2f;
  r.top_k = 5;
  r.seed = 99;
  SamplingParams think = resolve_sampling(r, ThinkingLevel::HIGH);
  EXPECT_FLOAT_EQ(think.temperature, 1.0f);
  EXPECT_EQ(think.top_k, 0);
  EXPECT_FLOAT_EQ(think.min_p, 0.05f);
  EXPECT_EQ(think.seed, 99u);
  SamplingParams chat = resolve_sampling(r, ThinkingLevel::NONE);
  EXPECT_FLOAT_EQ(chat.temperature, 0.2f);
  EXPECT_EQ(chat.top_k, 5);
  EXPECT_FLOAT_EQ(chat.min_p, 0.05f);  // the default stays where the client said nothing
  ChatRequest no_seed;
  EXPECT_NE(resolve_sampling(no_seed, ThinkingLevel::NONE).seed, resolve_sampling(no_seed, ThinkingLevel::NONE).seed);
}

TEST(ServerPrepare, ValidatesModelMessagesToolsAndContext) {
  Ctx c;
  auto prep = [&](const char* body) { return prepare_openai_chat(J(body), c.ctx); };
  auto unknown = prep(R"({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]})");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_EQ(unknown.error().status(), 404);
  EXPECT_EQ(unknown.error().param, "model");
  EXPECT_NE(unknown.error().message.find("tiny"), std::string::npos);
  auto empty = prep(R"({"model": "tiny", "messages": []})");
  ASSERT_FALSE(empty.has_value());
  EXPECT_EQ(empty.error().status(), 400);
  auto missing_tool = prep(R"({"messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})");
  ASSERT_FALSE(missing_tool.has_value());
  EXPECT_NE(missing_tool.error().message.find("'g'"), std::string::npos);
  auto required_no_tools = prep(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})");
  ASSERT_FALSE(required_no_tools.has_value());
  std::string huge(20000, 'q');
  auto too_long = prepare_openai_chat(ordered_json{{"messages", {{{"role", "user"}, {"content", huge}}}}}, c.ctx);
  ASSERT_FALSE(too_long.has_value());
  EXPECT_EQ(too_long.error().kind, ApiErrorKind::CONTEXT_LENGTH);
  EXPECT_EQ(error_json(too_long.error(), ErrorShape::OPENAI)["error"]["code"], "context_length_exceeded");
  for (const char* id : {"tiny", "my-alias", "deepseek-v4-flash", "deepseek-chat", "deepseek-reasoner", ""}) {
    auto ok =
        prepare_openai_chat(ordered_json{{"model", id}, {"messages", {{{"role", "user"}, {"content", "x"}}}}}, c.ctx);
    EXPECT_TRUE(ok.has_value()) << id;
  }
}

TEST(ServerPrepare, RendersWithTheOfficialEncoderAndTheRequestedMode) {
  Ctx c;
  const char* tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";
  auto with = prepare_openai_chat(
      J((std::string(R"({"model": "deepseek-chat", "messages": [{"role": "user", "content": "hi"}], )") + tools + "}")
            .c_str()),
      c.ctx);
  ASSERT_TRUE(with.has_value());
  const std::string t = prompt_text(*with);
  EXPECT_EQ(t.rfind(k_token_bos, 0), 0u);
  EXPECT_NE(t.find("## Tools"), std::string::npos);
  EXPECT_NE(t.find("\"name\": \"get_weather\""), std::string::npos);
  EXPECT_TRUE(
      t.ends_with(std::string(k_token_user) + "hi" + std::string(k_token_assistant) + std::string(k_token_think_end)));
  EXPECT_TRUE(with->policy.allow_tool_calls);
  EXPECT_EQ(with->job.options.thinking, ThinkingMode::CHAT);
  EXPECT_EQ(with->job.prompt, *c.tok->encode_prompt(with->job.rendered));

  auto none = prepare_openai_chat(
      J((std::string(R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "none", )") + tools + "}")
            .c_str()),
      c.ctx);
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(prompt_text(*none).find("## Tools"), std::string::npos);
  EXPECT_FALSE(none->policy.allow_tool_calls);
  EXPECT_TRUE(prompt_text(*none).ends_with(std::string(k_token_assistant) +
                                           std::string(k_token_think_begin)));  // thinking by default
  EXPECT_EQ(none->job.options.thinking, ThinkingMode::THINKING);

  auto json = prepare_openai_chat(
      J(R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})"), c.ctx);
  ASSERT_TRUE(json.has_value());
  EXPECT_NE(
      prompt_text(*json).find(
          "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{\"type\": \"object\"}"),
      std::string::npos);
  EXPECT_EQ(json->response_format, ResponseFormat::JSON_OBJECT);
  EXPECT_TRUE(satisfies_response_format(" {\"a\": 1} ", ResponseFormat::JSON_OBJECT));
  EXPECT_FALSE(satisfies_response_format("[1]", ResponseFormat::JSON_OBJECT));
  EXPECT_FALSE(satisfies_response_format("```json\n{}\n```", ResponseFormat::JSON_OBJECT));
  EXPECT_TRUE(satisfies_response_format("[1]", ResponseFormat::JSON_SCHEMA));
  // A NUL ends nlohmann's input: "{}\0junk" must not count as JSON.
  EXPECT_FALSE(satisfies_response_format(std::string_view("{}\0junk", 7), ResponseFormat::JSON_OBJECT));
  EXPECT_FALSE(satisfies_response_format(std::string_view("[1]\0junk", 8), ResponseFormat::JSON_SCHEMA));

  auto forced = prepare_openai_chat(
      J((std::string(R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required", )") + tools + "}")
            .c_str()),
      c.ctx);
  ASSERT_TRUE(forced.has_value());
  EXPECT_EQ(forced->job.forced_tool, ForcedTool::ANY);
}

TEST(ServerAnthropic, MapsBlocksToTheChatModel) {
  auto r = parse_anthropic_messages(J(R"({
    "model": "tiny", "max_tokens": 64,
    "system": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two", "cache_control": {"type": "ephemeral"}}],
    "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "need a tool", "signature": "sig"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "noon", "is_error": false},
        {"type": "text", "text": "thanks"}, {"type": "image", "source": {}}]}],
    "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
              {"type": "web_search_20250305", "name": "web_search"}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "stop_sequences": ["###"], "stream": true, "temperature": 0.3, "top_k": 10,
    "thinking": {"type": "enabled", "budget_tokens": 2048}})"),
                                    false);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->messages.size(), 6u);
  EXPECT_EQ(r->messages[0].role, ChatRole::SYSTEM);
  EXPECT_EQ(r->messages[0].content.flattened(), "part one\n\npart two");
  const ChatMessage& a = r->messages[2];
  EXPECT_EQ(a.role, ChatRole::ASSISTANT);
  EXPECT_EQ(*a.reasoning_content, "need a tool");
  EXPECT_EQ(a.content.flattened(), "Checking.");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "toolu_1");
  EXPECT_TRUE(json_text_equivalent(a.tool_calls[0].arguments, R"({"city":"Paris"})"));
  EXPECT_EQ(r->messages[3].role, ChatRole::TOOL);
  EXPECT_EQ(r->messages[3].tool_call_id, "toolu_1");
  EXPECT_EQ(r->messages[3].content.flattened(), "sunny");
  EXPECT_EQ(r->messages[4].tool_call_id, "toolu_2");
  EXPECT_EQ(r->messages[5].role, ChatRole::USER);
  EXPECT_EQ(r->messages[5].content.flattened(), "thanks\n\n[Unsupported image]");
  ASSERT_EQ(r->tools.size(), 1u);  // the server tool is skipped
  EXPECT_EQ(r->tools[0].function["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_EQ(r->tool_choice.mode, ToolChoiceMode::REQUIRED);
  EXPECT_FALSE(r->parallel_tool_calls);
  EXPECT_EQ(r->stop, std::vector<std::string>{"###"});
  EXPECT_TRUE(*r->thinking.enabled);
  EXPECT_EQ(r->thinking.budget_tokens, 2048);
  EXPECT_EQ(*r->max_tokens, 64);

  auto adaptive = parse_anthropic_messages(J(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}, "tool_choice": {"type": "tool", "name": "f"}})"),
                                           false);
  ASSERT_TRUE(adaptive.has_value());
  EXPECT_TRUE(*adaptive->thinking.enabled);
  EXPECT_EQ(*adaptive->thinking.level, ThinkingLevel::MAX);
  EXPECT_EQ(adaptive->tool_choice.name, "f");
}

TEST(ServerAnthropic, RejectsBadInputAndCountsTokens) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"messages": [{"role": "user", "content": "x"}]})", "'max_tokens' is required"},
      {R"({"max_tokens": 5, "messages": []})", "must not be empty"},
      {R"({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})", "role"},
      {R"({"max_tokens": 5, "messages": [{"role": "user"}]})", "content"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]})", "type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "sometimes"}})",
       "thinking.type"},
      {R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}})",
       "tool_choice.name"},
      {R"({"max_tokens": "5", "messages": [{"role": "user", "content": "x"}]})", "'max_tokens' must be an integer"},
  };
  for (const auto& [body, needle] : cases) {
    auto r = parse_anthropic_messages(J(body), false);
    ASSERT_FALSE(r.has_value()) << body;
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << body << " -> " << r.error().message;
  }
  Ctx c;
  auto n = anthropic_count_tokens(J(R"({"model": "tiny", "messages": [{"role": "user", "content": "hello there"}]})"),
                                  c.ctx);
  ASSERT_TRUE(n.has_value());
  auto p = prepare_anthropic_messages(
      J(R"({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "hello there"}]})"), c.ctx);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ((*n)["input_tokens"], p->prompt_tokens);
  EXPECT_EQ(p->policy.id_prefix, "toolu_");
  auto bad_model =
      anthropic_count_tokens(J(R"({"model": "claude-x", "messages": [{"role": "user", "content": "x"}]})"), c.ctx);
  ASSERT_FALSE(bad_model.has_value());
  EXPECT_EQ(error_json(bad_model.error(), ErrorShape::ANTHROPIC)["error"]["type"], "not_found_error");
}

TEST(ServerResponses, MapsInputItems) {
  auto r = parse_openai_responses(J(R"({
    "model": "tiny", "instructions": "be brief",
    "input": [
      {"role": "developer", "content": "rules"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}, {"type": "input_image", "image_url": "x"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "short"}],
       "content": [{"type": "reasoning_text", "text": "I will call ls"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listing."}]},
      {"type": "function_call", "call_id": "call_a", "name": "ls", "arguments": "{\"path\":\".\"}"},
      {"type": "function_call", "call_id": "call_b", "name": "pwd", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "a.txt"},
      {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "/tmp"}]},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "only a summary"}]},
      {"type": "function_call", "call_id": "call_c", "name": "cat", "arguments": "{}"}],
    "tools": [{"type": "function", "name": "ls", "description": "list", "parameters": {"type": "object"}},
              {"type": "web_search"}, {"type": "custom", "name": "apply_patch"}],
    "tool_choice": {"type": "function", "name": "ls"}, "parallel_tool_calls": false,
    "max_output_tokens": 77, "reasoning": {"effort": "low"}, "text": {"format": {"type": "json_object"}},
    "store": false, "include": ["reasoning.encrypted_content"], "stream": true})"));
  ASSERT_TRUE(r.has_value()) << r.error().message;
  ASSERT_EQ(r->messages.size(), 7u);
  EXPECT_EQ(r->messages[0].role, ChatRole::SYSTEM);
  EXPECT_EQ(r->messages[0].content.flattened(), "be brief");
  EXPECT_EQ(r->messages[1].role, ChatRole::SYSTEM);  // developer
  EXPECT_EQ(r->messages[2].content.flattened(), "list files\n\n[Unsupported input_image]");
  const ChatMessage& a = r->messages[3];
  EXPECT_EQ(a.role, ChatRole::ASSISTANT);
  EXPECT_EQ(*a.reasoning_content, "I will call ls");  // content preferred over the summary
  EXPECT_EQ(a.content.flattened(), "Listing.");
  ASSERT_EQ(a.tool_calls.size(), 2u);  // both calls join the assistant turn
  EXPECT_EQ(a.tool_calls[1].id, "call_b");
  EXPECT_EQ(r->messages[4].tool_call_id, "call_a");
  EXPECT_EQ(r->messages[5].content.flattened(), "/tmp");
  EXPECT_EQ(r->messages[6].role, ChatRole::ASSISTANT);  // a new turn after the results
  EXPECT_EQ(*r->messages[6].reasoning_content, "only a summary");
  EXPECT_EQ(r->messages[6].tool_calls.at(0).name, "cat");
  ASSERT_EQ(r->tools.size(), 1u);
  EXPECT_EQ(r->tools[0].function["description"], "list");
  EXPECT_EQ(r->tool_choice.mode, ToolChoiceMode::FUNCTION);
  EXPECT_FALSE(r->parallel_tool_calls);
  EXPECT_EQ(*r->max_tokens, 77);
  EXPECT_EQ(*r->thinking.level, ThinkingLevel::HIGH);
  EXPECT_EQ(r->response_format, ResponseFormat::JSON_OBJECT);

  auto plain = parse_openai_responses(J(R"({"input": "hello"})"));
  ASSERT_TRUE(plain.has_value());
  ASSERT_EQ(plain->messages.size(), 1u);
  EXPECT_EQ(plain->messages[0].content.flattened(), "hello");

  const std::vector<std::pair<const char*, const char*>> bad = {
      {R"({"input": "x", "previous_response_id": "resp_1"})", "previous_response_id"},
      {R"({"model": "m"})", "'input' is required"},
      {R"({"input": []})", "must not be empty"},
      {R"({"input": [{"type": "local_shell_call"}]})", "not supported"},
      {R"({"input": [{"type": "function_call", "name": "f"}]})", "call_id"},
      {R"({"input": 5})", "'input' must be a string"},
      {R"({"input": "x", "reasoning": {"effort": "ultra"}})", "reasoning.effort"},
  };
  for (const auto& [body, needle] : bad) {
    auto e = parse_openai_responses(J(body));
    ASSERT_FALSE(e.has_value()) << body;
    EXPECT_NE(e.error().message.find(needle), std::string::npos) << body << " -> " << e.error().message;
  }
}

TEST(ServerCompletions, TakesThePromptAsGiven) {
  Ctx c;
  auto p = prepare_openai_completions(J(R"({"model": "tiny", "prompt": "<｜begin▁of▁sentence｜>Once upon"})"), c.ctx);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->job.prompt.front(), c.tok->bos());  // spelled specials are recognised
  EXPECT_EQ(p->job.prompt, c.tok->encode_with_specials("<｜begin▁of▁sentence｜>Once upon"));
  EXPECT_TRUE(p->job.rendered.empty());
  EXPECT_FALSE(p->job.options.parse_chat);
  EXPECT_EQ(p->job.options.max_tokens, 16);
  auto ids = prepare_openai_completions(J(R"({"prompt": [0, 100, 200], "max_tokens": 3})"), c.ctx);
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(ids->job.prompt, (std::vector<int32_t>{0, 100, 200}));
  for (const char* body :
       {R"({"prompt": ["a", "b"]})", R"({"prompt": "a", "suffix": "z"})", R"({"prompt": "a", "n": 30})",
        R"({"prompt": [1, 999999]})", R"({"prompt": ""})", R"({"model": "x", "prompt": "a"})"}) {
    EXPECT_FALSE(prepare_openai_completions(J(body), c.ctx).has_value()) << body;
  }
}

TEST(ServerErrors, ShapesPerDialect) {
  struct Case {
    ApiErrorKind kind;
    int status;
    const char* openai_type;
    const char* anthropic_type;
  };
  const Case cases[] = {
      {ApiErrorKind::INVALID_REQUEST, 400, "invalid_request_error", "invalid_request_error"},
      {ApiErrorKind::CONTEXT_LENGTH, 400, "invalid_request_error", "invalid_request_error"},
      {ApiErrorKind::AUTHENTICATION, 401, "invalid_request_error", "authentication_error"},
      {ApiErrorKind::NOT_FOUND, 404, "invalid_request_error", "not_found_error"},
      {ApiErrorKind::PAYLOAD_TOO_LARGE, 413, "invalid_request_error", "request_too_large"},
      {ApiErrorKind::INVALID_OUTPUT, 422, "invalid_request_error", "invalid_request_error"},
      {ApiErrorKind::OVERLOADED, 503, "server_error", "overloaded_error"},
      {ApiErrorKind::INTERNAL, 500, "server_error", "api_error"},
  };
  for (const auto& c : cases) {
    ApiError e{c.kind, "msg", "", ""};
    EXPECT_EQ(e.status(), c.status);
    auto o = error_json(e, ErrorShape::OPENAI);
    EXPECT_EQ(o["error"]["message"], "msg");
    EXPECT_EQ(o["error"]["type"], c.openai_type);
    EXPECT_TRUE(o["error"].contains("param") && o["error"].contains("code"));
    auto a = error_json(e, ErrorShape::ANTHROPIC);
    EXPECT_EQ(a["type"], "error");
    EXPECT_EQ(a["error"]["type"], c.anthropic_type);
    EXPECT_EQ(a["error"]["message"], "msg");
  }
  EXPECT_EQ(error_json(invalid_request("m", "temperature"), ErrorShape::OPENAI)["error"]["param"], "temperature");
}
