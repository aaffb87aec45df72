// The worker side: the job runner's phases (forced tool calls, thinking
// budgets), prompt reuse against the live session (token prefix and text
// prefix), the tool-call memory and exact replay, and the scheduler's queue,
// cancellation and draining. All on the scripted fake engine.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <thread>

#include "chat/render_official.h"
#include "runtime/job_runner.h"
#include "server/openai_chat.h"
#include "runtime/prompt_reuse.h"
#include "runtime/scheduler.h"
#include "server/metrics.h"
#include "server_test_util.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;
using namespace dsv4::server::test;
using ordered_json = nlohmann::ordered_json;

namespace {

JobOutcome run_collect(Backend& b, const JobInput& in, std::vector<DsmlEvent>* events = nullptr) {
  JobHooks h;
  h.on_event = [&](const DsmlEvent& e) {
    if (events) events->push_back(e);
  };
  h.cancelled = [] { return false; };
  return run_job(b, in, h);
}

ChatMessage user(const std::string& text) {
  ChatMessage m;
  m.role = ChatRole::USER;
  m.content = ChatContent::from_text(text);
  return m;
}

ChatTool tool(const std::string& name) {
  return ChatTool{name, ordered_json{{"name", name}, {"parameters", {{"type", "object"}}}}};
}

JobInput chat_job(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, ThinkingMode mode,
                  std::vector<ChatTool> tools = {}) {
  RenderOptions ro;
  ro.thinking_mode = mode;
  ro.tools = std::move(tools);
  JobInput in;
  in.rendered = *render_official(msgs, ro);
  in.prompt = *tok.encode_prompt(in.rendered);
  in.options.parse_chat = true;
  in.options.thinking = mode;
  in.options.sampling.temperature = 0;
  return in;
}

}  // namespace

TEST(ServerJobRunner, NamedToolChoiceForcesTheCall) {
  // The forced opener ends with `invoke name="get_weather">\n`; the model continues from there.
  auto b =
      make_backend({ScriptedReply{"", string_param("city", "Paris") + dsml("\n</|invoke>\n</|tool_calls>"), 0, 0}});
  JobInput in = chat_job(b->tokenizer(), {user("weather?")}, ThinkingMode::CHAT, {tool("get_weather")});
  in.forced_tool = ForcedTool::NAMED;
  in.forced_name = "get_weather";
  std::vector<DsmlEvent> events;
  JobOutcome o = run_collect(*b, in, &events);
  ASSERT_FALSE(o.error.has_value()) << o.error->message;
  const ParsedMessage& m = o.result.message;
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].name, "get_weather");
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(o.result.finish, FinishReason::TOOL_CALLS);
  EXPECT_EQ(m.raw_dsml, call_block("get_weather", string_param("city", "Paris")));
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().kind, DsmlEventKind::TOOL_CALL_START);
  EXPECT_EQ(events.front().text, "get_weather");
  // The engine saw the prompt plus the forced opener; completion tokens include the opener.
  const auto prompts = b->prompts();
  ASSERT_EQ(prompts.size(), 1u);
  auto opener = *b->tokenizer().encode_prompt(forced_tool_opener("get_weather"));
  ASSERT_EQ(prompts[0].size(), in.prompt.size() + opener.size());
  EXPECT_TRUE(std::equal(opener.begin(), opener.end(), prompts[0].end() - static_cast<std::ptrdiff_t>(opener.size())));
  EXPECT_EQ(o.result.tokens.size() >= opener.size(), true);
  // The live session ends at prompt + opener + the block the model closed.
  EXPECT_EQ(b->session_tokens().size(), in.prompt.size() + o.result.tokens.size());
}

TEST(ServerJobRunner, RequiredToolChoiceAfterReasoning) {
  // Phase R stops at </think>; phase C continues after the forced `invoke name="`.
  auto b = make_backend({
      ScriptedReply{"invoke name=\"", dsml("get_time\">\n\n</|invoke>\n</|tool_calls>"), 0, 0},
      ScriptedReply{"", "I need the time</think>ignored", 0, 0},
  });
  JobInput in = chat_job(b->tokenizer(), {user("time?")}, ThinkingMode::THINKING, {tool("get_time")});
  in.forced_tool = ForcedTool::ANY;
  std::vector<DsmlEvent> events;
  JobOutcome o = run_collect(*b, in, &events);
  ASSERT_FALSE(o.error.has_value());
  EXPECT_EQ(o.result.message.reasoning_content, "I need the time");
  ASSERT_EQ(o.result.message.tool_calls.size(), 1u);
  EXPECT_EQ(o.result.message.tool_calls[0].name, "get_time");
  EXPECT_EQ(o.result.message.tool_calls[0].arguments, "{}");
  EXPECT_EQ(o.result.finish, FinishReason::TOOL_CALLS);
  EXPECT_EQ(events.front().kind, DsmlEventKind::REASONING);
  const auto& tok = b->tokenizer();
  const size_t think_end =
      static_cast<size_t>(std::count(o.result.tokens.begin(), o.result.tokens.end(), tok.think_end()));
  EXPECT_EQ(think_end, 1u);
  EXPECT_GT(o.reasoning_tokens, 0u);
  EXPECT_EQ(o.result.text.find("I need the time</think>\n\n<"), 0u);
  // Exactly what a client sending the turn back renders: reasoning </think> content block EOS.
  EXPECT_EQ(o.result.message.raw_dsml, call_block("get_time", ""));
}

TEST(ServerJobRunner, ThinkingBudgetForcesTheEndOfReasoning) {
  auto b = make_backend({
      ScriptedReply{"</think>", "The answer.", 0, 0},
      ScriptedReply{"", "a very long line of reasoning that does not stop", 0, 0},
  });
  JobInput in = chat_job(b->tokenizer(), {user("q")}, ThinkingMode::THINKING);
  in.thinking_budget = 4;
  in.options.max_tokens = 100;
  JobOutcome o = run_collect(*b, in);
  ASSERT_FALSE(o.error.has_value());
  EXPECT_EQ(o.reasoning_tokens, 5u);  // 4 sampled + the forced </think>
  EXPECT_EQ(o.result.tokens[4], b->tokenizer().think_end());
  EXPECT_EQ(o.result.message.content, "The answer.");
  EXPECT_FALSE(o.result.message.reasoning_content.empty());
  EXPECT_EQ(o.result.finish, FinishReason::STOP);
  // Reasoning that ends within the budget: the reply simply continues after </think>.
  auto c = make_backend({ScriptedReply{"", "short</think>done", 0, 0}});
  JobInput in2 = chat_job(c->tokenizer(), {user("q")}, ThinkingMode::THINKING);
  in2.thinking_budget = 50;
  in2.options.max_tokens = 100;
  JobOutcome o2 = run_collect(*c, in2);
  EXPECT_EQ(o2.result.message.reasoning_content, "short");
  EXPECT_EQ(o2.result.message.content, "done");
}

TEST(ServerPromptReuse, TextPrefixReusesSampledTokens) {
  auto tok = make_tokenizer();
  RenderedPrompt p = {TextPiece{std::string(k_token_bos), true}, TextPiece{"Hello world, again", false},
                      TextPiece{std::string(k_token_eos), true}, TextPiece{"tail", false}};
  // The live session spelled "Hello world" one character at a time (not how BPE splits it).
  std::vector<int32_t> live = {tok->bos()};
  for (char ch : std::string("Hello world")) {
    auto t = tok->encode(std::string(1, ch));
    live.insert(live.end(), t.begin(), t.end());
  }
  const auto canonical = *tok->encode_prompt(p);
  ASSERT_NE(std::vector<int32_t>(canonical.begin(), canonical.begin() + 12), live)
      << "the test needs a non-canonical live session";
  PromptChoice c = choose_prompt_tokens(*tok, live, canonical, p);
  EXPECT_TRUE(c.stitched);
  EXPECT_EQ(c.reused, live.size());
  EXPECT_TRUE(std::equal(live.begin(), live.end(), c.tokens.begin()));
  EXPECT_EQ(tok->decode(c.tokens), rendered_text(p));
  // The suffix keeps its control token as one token.
  EXPECT_EQ(std::count(c.tokens.begin(), c.tokens.end(), tok->eos()), 1);

  // A special token where the prompt has text stops the match.
  std::vector<int32_t> forged = {tok->bos(), tok->eos()};
  RenderedPrompt q = {TextPiece{std::string(k_token_bos), true}, TextPiece{std::string(k_token_eos), false}};
  PromptChoice d = choose_prompt_tokens(*tok, forged, *tok->encode_prompt(q), q);
  EXPECT_EQ(d.reused, 1u);
  EXPECT_FALSE(d.stitched);
  // A diverging session falls back to the canonical tokens.
  PromptChoice e = choose_prompt_tokens(*tok, {tok->eos()}, canonical, p);
  EXPECT_EQ(e.tokens, canonical);
  EXPECT_EQ(e.reused, 0u);
  // Cutting inside a text piece.
  EXPECT_EQ(rendered_text(rendered_suffix(p, std::string(k_token_bos).size() + 6)),
            std::string("world, again") + std::string(k_token_eos) + "tail");
}

TEST(ServerToolMemory, IdsEvictionAndLookup) {
  ToolMemory m(3, 1 << 20);
  const std::string id = m.new_id("call_");
  EXPECT_TRUE(std::regex_match(id, std::regex("call_[0-9a-f]{32}")));
  EXPECT_NE(m.new_id("toolu_"), m.new_id("toolu_"));
  auto rec = [](std::vector<std::string> ids, std::string raw) {
    ToolCallRecord r;
    r.raw_dsml = std::move(raw);
    for (auto& i : ids) r.calls.push_back(ChatToolCall{i, "f", "{}"});
    return r;
  };
  m.remember(rec({"a", "b"}, "AB"));
  m.remember(rec({"c"}, "C"));
  EXPECT_EQ(m.size(), 3u);
  EXPECT_EQ(m.lookup({"a", "b"})->raw_dsml, "AB");
  EXPECT_EQ(m.lookup({"b", "a"})->raw_dsml, "AB");  // a set; the order is checked when replaying
  EXPECT_EQ(m.lookup({"a"}), nullptr);              // not the whole record
  EXPECT_EQ(m.lookup({"a", "c"}), nullptr);
  m.remember(rec({"d"}, "D"));  // 4 ids > 3: the least recently used record (C) goes
  EXPECT_EQ(m.lookup({"c"}), nullptr);
  EXPECT_NE(m.lookup({"a", "b"}), nullptr);
  EXPECT_NE(m.lookup({"d"}), nullptr);
  ToolMemory small(100, 1);  // byte limit: nothing fits
  small.remember(rec({"x"}, "X"));
  EXPECT_EQ(small.size(), 0u);
}

TEST(ServerToolMemory, ExactReplayRendersTheSampledBytesAndReusesTheSession) {
  // The model's block is non-canonical: minified JSON value, no JSON spaces.
  const std::string block =
      call_block("get_weather", string_param("city", "Paris") + "\n" +
                                    dsml("<|parameter name=\"opts\" string=\"false\">{\"u\":\"C\"}</|parameter>"));
  auto b = make_backend({ScriptedReply{"sunny", "Nice.", 0, 0}, ScriptedReply{"", "Checking." + block, 0, 0}});
  ToolMemory memory;
  ServeContext ctx{b->tokenizer(), 4096, ModelCatalog{"tiny", {}}, memory};
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}])";
  auto p1 = prepare_openai_chat(
      ordered_json::parse(R"({"model": "deepseek-chat", "messages": [{"role": "user", "content": "weather?"}], )" +
                          tools + "}"),
      ctx);
  ASSERT_TRUE(p1.has_value());
  std::vector<DsmlEvent> events;
  JobOutcome o1 = run_collect(*b, p1->job, &events);
  // Ids are handed out at the start events, as in the transport.
  ReplyAssembler a1(p1->policy, memory);
  std::vector<OutEvent> outs;
  for (const auto& e : events) a1.on_event(e, outs);
  FinalReply r1 = a1.finish(o1, outs);
  ASSERT_EQ(r1.calls.size(), 1u);
  const std::vector<int32_t> session_after_1 = b->session_tokens();

  // The client sends the turn back, re-serialising the arguments its own way.
  ordered_json history = ordered_json::parse(R"([{"role": "user", "content": "weather?"}])");
  history.push_back(
      {{"role", "assistant"},
       {"content", "Checking."},
       {"tool_calls",
        {{{"id", r1.calls[0].id},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", R"({"opts":{"u":"C"},"city":"Paris"})"}}}}}}});
  history.push_back({{"role", "tool"}, {"tool_call_id", r1.calls[0].id}, {"content", "sunny"}});
  ordered_json body = ordered_json::parse(std::string(R"({"model": "deepseek-chat", )") + tools + "}");
  body["messages"] = history;
  // Arguments in another key order still name the same call, but the block
  // renders the generated order: the replay keeps the model's bytes.
  auto p2 = prepare_openai_chat(body, ctx);
  ASSERT_TRUE(p2.has_value());
  const std::string text = rendered_text(p2->job.rendered);
  EXPECT_NE(text.find("Checking." + block + std::string(k_token_eos)), std::string::npos);
  JobOutcome o2 = run_collect(*b, p2->job);
  ASSERT_FALSE(o2.error.has_value());
  EXPECT_EQ(o2.result.message.content, "Nice.");
  EXPECT_EQ(o2.result.cached_tokens, session_after_1.size());  // everything the session held

  // Without the memory the canonical form is rendered and the block is prefilled again.
  ToolMemory empty;
  ServeContext ctx2{b->tokenizer(), 4096, ModelCatalog{"tiny", {}}, empty};
  auto p3 = prepare_openai_chat(body, ctx2);
  ASSERT_TRUE(p3.has_value());
  EXPECT_EQ(rendered_text(p3->job.rendered).find(block), std::string::npos);
  // Changed arguments are not the generated call: canonical rendering.
  ordered_json changed = body;
  changed["messages"][1]["tool_calls"][0]["function"]["arguments"] = R"({"city": "Rome"})";
  auto p4 = prepare_openai_chat(changed, ctx);
  ASSERT_TRUE(p4.has_value());
  EXPECT_EQ(rendered_text(p4->job.rendered).find(block), std::string::npos);
}

TEST(ServerScheduler, QueueLimitCancellationAndDrain) {
  auto b = make_backend({ScriptedReply{"", "one two three four five six seven eight nine ten", 20, 0}});
  Metrics metrics;
  Scheduler s(*b, 1, [&metrics](const JobOutcome& o) { metrics.job_done(o); });
  JobInput in = chat_job(b->tokenizer(), {user("go")}, ThinkingMode::CHAT);
  auto running = std::make_shared<Job>(in);
  ASSERT_EQ(s.submit(running), Scheduler::Admit::OK);
  // Wait until the worker took it and gave its prompt to the engine, so the queue is empty again.
  for (int i = 0; i < 400 && b->prompts().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(s.busy());
  ASSERT_EQ(b->prompts().size(), 1u);
  auto queued = std::make_shared<Job>(in);
  ASSERT_EQ(s.submit(queued), Scheduler::Admit::OK);
  EXPECT_EQ(s.submit(std::make_shared<Job>(in)), Scheduler::Admit::QUEUE_FULL);
  EXPECT_EQ(s.queue_depth(), 1u);
  // Cancelling the queued job finishes it without running it.
  queued->cancel = true;
  // Cancelling the running one stops it within a token.
  const auto t0 = std::chrono::steady_clock::now();
  running->cancel = true;
  std::vector<DsmlEvent> ev;
  while (!running->wait(ev, std::chrono::milliseconds(10))) {
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  EXPECT_EQ(running->outcome().result.finish, FinishReason::CANCELLED);
  EXPECT_LT(running->outcome().result.tokens.size(), 10u);
  while (!queued->wait(ev, std::chrono::milliseconds(10))) {
  }
  EXPECT_EQ(queued->outcome().result.finish, FinishReason::CANCELLED);
  EXPECT_EQ(b->prompts().size(), 1u);  // the queued job never reached the engine
  ASSERT_TRUE(s.wait_idle(std::chrono::seconds(2)));

  // A job after that completes, and the session reuse shows in the outcome.
  auto next = std::make_shared<Job>(in);
  ASSERT_EQ(s.submit(next), Scheduler::Admit::OK);
  while (!next->wait(ev, std::chrono::milliseconds(10))) {
  }
  EXPECT_EQ(next->outcome().result.finish, FinishReason::STOP);
  EXPECT_GT(next->outcome().result.cached_tokens, 0u);
  const std::string prom = metrics.prometheus(dsv4::server::RuntimeStatus{s.queue_depth(), s.running(), 1, 0, {}});
  EXPECT_NE(prom.find("dsv4_jobs_total{result=\"cancelled\"} 2"), std::string::npos) << prom;
  EXPECT_NE(prom.find("dsv4_jobs_total{result=\"ok\"} 1"), std::string::npos);
  EXPECT_NE(prom.find("dsv4_cache_hits_total 1"), std::string::npos);
  // Latencies: `next` sampled tokens (the cancelled running job may have, before it stopped).
  EXPECT_NE(prom.find("dsv4_time_to_first_token_seconds_count "), std::string::npos) << prom;
  EXPECT_EQ(prom.find("dsv4_time_to_first_token_seconds_count 0"), std::string::npos) << prom;
  EXPECT_NE(prom.find("dsv4_inter_token_seconds_bucket{le=\"+Inf\"}"), std::string::npos);

  s.drain();
  EXPECT_EQ(s.submit(std::make_shared<Job>(in)), Scheduler::Admit::STOPPING);
  s.stop();
}
