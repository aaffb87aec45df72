// The dialect writers against the scripted fake engine: SSE framing, event
// order, tool calls streamed as they are generated (OpenAI tool_calls deltas,
// Anthropic tool_use + input_json_delta, Responses function_call events), the
// final bodies, usage, stop reasons, logprobs, and the tool policies.
#include <gtest/gtest.h>

#include <regex>

#include "server/anthropic_messages.h"
#include "runtime/job_runner.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"
#include "server_test_util.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;
using namespace dsv4::server::test;
using ordered_json = nlohmann::ordered_json;

namespace {

const char* k_tools_openai =
    R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}])";

std::string weather_call() {
  return call_block("get_weather", string_param("city", "Paris") + "\n" +
                                       dsml("<|parameter name=\"days\" string=\"false\">3</|parameter>"));
}

struct Ran {
  std::string sse;
  ordered_json body;
  FinalReply reply;
  JobOutcome outcome;
};

// Runs a prepared request on the fake engine the way the transport does:
// events one at a time through the assembler into the writer, then the end.
Ran run(PreparedRequest& p, ScriptedBackend& b, ToolMemory& memory) {
  std::vector<DsmlEvent> events;
  JobHooks h;
  h.on_event = [&](const DsmlEvent& e) { events.push_back(e); };
  h.cancelled = [] { return false; };
  Ran r;
  r.outcome = run_job(b, p.job, h);
  EXPECT_FALSE(r.outcome.error.has_value()) << (r.outcome.error ? r.outcome.error->message : "");
  ReplyAssembler assembler(p.policy, memory);
  r.sse = p.writer->stream_begin();
  for (const auto& e : events) {
    std::vector<OutEvent> outs;
    assembler.on_event(e, outs);
    r.sse += p.writer->stream_events(outs);
  }
  std::vector<OutEvent> tail;
  r.reply = assembler.finish(r.outcome, tail);
  r.sse += p.writer->stream_events(tail);
  r.sse += p.writer->stream_end(r.reply);
  r.body = p.writer->body(r.reply);
  return r;
}

struct Fixture {
  ToolMemory memory;
  std::unique_ptr<ScriptedBackend> backend;
  std::unique_ptr<ServeContext> ctx;
  explicit Fixture(std::string reply, std::string match = "") {
    backend = make_backend({ScriptedReply{std::move(match), std::move(reply), 0, 0}});
    ctx = std::make_unique<ServeContext>(ServeContext{backend->tokenizer(), 4096, ModelCatalog{"tiny", {}}, memory});
  }
};

ordered_json body_with(const std::string& extra) {
  return ordered_json::parse(R"({"messages": [{"role": "user", "content": "weather in Paris?"}])" +
                             std::string(extra.empty() ? "" : ", ") + extra + "}");
}

bool is_tool_id(const std::string& id, const std::string& prefix) {
  return std::regex_match(id, std::regex(prefix + "[0-9a-f]{32}"));
}

}  // namespace

TEST(ServerStreamOpenAI, ToolCallArgumentsStreamAsTheyAreGenerated) {
  Fixture f("Let me check." + weather_call());
  auto p = prepare_openai_chat(
      body_with(
          std::string(
              R"("model": "deepseek-chat", "stream": true, "stream_options": {"include_usage": true}, "tools": )") +
          k_tools_openai),
      *f.ctx);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  Ran r = run(*p, *f.backend, f.memory);
  auto frames = parse_sse(r.sse);
  ASSERT_GE(frames.size(), 6u);
  EXPECT_EQ(frames.back().data, "[DONE]");
  auto first = frames[0].json();
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  std::string content, args, id, name;
  int starts = 0;
  std::string finish;
  ordered_json usage;
  for (size_t i = 0; i + 1 < frames.size(); ++i) {
    auto j = frames[i].json();
    ASSERT_FALSE(j.is_discarded()) << frames[i].data;
    EXPECT_EQ(j["id"], first["id"]);
    if (j["choices"].empty()) {
      usage = j["usage"];
      continue;
    }
    const auto& d = j["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      const auto& tc = d["tool_calls"][0];
      EXPECT_EQ(tc["index"], 0);
      if (tc.contains("id")) {
        ++starts;
        id = tc["id"];
        name = tc["function"]["name"];
        EXPECT_EQ(tc["type"], "function");
        EXPECT_EQ(tc["function"]["arguments"], "");
        EXPECT_TRUE(content == "Let me check.") << "the call starts after the content";
      } else {
        args += tc["function"]["arguments"].get<std::string>();
      }
    }
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(content, "Let me check.");
  EXPECT_EQ(starts, 1);
  EXPECT_TRUE(is_tool_id(id, "call_")) << id;
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(args, R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], r.outcome.result.tokens.size());
  EXPECT_EQ(usage["prompt_tokens"], p->prompt_tokens);
  EXPECT_EQ(usage["total_tokens"], usage["prompt_tokens"].get<size_t>() + usage["completion_tokens"].get<size_t>());
  EXPECT_TRUE(usage["prompt_tokens_details"].contains("cached_tokens"));

  // The plain body says the same, under the same id; the call is remembered.
  const auto& msg = r.body["choices"][0]["message"];
  EXPECT_EQ(msg["content"], "Let me check.");
  EXPECT_EQ(msg["tool_calls"][0]["id"], id);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], args);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(f.memory.size(), 1u);
}

TEST(ServerStreamOpenAI, ReasoningThenContentAndBatchedDeltas) {
  Fixture f("first plan</think>The answer.");
  auto p = prepare_openai_chat(body_with(R"("model": "deepseek-reasoner", "stream": true)"), *f.ctx);
  ASSERT_TRUE(p.has_value());
  Ran r = run(*p, *f.backend, f.memory);
  std::string reasoning, content;
  for (const auto& fr : parse_sse(r.sse)) {
    if (fr.data == "[DONE]") continue;
    auto j = fr.json();
    EXPECT_FALSE(j.contains("usage"));  // include_usage not asked
    const auto& d = j["choices"][0]["delta"];
    if (d.contains("reasoning_content")) {
      EXPECT_TRUE(content.empty());
      reasoning += d["reasoning_content"].get<std::string>();
    }
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "first plan");
  EXPECT_EQ(content, "The answer.");
  EXPECT_EQ(r.body["choices"][0]["message"]["reasoning_content"], "first plan");
  EXPECT_GT(r.body["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");

  // Several deltas of one kind in one batch go out as one chunk.
  auto q = prepare_openai_chat(body_with(R"("stream": true)"), *f.ctx);
  ASSERT_TRUE(q.has_value());
  std::vector<OutEvent> batch = {
      {OutKind::CONTENT, 0, "a", ""}, {OutKind::CONTENT, 0, "b", ""}, {OutKind::REASONING, 0, "c", ""}};
  auto frames = parse_sse(q->writer->stream_events(batch));
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].json()["choices"][0]["delta"]["content"], "ab");
}

TEST(ServerStreamAnthropic, ThinkingTextAndToolUseBlocks) {
  Fixture f("let me think</think>Checking." + weather_call());
  auto p = prepare_anthropic_messages(ordered_json::parse(R"({"model": "tiny", "max_tokens": 200, "stream": true,
        "thinking": {"type": "enabled", "budget_tokens": 1000},
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]})"),
                                      *f.ctx);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  Ran r = run(*p, *f.backend, f.memory);
  auto frames = parse_sse(r.sse);
  std::vector<std::string> kinds;
  for (const auto& fr : frames) {
    auto j = fr.json();
    ASSERT_FALSE(j.is_discarded()) << fr.data;
    EXPECT_EQ(j["type"], fr.event);  // the event name repeats the payload's type
    kinds.push_back(fr.event);
  }
  ASSERT_GE(kinds.size(), 12u);
  EXPECT_EQ(kinds[0], "message_start");
  EXPECT_EQ(kinds[1], "ping");
  EXPECT_EQ(kinds[kinds.size() - 2], "message_delta");
  EXPECT_EQ(kinds.back(), "message_stop");
  auto start = frames[0].json()["message"];
  EXPECT_EQ(start["role"], "assistant");
  EXPECT_TRUE(start["content"].empty());
  EXPECT_EQ(start["usage"]["input_tokens"], p->prompt_tokens);

  // Blocks: 0 thinking, 1 text, 2 tool_use; each opened, filled, closed in order.
  std::map<int, std::string> type, text;
  std::map<int, ordered_json> block;
  int open = -1;
  std::string signature;
  for (const auto& fr : frames) {
    auto j = fr.json();
    if (fr.event == "content_block_start") {
      EXPECT_EQ(open, -1);
      open = j["index"];
      type[open] = j["content_block"]["type"];
      block[open] = j["content_block"];
    } else if (fr.event == "content_block_delta") {
      EXPECT_EQ(j["index"], open);
      const auto& d = j["delta"];
      if (d["type"] == "thinking_delta") text[open] += d["thinking"].get<std::string>();
      if (d["type"] == "text_delta") text[open] += d["text"].get<std::string>();
      if (d["type"] == "input_json_delta") text[open] += d["partial_json"].get<std::string>();
      if (d["type"] == "signature_delta") signature = d["signature"];
    } else if (fr.event == "content_block_stop") {
      EXPECT_EQ(j["index"], open);
      open = -1;
    }
  }
  EXPECT_EQ(open, -1);
  ASSERT_EQ(type.size(), 3u);
  EXPECT_EQ(type[0], "thinking");
  EXPECT_EQ(text[0], "let me think");
  EXPECT_EQ(signature.rfind("dsv4-", 0), 0u);
  EXPECT_EQ(type[1], "text");
  EXPECT_EQ(text[1], "Checking.");
  EXPECT_EQ(type[2], "tool_use");
  EXPECT_TRUE(is_tool_id(block[2]["id"], "toolu_")) << block[2]["id"];
  EXPECT_EQ(block[2]["name"], "get_weather");
  EXPECT_EQ(ordered_json::parse(text[2]), ordered_json::parse(R"({"city": "Paris", "days": 3})"));
  auto delta = frames[frames.size() - 2].json();
  EXPECT_EQ(delta["delta"]["stop_reason"], "tool_use");
  EXPECT_EQ(delta["usage"]["output_tokens"], r.outcome.result.tokens.size());
  EXPECT_EQ(delta["usage"]["input_tokens"].get<size_t>() + delta["usage"]["cache_read_input_tokens"].get<size_t>(),
            p->prompt_tokens);

  const auto& content = r.body["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0]["type"], "thinking");
  EXPECT_EQ(content[0]["signature"], signature);
  EXPECT_EQ(content[1]["text"], "Checking.");
  EXPECT_EQ(content[2]["id"], block[2]["id"]);
  EXPECT_EQ(content[2]["input"]["city"], "Paris");
  EXPECT_EQ(content[2]["input"]["days"], 3);
  EXPECT_EQ(r.body["stop_reason"], "tool_use");
  EXPECT_EQ(r.body["type"], "message");
}

TEST(ServerStreamAnthropic, StopSequenceAndMaxTokens) {
  Fixture f("Hello there ### and more text that goes on");
  auto p = prepare_anthropic_messages(ordered_json::parse(R"({"max_tokens": 100, "stop_sequences": ["###"],
      "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": "x"}]})"),
                                      *f.ctx);
  ASSERT_TRUE(p.has_value());
  Ran r = run(*p, *f.backend, f.memory);
  EXPECT_EQ(r.body["stop_reason"], "stop_sequence");
  EXPECT_EQ(r.body["stop_sequence"], "###");
  EXPECT_EQ(r.body["content"][0]["text"], "Hello there ");
  auto q = prepare_anthropic_messages(ordered_json::parse(R"({"max_tokens": 2, "thinking": {"type": "disabled"},
      "messages": [{"role": "user", "content": "x"}]})"),
                                      *f.ctx);
  ASSERT_TRUE(q.has_value());
  Ran s = run(*q, *f.backend, f.memory);
  EXPECT_EQ(s.body["stop_reason"], "max_tokens");
  EXPECT_EQ(s.body["usage"]["output_tokens"], 2);
  // The session was reused: the second prompt is the first one's prefix.
  EXPECT_GT(s.body["usage"]["cache_read_input_tokens"].get<int>(), 0);
}

TEST(ServerStreamResponses, EventsItemsAndFinalResponse) {
  Fixture f("think</think>Calling." + weather_call());
  auto p =
      prepare_openai_responses(ordered_json::parse(R"({"model": "tiny", "stream": true, "input": "weather in Paris?",
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]})"),
                               *f.ctx);
  ASSERT_TRUE(p.has_value()) << p.error().message;
  Ran r = run(*p, *f.backend, f.memory);
  auto frames = parse_sse(r.sse);
  ASSERT_GE(frames.size(), 10u);
  int64_t seq = -1;
  std::vector<std::string> added;
  std::string reasoning, text, args, call_id;
  for (const auto& fr : frames) {
    auto j = fr.json();
    ASSERT_FALSE(j.is_discarded());
    EXPECT_EQ(j["type"], fr.event);
    EXPECT_EQ(j["sequence_number"].get<int64_t>(), seq + 1);
    seq = j["sequence_number"];
    if (fr.event == "response.output_item.added") {
      added.push_back(j["item"]["type"]);
      EXPECT_EQ(j["output_index"], added.size() - 1);
      if (j["item"]["type"] == "function_call") call_id = j["item"]["call_id"];
    }
    if (fr.event == "response.reasoning_text.delta") reasoning += j["delta"].get<std::string>();
    if (fr.event == "response.output_text.delta") text += j["delta"].get<std::string>();
    if (fr.event == "response.function_call_arguments.delta") args += j["delta"].get<std::string>();
    if (fr.event == "response.function_call_arguments.done") {
      EXPECT_EQ(j["arguments"], args);
    }
  }
  EXPECT_EQ(frames[0].event, "response.created");
  EXPECT_EQ(frames[0].json()["response"]["status"], "in_progress");
  EXPECT_EQ(frames[1].event, "response.in_progress");
  EXPECT_EQ(added, (std::vector<std::string>{"reasoning", "message", "function_call"}));
  EXPECT_EQ(reasoning, "think");
  EXPECT_EQ(text, "Calling.");
  EXPECT_EQ(args, R"({"city": "Paris", "days": 3})");
  EXPECT_TRUE(is_tool_id(call_id, "call_"));
  EXPECT_EQ(frames.back().event, "response.completed");
  auto resp = frames.back().json()["response"];
  EXPECT_EQ(resp["status"], "completed");
  ASSERT_EQ(resp["output"].size(), 3u);
  EXPECT_EQ(resp["output"][0]["content"][0]["text"], "think");
  EXPECT_EQ(resp["output"][1]["content"][0]["text"], "Calling.");
  EXPECT_EQ(resp["output"][2]["call_id"], call_id);
  EXPECT_EQ(resp["output"][2]["arguments"], args);
  EXPECT_EQ(resp["usage"]["output_tokens"], r.outcome.result.tokens.size());
  EXPECT_GT(resp["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
  EXPECT_EQ(r.body["output"].size(), 3u);
  EXPECT_EQ(r.body["output"][2]["call_id"], call_id);

  auto q = prepare_openai_responses(ordered_json::parse(R"({"input": "x", "max_output_tokens": 2})"), *f.ctx);
  ASSERT_TRUE(q.has_value());
  Ran s = run(*q, *f.backend, f.memory);
  EXPECT_EQ(s.body["status"], "incomplete");
  EXPECT_EQ(s.body["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(parse_sse(s.sse).back().event, "response.incomplete");
}

TEST(ServerStreamCompletions, RawTextChunksAndLegacyLogprobs) {
  Fixture f("once upon a time");
  auto p = prepare_openai_completions(
      ordered_json::parse(R"({"prompt": "Tell me", "stream": true, "max_tokens": 50, "logprobs": 2, "echo": true})"),
      *f.ctx);
  ASSERT_TRUE(p.has_value());
  Ran r = run(*p, *f.backend, f.memory);
  std::string text;
  std::string finish;
  for (const auto& fr : parse_sse(r.sse)) {
    if (fr.data == "[DONE]") continue;
    auto j = fr.json();
    EXPECT_EQ(j["object"], "text_completion");
    text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "Tell meonce upon a time");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(r.body["choices"][0]["text"], "Tell meonce upon a time");
  const auto& lp = r.body["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), r.outcome.result.tokens.size());
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 7);  // after the echoed prompt
}

TEST(ServerStreamOpenAI, LogprobsInBodyAndFinalChunk) {
  Fixture f("abc");
  auto p = prepare_openai_chat(
      body_with(R"("model": "deepseek-chat", "logprobs": true, "top_logprobs": 2, "stream": true)"), *f.ctx);
  ASSERT_TRUE(p.has_value());
  Ran r = run(*p, *f.backend, f.memory);
  const auto& lp = r.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), r.outcome.result.tokens.size());
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp[0]["logprob"], 0.0);
  EXPECT_TRUE(lp[0]["bytes"].is_array());
  auto frames = parse_sse(r.sse);
  auto last = frames[frames.size() - 2].json();
  EXPECT_EQ(last["choices"][0]["logprobs"]["content"].size(), lp.size());
}

TEST(ServerStreamOpenAI, IgnoreEosGeneratesToMaxTokensAndEosAddsNoText) {
  const std::string script = "Hi" + std::string(k_token_eos) + "there";
  {
    Fixture f(script);
    auto p = prepare_openai_chat(body_with(R"("model": "deepseek-chat", "max_tokens": 30)"), *f.ctx);
    ASSERT_TRUE(p.has_value());
    Ran r = run(*p, *f.backend, f.memory);
    EXPECT_EQ(r.body["choices"][0]["message"]["content"], "Hi");
    EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  }
  {
    Fixture f(script);
    auto p =
        prepare_openai_chat(body_with(R"("model": "deepseek-chat", "max_tokens": 30, "ignore_eos": true)"), *f.ctx);
    ASSERT_TRUE(p.has_value());
    Ran r = run(*p, *f.backend, f.memory);
    EXPECT_EQ(r.body["choices"][0]["message"]["content"], "Hithere");  // (the script then repeats EOS)
    EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r.body["usage"]["completion_tokens"], 30);
  }
  {
    Fixture f(script);
    auto p = prepare_anthropic_messages(ordered_json::parse(R"({"max_tokens": 12, "ignore_eos": true,
        "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": "x"}]})"),
                                        *f.ctx);
    ASSERT_TRUE(p.has_value());
    Ran r = run(*p, *f.backend, f.memory);
    EXPECT_EQ(r.body["content"][0]["text"], "Hithere");
    EXPECT_EQ(r.body["stop_reason"], "max_tokens");
    EXPECT_EQ(r.body["usage"]["output_tokens"], 12);
  }
  {
    Fixture f(script);
    auto p = prepare_openai_completions(ordered_json::parse(R"({"prompt": "x", "max_tokens": 9, "ignore_eos": true})"),
                                        *f.ctx);
    ASSERT_TRUE(p.has_value());
    Ran r = run(*p, *f.backend, f.memory);
    EXPECT_EQ(r.body["choices"][0]["text"], "Hithere");
    EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  }
  Fixture f(script);
  auto bad = prepare_openai_chat(body_with(R"("ignore_eos": "yes")"), *f.ctx);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("ignore_eos"), std::string::npos) << bad.error().message;
}

TEST(ServerToolPolicy, ToolChoiceNoneHandsABlockBackAsContent) {
  Fixture f("Sure." + weather_call());
  auto p = prepare_openai_chat(
      body_with(std::string(R"("model": "deepseek-chat", "tool_choice": "none", "stream": true, "tools": )") +
                k_tools_openai),
      *f.ctx);
  ASSERT_TRUE(p.has_value());
  Ran r = run(*p, *f.backend, f.memory);
  EXPECT_EQ(r.sse.find("tool_calls\":["), std::string::npos);
  const std::string content = r.body["choices"][0]["message"]["content"];
  EXPECT_EQ(content, "Sure." + weather_call());
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(r.body["choices"][0]["message"].contains("tool_calls"));
  std::string streamed;
  for (const auto& fr : parse_sse(r.sse))
    if (fr.data != "[DONE]" && fr.json()["choices"][0]["delta"].contains("content"))
      streamed += fr.json()["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(streamed, content);
  EXPECT_EQ(f.memory.size(), 0u);
}

TEST(ServerToolPolicy, ParallelToolCallsFalseKeepsTheFirstCall) {
  const std::string two = dsml("\n\n<|tool_calls>\n<|invoke name=\"get_weather\">\n") + string_param("city", "Paris") +
                          dsml("\n</|invoke>\n<|invoke name=\"get_time\">\n\n</|invoke>\n</|tool_calls>");
  Fixture f(two);
  auto p = prepare_openai_chat(
      body_with(std::string(R"("model": "deepseek-chat", "parallel_tool_calls": false, "stream": true, "tools": )") +
                k_tools_openai),
      *f.ctx);
  ASSERT_TRUE(p.has_value());
  Ran r = run(*p, *f.backend, f.memory);
  ASSERT_EQ(r.outcome.result.message.tool_calls.size(), 2u);
  ASSERT_EQ(r.body["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(r.body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.sse.find("get_time"), std::string::npos);
  EXPECT_EQ(f.memory.size(), 0u);  // the block holds a call the client never saw: no exact replay

  Fixture g(two);
  auto q =
      prepare_openai_chat(body_with(std::string(R"("model": "deepseek-chat", "tools": )") + k_tools_openai), *g.ctx);
  ASSERT_TRUE(q.has_value());
  Ran s = run(*q, *g.backend, g.memory);
  EXPECT_EQ(s.body["choices"][0]["message"]["tool_calls"].size(), 2u);
  EXPECT_EQ(g.memory.size(), 2u);
}

TEST(ServerToolPolicy, AMalformedBlockBecomesContentAndClosesOpenBlocks) {
  const std::string broken =
      dsml("\n\n<|tool_calls>\n<|invoke name=\"get_weather\">\n<|parameter name=\"city\" string=\"true\">Par");
  Fixture f("Hm." + broken);
  auto p = prepare_anthropic_messages(
      ordered_json::parse(R"({"max_tokens": 100, "stream": true, "thinking": {"type": "disabled"},
      "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]})"),
      *f.ctx);
  ASSERT_TRUE(p.has_value());
  Ran r = run(*p, *f.backend, f.memory);
  int starts = 0, stops = 0;
  for (const auto& fr : parse_sse(r.sse)) {
    if (fr.event == "content_block_start") ++starts;
    if (fr.event == "content_block_stop") ++stops;
  }
  EXPECT_EQ(starts, stops);
  EXPECT_EQ(r.body["stop_reason"], "end_turn");
  EXPECT_EQ(r.body["content"].size(), 1u);
  EXPECT_EQ(r.body["content"][0]["text"], "Hm." + broken);
}

TEST(ServerStreamErrors, StreamErrorFramesPerDialect) {
  Fixture f("x");
  ApiError e{ApiErrorKind::INVALID_OUTPUT, "bad json", "", ""};
  auto chat = prepare_openai_chat(body_with(""), *f.ctx);
  ASSERT_TRUE(chat.has_value());
  auto cf = parse_sse(chat->writer->stream_error(e));
  ASSERT_EQ(cf.size(), 2u);
  EXPECT_EQ(cf[0].json()["error"]["code"], "invalid_json_output");
  EXPECT_EQ(cf[1].data, "[DONE]");
  auto msg = prepare_anthropic_messages(
      ordered_json::parse(R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})"), *f.ctx);
  ASSERT_TRUE(msg.has_value());
  auto af = parse_sse(msg->writer->stream_error(e));
  ASSERT_EQ(af.size(), 1u);
  EXPECT_EQ(af[0].event, "error");
  EXPECT_EQ(af[0].json()["error"]["type"], "invalid_request_error");
  EXPECT_EQ(parse_sse(msg->writer->stream_keepalive())[0].event, "ping");
  auto resp = prepare_openai_responses(ordered_json::parse(R"({"input": "x"})"), *f.ctx);
  ASSERT_TRUE(resp.has_value());
  auto rf = parse_sse(resp->writer->stream_begin() + resp->writer->stream_error(e));
  EXPECT_EQ(rf.back().event, "response.failed");
  EXPECT_EQ(rf.back().json()["response"]["status"], "failed");
  EXPECT_EQ(rf.back().json()["response"]["error"]["code"], "invalid_json_output");
  EXPECT_TRUE(parse_sse(resp->writer->stream_keepalive())[0].comment);
}
