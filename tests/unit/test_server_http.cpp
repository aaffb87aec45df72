// The HTTP transport on loopback with the scripted fake engine: routes,
// authentication, CORS, error shapes for bad input, the body limit, the
// queue limit (503 + Retry-After), cancellation when a client disconnects
// (queued, prefilling, decoding), SSE keepalive, concurrency and graceful
// shutdown.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <regex>
#include <thread>

#include "http_test_util.h"
#include "server/http_server.h"
#include "server_test_util.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;
using namespace dsv4::server::test;
using ordered_json = nlohmann::ordered_json;
using namespace std::chrono_literals;

namespace {

const std::string k_chat = R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})";
const std::string k_chat_stream =
    R"({"model": "tiny", "stream": true, "messages": [{"role": "user", "content": "hi"}]})";
const std::string k_messages_stream =
    R"({"model": "tiny", "max_tokens": 100, "stream": true, "messages": [{"role": "user", "content": "hi"}]})";

ordered_json parse(const std::string& s) { return ordered_json::parse(s, nullptr, false); }

std::vector<ScriptedReply> slow_reply(int token_ms, int prefill_ms = 0) {
  return {ScriptedReply{"", "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen",
                        token_ms, prefill_ms}};
}

}  // namespace

TEST(ServerHttp, HealthModelsAndMetrics) {
  Running s({}, {ScriptedReply{"", "hello", 0, 0}});
  auto c = s.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  auto j = parse(m->body);
  EXPECT_EQ(j["object"], "list");
  std::vector<std::string> ids;
  for (const auto& d : j["data"]) ids.push_back(d["id"]);
  EXPECT_EQ(ids, (std::vector<std::string>{"tiny", "deepseek-v4-flash", "deepseek-chat", "deepseek-reasoner"}));
  auto am = c.Get("/v1/models", {{"anthropic-version", "2023-06-01"}});
  ASSERT_TRUE(am);
  auto aj = parse(am->body);
  EXPECT_EQ(aj["data"][0]["type"], "model");
  EXPECT_EQ(aj["has_more"], false);
  EXPECT_TRUE(s.metrics_show("dsv4_requests_total{endpoint=\"/health\",status=\"200\"} 1"));
  auto r = c.Post("/v1/chat/completions", k_chat, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
  EXPECT_TRUE(s.metrics_show("dsv4_completion_tokens_total"));
  const std::string prom = s.metrics();
  for (const char* name :
       {"dsv4_prompt_tokens_total", "dsv4_cached_prompt_tokens_total", "dsv4_prefill_tokens_per_second",
        "dsv4_decode_tokens_per_second", "dsv4_queue_depth 0", "dsv4_cache_hits_total", "dsv4_jobs_running"})
    EXPECT_NE(prom.find(name), std::string::npos) << name;
}

TEST(ServerHttp, StreamsWithSseHeadersAndFraming) {
  Running s({}, {ScriptedReply{"", "plan</think>answer", 0, 0}});
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", k_chat_stream, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(r->get_header_value("Cache-Control"), "no-cache");
  auto frames = parse_sse(r->body);
  ASSERT_GE(frames.size(), 3u);
  EXPECT_EQ(frames.back().data, "[DONE]");
  auto a = c.Post("/v1/messages", k_messages_stream, "application/json");
  ASSERT_TRUE(a);
  auto af = parse_sse(a->body);
  ASSERT_GE(af.size(), 4u);
  EXPECT_EQ(af.front().event, "message_start");
  EXPECT_EQ(af.back().event, "message_stop");
}

TEST(ServerHttp, ApiKeyOnEveryEndpointButHealth) {
  ServerOptions o;
  o.api_key = "sekret";
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  auto c = s.client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto no_key = c.Get("/v1/models");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(parse(no_key->body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(no_key->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(c.Get("/metrics")->status, 401);
  auto anth = c.Post("/v1/messages", k_messages_stream, "application/json");
  ASSERT_TRUE(anth);
  EXPECT_EQ(anth->status, 401);
  EXPECT_EQ(parse(anth->body)["type"], "error");
  EXPECT_EQ(parse(anth->body)["error"]["type"], "authentication_error");
  auto wrong = c.Get("/v1/models", {{"Authorization", "Bearer sekreT"}});
  EXPECT_EQ(wrong->status, 401);
  EXPECT_NE(parse(wrong->body)["error"]["message"].get<std::string>().find("invalid"), std::string::npos);
  EXPECT_EQ(c.Get("/v1/models", {{"Authorization", "Bearer sekret"}})->status, 200);
  EXPECT_EQ(c.Get("/v1/models", {{"x-api-key", "sekret"}})->status, 200);
  auto chat = c.Post("/v1/chat/completions", {{"Authorization", "Bearer sekret"}}, k_chat, "application/json");
  ASSERT_TRUE(chat);
  EXPECT_EQ(chat->status, 200);
}

TEST(ServerHttp, CorsIsOptIn) {
  {
    Running s({}, {ScriptedReply{"", "ok", 0, 0}});
    auto r = s.client().Get("/health");
    EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  }
  ServerOptions o;
  o.cors_origin = "http://localhost:3000";
  o.api_key = "k";
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  auto c = s.client();
  auto pre = c.Options("/v1/chat/completions");
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);  // preflights need no key
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("x-api-key"), std::string::npos);
  auto r = c.Get("/health");
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "http://localhost:3000");
}

TEST(ServerHttp, BadInputGetsDialectErrorsAndTheServerStaysHealthy) {
  ServerOptions o;
  o.max_body_bytes = 8192;
  Running s(o, {ScriptedReply{"", "ok", 0, 0}}, /*ctx=*/256);
  auto c = s.client();
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* needle;
  };
  const std::string long_prompt = R"({"messages": [{"role": "user", "content": ")" + std::string(1500, 'z') + R"("}]})";
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400, "invalid JSON"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": "warm"})", 400,
       "temperature"},
      {"/v1/chat/completions", R"({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]})", 404, "gpt-4o"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "empty"},
      {"/v1/chat/completions", long_prompt, 400, "context length"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "n": 40})", 400, "at most 16"},
      {"/v1/chat/completions", std::string(10000, ' '), 413, "limit"},
      {"/v1/completions", R"({"prompt": 7})", 400, "prompt"},
      {"/v1/responses", R"({"input": "x", "previous_response_id": "r"})", 400, "previous_response_id"},
      {"/v1/messages", "[]", 400, "JSON object"},
      {"/v1/messages", R"({"messages": [{"role": "user", "content": "x"}]})", 400, "max_tokens"},
      {"/v1/messages/count_tokens", "nope", 400, "invalid JSON"},
      {"/v1/nothing", "{}", 404, "no route"},
  };
  for (const auto& k : cases) {
    auto r = c.Post(k.path, k.body, "application/json");
    ASSERT_TRUE(r) << k.path;
    EXPECT_EQ(r->status, k.status) << k.path << " " << k.body.substr(0, 60);
    auto j = parse(r->body);
    ASSERT_FALSE(j.is_discarded()) << r->body;
    const bool anthropic = std::string(k.path).rfind("/v1/messages", 0) == 0;
    const std::string msg = anthropic ? j["error"]["message"] : j["error"]["message"];
    if (anthropic) {
      EXPECT_EQ(j["type"], "error");
    } else {
      EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("code"));
    }
    EXPECT_NE(msg.find(k.needle), std::string::npos) << k.path << ": " << msg;
  }
  auto too_long = c.Post("/v1/chat/completions", long_prompt, "application/json");
  EXPECT_EQ(parse(too_long->body)["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(c.Get("/health")->status, 200);
  auto ok = c.Post("/v1/chat/completions", k_chat, "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST(ServerHttp, FullQueueAnswers503WithRetryAfter) {
  ServerOptions o;
  o.max_queue = 1;
  Running s(o, slow_reply(10));
  auto first = std::async(std::launch::async,
                          [&] { return s.client().Post("/v1/chat/completions", k_chat, "application/json"); });
  for (int i = 0; i < 200 && !s.http->runtime().busy(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(s.http->runtime().busy());
  auto second = std::async(std::launch::async,
                           [&] { return s.client().Post("/v1/chat/completions", k_chat, "application/json"); });
  for (int i = 0; i < 200 && s.http->runtime().queue_depth() == 0; ++i) std::this_thread::sleep_for(5ms);
  auto third = s.client().Post("/v1/chat/completions", k_chat, "application/json");
  ASSERT_TRUE(third);
  EXPECT_EQ(third->status, 503);
  EXPECT_EQ(third->get_header_value("Retry-After"), "1");
  EXPECT_EQ(parse(third->body)["error"]["code"], "overloaded");
  auto m3 = s.client().Post("/v1/messages", R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})",
                            "application/json");
  EXPECT_EQ(m3->status, 503);
  EXPECT_EQ(parse(m3->body)["error"]["type"], "overloaded_error");
  EXPECT_EQ(first.get()->status, 200);
  EXPECT_EQ(second.get()->status, 200);
}

TEST(ServerHttp, DisconnectCancelsDecodingPrefillingAndQueuedWork) {
  ServerOptions o;
  o.max_queue = 4;
  Running s(o, {ScriptedReply{"prefill", "x y z", 0, 5000},
                ScriptedReply{"", "one two three four five six seven eight nine ten eleven twelve", 40, 0}});
  // Decoding: hang up after the first frame of a stream.
  int fd = open_request(s.port, "/v1/chat/completions", k_chat_stream);
  ASSERT_GE(fd, 0);
  std::string got = read_until(fd, "data: ");
  ASSERT_NE(got.find("200 OK"), std::string::npos);
  const auto t0 = std::chrono::steady_clock::now();
  ::close(fd);
  EXPECT_TRUE(s.metrics_show("dsv4_jobs_total{result=\"cancelled\"} 1", 2000ms));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);  // the whole reply (38 tokens) takes 1.5 s

  // Prefilling (a long simulated prefill), plain request: hang up while waiting.
  const std::string prefill_body = R"({"model": "tiny", "messages": [{"role": "user", "content": "prefill"}]})";
  fd = open_request(s.port, "/v1/chat/completions", prefill_body);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 200 && !s.http->runtime().busy(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(s.http->runtime().busy());
  const auto t1 = std::chrono::steady_clock::now();
  ::close(fd);
  EXPECT_TRUE(s.metrics_show("dsv4_jobs_total{result=\"cancelled\"} 2", 2000ms));
  EXPECT_LT(std::chrono::steady_clock::now() - t1, 1000ms);

  // Queued: a request waiting behind a running one never reaches the engine. The runtime reports busy before the
  // backend has seen the running request's prompt, so wait for the prompt itself.
  const size_t prompts_before = s.backend->prompts().size() + 1;  // the cancelled two and the running one
  auto running = std::async(std::launch::async,
                            [&] { return s.client().Post("/v1/chat/completions", k_chat, "application/json"); });
  for (int i = 0; i < 400 && s.backend->prompts().size() < prompts_before; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(s.http->runtime().busy());
  ASSERT_EQ(s.backend->prompts().size(), prompts_before);
  fd = open_request(s.port, "/v1/chat/completions", prefill_body);
  for (int i = 0; i < 200 && s.http->runtime().queue_depth() == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(s.http->runtime().queue_depth(), 1u);
  ::close(fd);
  auto r = running.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(s.metrics_show("dsv4_jobs_total{result=\"cancelled\"} 3", 3000ms));
  EXPECT_EQ(s.backend->prompts().size(), prompts_before);  // only the running request was generated
  // And the server keeps serving.
  auto after = s.client().Post("/v1/chat/completions", k_chat, "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

TEST(ServerHttp, KeepaliveDuringALongPrefill) {
  ServerOptions o;
  o.keepalive_seconds = 0.05;
  Running s(o, {ScriptedReply{"", "done", 0, 400}});
  auto c = s.client();
  auto r = c.Post("/v1/chat/completions", k_chat_stream, "application/json");
  ASSERT_TRUE(r);
  int comments = 0;
  for (const auto& f : parse_sse(r->body)) comments += f.comment;
  EXPECT_GE(comments, 3);
  EXPECT_EQ(parse_sse(r->body).back().data, "[DONE]");
  auto a = c.Post("/v1/messages", k_messages_stream, "application/json");
  ASSERT_TRUE(a);
  int pings = 0;
  for (const auto& f : parse_sse(a->body)) pings += f.event == "ping";
  EXPECT_GE(pings, 3);
}

TEST(ServerHttp, ConcurrentClientsAllComplete) {
  ServerOptions o;
  o.max_queue = 16;
  Running s(o, {ScriptedReply{"", "a short reply to everyone", 1, 0}});
  std::vector<std::future<int>> done;
  for (int i = 0; i < 12; ++i) {
    done.push_back(std::async(std::launch::async, [&, i] {
      auto c = s.client();
      const std::string path = i % 3 == 0 ? "/v1/messages" : i % 3 == 1 ? "/v1/chat/completions" : "/v1/responses";
      std::string body = i % 3 == 0   ? k_messages_stream
                         : i % 3 == 1 ? k_chat_stream
                                      : std::string(R"({"input": "hello )") + std::to_string(i) + R"(", "stream": )" +
                                            (i % 2 ? "true" : "false") + "}";
      auto r = c.Post(path, body, "application/json");
      return r ? r->status : -1;
    }));
  }
  for (auto& f : done) EXPECT_EQ(f.get(), 200);
  EXPECT_EQ(s.http->runtime().queue_depth(), 0u);
}

TEST(ServerHttp, GracefulShutdownFinishesInFlightRequests) {
  ServerOptions o;
  o.shutdown_grace_seconds = 10;
  auto s = std::make_unique<Running>(o, slow_reply(20));
  auto stream = std::async(std::launch::async,
                           [&] { return s->client().Post("/v1/chat/completions", k_chat_stream, "application/json"); });
  for (int i = 0; i < 200 && !s->http->runtime().busy(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(s->http->runtime().busy());
  auto stopper = std::async(std::launch::async, [&] { s->http->shutdown(false); });
  std::this_thread::sleep_for(50ms);
  auto refused = s->client().Post("/v1/chat/completions", k_chat, "application/json");
  if (refused) {  // the listener may already be closed; if not, new work is refused
    EXPECT_EQ(refused->status, 503);
  }
  auto r = stream.get();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  auto frames = parse_sse(r->body);
  ASSERT_GE(frames.size(), 2u);
  EXPECT_EQ(frames.back().data, "[DONE]");
  EXPECT_EQ(frames[frames.size() - 2].json()["choices"][0]["finish_reason"], "stop");
  stopper.get();
  s->thread.join();  // serve() returned
  s->thread = std::thread([] {});
}
