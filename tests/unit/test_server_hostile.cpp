// `dsv4 serve` against hostile local clients, on loopback with the scripted
// engine: request framing and the body limit for every transfer encoding,
// slow clients (read timeout; they hold no HTTP thread), connection caps,
// queue slots of clients that left, the keyless Host / Origin /
// Content-Type rules, API-key forms, metric labels that input cannot grow,
// log lines that input cannot forge, oversized prompts refused cheaply,
// and a shutdown that survives a failing backend.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "http_test_util.h"
#include "server/http_framing.h"
#include "server/http_transport.h"
#include "server/metrics.h"
#include "server_test_util.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;
using namespace dsv4::server::test;
using ordered_json = nlohmann::ordered_json;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const std::string k_chat = R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})";

ordered_json parse(const std::string& s) { return ordered_json::parse(s, nullptr, false); }

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return -1;
  return std::stoi(response.substr(9, 3));
}

// Everything until the peer closes (or the socket's 10 s read timeout).
std::string read_all(int fd) {
  std::string got;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

std::string post_head(const std::string& path, const std::string& extra) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra + "\r\n";
}

RequestFramer::State frame(const std::string& bytes, RequestFramer& f) { return f.feed(bytes); }

}  // namespace

// ---- framing (http_framing.h) ----

TEST(HttpFraming, ContentLengthChunkedAndNoBody) {
  FramingLimits lim;
  {
    RequestFramer f(lim);
    const std::string r = "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /next";
    ASSERT_EQ(frame(r, f), RequestFramer::State::COMPLETE);
    EXPECT_EQ(f.request_bytes(), r.find("GET /next"));
    EXPECT_EQ(f.method(), "GET");
    EXPECT_EQ(f.target(), "/health");
  }
  {
    RequestFramer f(lim);
    std::string r = "POST /v1/x HTTP/1.1\r\nContent-Length: 5\r\n\r\nab";
    EXPECT_EQ(frame(r, f), RequestFramer::State::INCOMPLETE);
    r += "cde";
    ASSERT_EQ(frame(r, f), RequestFramer::State::COMPLETE);
    EXPECT_EQ(f.request_bytes(), r.size());
  }
  {
    RequestFramer f(lim);
    std::string r = "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n";
    EXPECT_EQ(frame(r, f), RequestFramer::State::INCOMPLETE);
    r += "0\r\n";
    EXPECT_EQ(frame(r, f), RequestFramer::State::INCOMPLETE);
    r += "\r\nNEXT";
    ASSERT_EQ(frame(r, f), RequestFramer::State::COMPLETE);
    EXPECT_EQ(f.request_bytes(), r.size() - 4);
    EXPECT_EQ(f.body_bytes(), 3u);
  }
}

TEST(HttpFraming, LimitsHoldForEveryEncoding) {
  FramingLimits lim;
  lim.max_body_bytes = 1000;
  lim.max_head_bytes = 256;
  {
    RequestFramer f(lim);  // declared too large: refused before the body arrives
    EXPECT_EQ(frame("POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n", f), RequestFramer::State::BAD);
    EXPECT_EQ(f.status(), 413);
  }
  {
    RequestFramer f(lim);  // one chunk larger than the limit: refused at its size line
    EXPECT_EQ(frame("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3e9\r\n", f), RequestFramer::State::BAD);
    EXPECT_EQ(f.status(), 413);
  }
  {
    RequestFramer f(lim);  // many small chunks adding up past the limit
    std::string r = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
    RequestFramer::State st = RequestFramer::State::INCOMPLETE;
    for (int i = 0; i < 200 && st == RequestFramer::State::INCOMPLETE; ++i) {
      r += "a\r\n0123456789\r\n";
      st = frame(r, f);
    }
    EXPECT_EQ(st, RequestFramer::State::BAD);
    EXPECT_EQ(f.status(), 413);
    EXPECT_LE(f.body_bytes(), 1010u);
  }
  {
    RequestFramer f(lim);  // a huge chunk size cannot overflow
    EXPECT_EQ(frame("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffffffff\r\n", f),
              RequestFramer::State::BAD);
    EXPECT_EQ(f.status(), 413);
  }
  {
    RequestFramer f(lim);
    EXPECT_EQ(frame("GET / HTTP/1.1\r\nX: " + std::string(300, 'a'), f), RequestFramer::State::BAD);
    EXPECT_EQ(f.status(), 431);
  }
}

TEST(HttpFraming, AmbiguousFramingIsRefused) {
  FramingLimits lim;
  struct Case {
    std::string head;
    int status;
  };
  const std::vector<Case> cases = {
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"GET / HTTP/1.1\nHost: x\n\n", 400},
      {"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: a\x01b\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET /a b HTTP/1.1\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nExpect: something\r\n\r\n", 417},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nTrailer: x\r\n\r\n", 400},
  };
  for (const auto& c : cases) {
    RequestFramer f(lim);
    EXPECT_EQ(frame(c.head, f), RequestFramer::State::BAD) << c.head;
    EXPECT_EQ(f.status(), c.status) << c.head;
  }
}

// ---- body limit, over HTTP ----

TEST(ServerHostile, ChunkedBodiesMeetTheBodyLimitBeforeTheyAreRead) {
  ServerOptions o;
  o.max_body_bytes = size_t{1} << 20;
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  // A chunk that alone exceeds the limit: answered 413 at its size line,
  // without waiting for (or reading) its bytes.
  int fd = connect_to(s.port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd, post_head("/v1/chat/completions", "Transfer-Encoding: chunked\r\n") + "200000\r\n"));
  const auto t0 = Clock::now();
  std::string got = read_all(fd);
  ::close(fd);
  EXPECT_EQ(status_of(got), 413) << got;
  EXPECT_NE(got.find("request_too_large"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, 3s);

  // Small chunks adding up to 2 MiB of a well-formed request: 413 too, and
  // nothing reaches the engine.
  fd = connect_to(s.port);
  ASSERT_GE(fd, 0);
  std::string body =
      R"({"model": "tiny", "messages": [{"role": "user", "content": ")" + std::string(2u << 20, 'a') + "\"}]}";
  std::string req = post_head("/v1/chat/completions", "Transfer-Encoding: chunked\r\n");
  for (size_t i = 0; i < body.size(); i += 4096) {
    const std::string part = body.substr(i, 4096);
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", part.size());
    req += size + part + "\r\n";
  }
  req += "0\r\n\r\n";
  (void)send_all(fd, req);  // the server may stop reading (and close) before all of it is sent
  got = read_all(fd);
  ::close(fd);
  EXPECT_EQ(status_of(got), 413) << got.substr(0, 200);
  EXPECT_TRUE(s.backend->prompts().empty());
  EXPECT_TRUE(s.metrics_show("dsv4_requests_total{endpoint=\"/v1/chat/completions\",status=\"413\"} 2"));

  // A chunked body within the limit is served.
  fd = connect_to(s.port);
  ASSERT_GE(fd, 0);
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", k_chat.size());
  ASSERT_TRUE(send_all(fd, post_head("/v1/chat/completions", "Transfer-Encoding: chunked\r\nConnection: close\r\n") +
                               size + k_chat + "\r\n0\r\n\r\n"));
  got = read_all(fd);
  ::close(fd);
  EXPECT_EQ(status_of(got), 200) << got;
}

TEST(ServerHostile, OversizedPromptsAreRefusedWithoutTokenisingThemWhole) {
  Running s({}, {ScriptedReply{"", "ok", 0, 0}}, /*ctx=*/64);
  // 4 MB of text: far past any tokenisation of a 64-token context.
  const std::string big = std::string(4u << 20, 'a');
  ordered_json chat = {{"model", "tiny"}, {"messages", ordered_json::array({{{"role", "user"}, {"content", big}}})}};
  auto r = s.client().Post("/v1/chat/completions", chat.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(parse(r->body)["error"]["code"], "context_length_exceeded");
  EXPECT_NE(r->body.find("more than 64 tokens"), std::string::npos) << r->body;
  // Text that could fit by bytes but not by tokens: tokenised only past the context.
  ordered_json words = {{"model", "tiny"}, {"prompt", std::string(2000, ' ') + "x y z w v u t s r q p o n m l k"}};
  std::string many;
  for (int i = 0; i < 400; ++i) many += "w" + std::to_string(i) + " ";
  words["prompt"] = many;
  r = s.client().Post("/v1/completions", words.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("more than 64 tokens"), std::string::npos) << r->body;
  EXPECT_TRUE(s.backend->prompts().empty());
}

TEST(TokenizerStopAfter, StopsOncePastTheLimit) {
  auto tok = make_tokenizer();
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "word" + std::to_string(i) + " ";
  const auto all = tok->encode_with_specials(text);
  ASSERT_GT(all.size(), 200u);
  const auto some = tok->encode_with_specials(text, 100);
  EXPECT_GT(some.size(), 100u);
  EXPECT_LT(some.size(), 120u);
  EXPECT_TRUE(std::equal(some.begin(), some.end(), all.begin()));
  EXPECT_GE(tok->max_token_bytes(), 1u);
  for (size_t id = 0; id < tok->n_vocab(); ++id)
    EXPECT_LE(tok->token_bytes(static_cast<int32_t>(id)).size(), tok->max_token_bytes());
}

// ---- metrics labels ----

TEST(ServerHostile, MetricLabelsComeFromTheRouteTable) {
  ServerOptions o;
  o.api_key = "k";
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  httplib::Headers key = {{"Authorization", "Bearer k"}};
  auto c = s.client();
  for (int i = 0; i < 50; ++i) (void)c.Get(("/probe/" + std::to_string(i)).c_str(), key);
  // Unauthenticated, with a path that tries to close the label and add a series.
  (void)c.Get("/x%22%7D%20injected_total%201%0A%23", httplib::Headers{});
  auto metrics = [&] {
    auto r = s.client().Get("/metrics", key);
    return r ? r->body : std::string();
  };
  std::string before;
  for (int i = 0; i < 300 && before.find("status=\"401\"} 1") == std::string::npos; ++i) {
    std::this_thread::sleep_for(10ms);
    before = metrics();
  }
  for (int i = 50; i < 300; ++i) (void)c.Get(("/probe/" + std::to_string(i)).c_str(), key);
  const std::string after = metrics();
  EXPECT_EQ(after.find("injected"), std::string::npos);
  EXPECT_EQ(after.find("/probe/"), std::string::npos);
  EXPECT_NE(after.find("dsv4_requests_total{endpoint=\"other\",status=\"404\"}"), std::string::npos);
  EXPECT_NE(after.find("dsv4_requests_total{endpoint=\"other\",status=\"401\"} 1"), std::string::npos);
  // 250 more unique paths grew the exposition by a few digits at most.
  EXPECT_LT(after.size(), before.size() + 64);
  EXPECT_EQ(std::string(route_label("/v1/chat/completions?x=1")), "/v1/chat/completions");
  EXPECT_EQ(prometheus_escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

// ---- slow clients, connection caps ----

TEST(ServerHostile, SlowClientsHoldNoThreadAndTimeOut) {
  ServerOptions o;
  o.http_threads = 2;
  o.read_timeout_seconds = 1.5;
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  // 40 clients that send a header line every 200 ms, never finishing.
  std::vector<int> slow;
  for (int i = 0; i < 40; ++i) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
    slow.push_back(fd);
  }
  std::atomic<bool> trickle{true};
  std::thread dripper([&] {
    for (int n = 0; trickle; ++n) {
      for (int fd : slow) (void)send_all(fd, "X-Drip-" + std::to_string(n) + ": 1\r\n");
      std::this_thread::sleep_for(200ms);
    }
  });
  // /health and real requests stay fast meanwhile.
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    httplib::Client c("127.0.0.1", s.port);
    c.set_read_timeout(5, 0);
    auto h = c.Get("/health");
    ASSERT_TRUE(h) << "health did not answer with 40 slow clients connected";
    EXPECT_EQ(h->status, 200);
    // Held threads would block it until the slow clients time out (1.5 s);
    // the bound leaves room for sanitizer builds on a loaded machine.
    EXPECT_LT(Clock::now() - t0, 1200ms);
    auto r = c.Post("/v1/chat/completions", k_chat, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    std::this_thread::sleep_for(100ms);
  }
  // Each slow client is answered 408 and dropped once its read timeout passes.
  std::this_thread::sleep_for(1500ms);
  trickle = false;
  dripper.join();
  int timed_out = 0;
  for (int fd : slow) {
    const std::string got = read_all(fd);
    timed_out += status_of(got) == 408;
    ::close(fd);
  }
  EXPECT_EQ(timed_out, 40);
  EXPECT_TRUE(s.metrics_show("status=\"408\"} 40"));
}

TEST(ServerHostile, ConnectionsPerClientAreCapped) {
  ServerOptions o;
  o.max_client_connections = 4;
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connect_to(s.port));
  for (int fd : idle) ASSERT_GE(fd, 0);
  const int over = connect_to(s.port);
  ASSERT_GE(over, 0);
  const std::string got = read_all(over);
  ::close(over);
  EXPECT_EQ(status_of(got), 429) << got;
  EXPECT_NE(got.find("Retry-After: 1"), std::string::npos);
  EXPECT_NE(got.find("per client address"), std::string::npos);
  for (int fd : idle) ::close(fd);
  // The slots come back when the connections close.
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    auto h = s.client().Get("/health");
    served = h && h->status == 200;
    if (!served) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(served);
}

TEST(ServerHostile, UnfinishedBodiesHoldBoundedMemory) {
  ServerOptions o;
  o.max_body_bytes = size_t{4} << 20;
  o.max_buffered_bytes = size_t{2} << 20;
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  // Eight clients each declare a 4 MiB body and send all of it but the last
  // byte (32 MiB in all, non-blocking: a send that would block is the
  // server pushing back).
  std::vector<int> fds;
  const std::string head =
      post_head("/v1/chat/completions", "Content-Length: " + std::to_string(o.max_body_bytes) + "\r\n");
  const std::string chunk(64 << 10, 'a');
  for (int i = 0; i < 8; ++i) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, head));
    fds.push_back(fd);
  }
  for (int round = 0; round < 64; ++round)
    for (int fd : fds) (void)::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  std::this_thread::sleep_for(300ms);
  // Past the budget by at most one read round (1 MiB: the connection read while under it) and one 64 KiB
  // chunk per connection (a connection holding nothing yet still gets one, so that small requests get
  // through; which ones hold nothing when the budget is crossed depends on timing); 32 MiB did not get in.
  EXPECT_LE(s.http->buffered_request_bytes(),
            o.max_buffered_bytes + (size_t{1} << 20) + fds.size() * (size_t{64} << 10));
  // Small requests still get through.
  auto h = s.client().Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  for (int fd : fds) ::close(fd);
}

TEST(ServerHostile, PipelinedRequestsAndExpectContinue) {
  Running s({}, {ScriptedReply{"", "ok", 0, 0}});
  int fd = connect_to(s.port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(send_all(fd,
                       "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: "
                       "127.0.0.1\r\nConnection: close\r\n\r\n"));
  std::string got = read_all(fd);
  ::close(fd);
  EXPECT_NE(got.find("\"status\":\"ok\""), std::string::npos) << got;
  EXPECT_NE(got.find("\"object\":\"list\""), std::string::npos) << got;

  fd = connect_to(s.port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(
      send_all(fd, post_head("/v1/chat/completions", "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
                                                         std::to_string(k_chat.size()) + "\r\n")));
  got = read_until(fd, "\r\n\r\n");
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(send_all(fd, k_chat));
  got = read_all(fd);
  ::close(fd);
  EXPECT_EQ(status_of(got), 200) << got;
  EXPECT_EQ(got.find("100 Continue"), std::string::npos);  // answered once, by the transport
}

// ---- queue slots ----

TEST(ServerHostile, AQueuedClientThatLeftGivesItsSlotBack) {
  ServerOptions o;
  o.max_queue = 1;
  Running s(o, {ScriptedReply{"", "one two three four five six seven eight nine ten eleven twelve thirteen", 25, 0}});
  auto running = std::async(std::launch::async,
                            [&] { return s.client().Post("/v1/chat/completions", k_chat, "application/json"); });
  for (int i = 0; i < 200 && !s.http->runtime().busy(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(s.http->runtime().busy());
  const int fd = open_request(s.port, "/v1/chat/completions", k_chat);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 200 && s.http->runtime().queue_depth() == 0; ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(s.http->runtime().queue_depth(), 1u);
  ::close(fd);
  // The slot is free well before the running job ends (42 tokens, ~1 s).
  for (int i = 0; i < 100 && s.http->runtime().queue_depth() != 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(s.http->runtime().queue_depth(), 0u);
  auto next = s.client().Post("/v1/chat/completions", k_chat, "application/json");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200) << next->body;
  EXPECT_EQ(running.get()->status, 200);
  EXPECT_TRUE(s.metrics_show("dsv4_jobs_total{result=\"cancelled\"} 1"));
}

// ---- keyless rules: Host, Origin, Content-Type ----

TEST(ServerHostile, KeylessServerAnswersOnlyItsOwnHostAndOrigin) {
  ServerOptions o;
  o.allowed_hosts = {"dsv4.internal"};
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  auto c = s.client();
  const std::string port = std::to_string(s.port);
  auto with_host = [&](const std::string& host) {
    return c.Post("/v1/chat/completions", httplib::Headers{{"Host", host}}, k_chat, "application/json");
  };
  for (const std::string& host : std::vector<std::string>{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST",
                                                          "[::1]:" + port, "dsv4.internal"}) {
    auto r = with_host(host);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << host;
  }
  for (const std::string& host :
       std::vector<std::string>{"evil.example:" + port, "evil.example", "127.0.0.1.evil.example", "10.1.2.3"}) {
    auto r = with_host(host);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 403) << host;
    EXPECT_EQ(parse(r->body)["error"]["code"], "permission_denied");
  }
  auto g = c.Get("/health", httplib::Headers{{"Host", "rebound.example"}});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 403);
  // A page of another origin (browsers send Origin on cross-origin POSTs).
  auto x =
      c.Post("/v1/chat/completions", httplib::Headers{{"Origin", "https://evil.example"}}, k_chat, "application/json");
  ASSERT_TRUE(x);
  EXPECT_EQ(x->status, 403);
  auto m = c.Post("/v1/messages", httplib::Headers{{"Origin", "null"}},
                  R"({"model": "tiny", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})",
                  "application/json");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 403);
  EXPECT_EQ(parse(m->body)["error"]["type"], "permission_error");
  // A "simple" cross-site POST needs no preflight: it must not be served.
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"}) {
    auto t = c.Post("/v1/chat/completions", k_chat, type);
    ASSERT_TRUE(t);
    EXPECT_EQ(t->status, 415) << type;
  }
  auto cnt = c.Post("/v1/messages/count_tokens", R"({"messages": [{"role": "user", "content": "x"}]})", "text/plain");
  ASSERT_TRUE(cnt);
  EXPECT_EQ(cnt->status, 415);
  auto ok = c.Post("/v1/chat/completions", k_chat, "application/json; charset=utf-8");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(s.backend->prompts().size() == 6);  // the five allowed hosts and the charset request
}

TEST(ServerHostile, CorsOriginAndApiKeyLiftTheKeylessRules) {
  {
    ServerOptions o;
    o.cors_origin = "http://localhost:3000";
    Running s(o, {ScriptedReply{"", "ok", 0, 0}});
    auto c = s.client();
    auto ok = c.Post("/v1/chat/completions", httplib::Headers{{"Origin", "http://localhost:3000"}}, k_chat,
                     "application/json");
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->status, 200);
    auto bad = c.Post("/v1/chat/completions", httplib::Headers{{"Origin", "http://localhost:3001"}}, k_chat,
                      "application/json");
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 403);
  }
  {
    ServerOptions o;
    o.api_key = "secret";
    Running s(o, {ScriptedReply{"", "ok", 0, 0}});
    auto c = s.client();
    auto r =
        c.Post("/v1/chat/completions",
               httplib::Headers{{"Host", "api.example"}, {"Origin", "https://app.example"}, {"x-api-key", "secret"}},
               k_chat, "text/plain");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
}

TEST(ServerHostile, ApiKeyFormsAndSchemes) {
  ServerOptions o;
  o.api_key = "secret";
  Running s(o, {ScriptedReply{"", "ok", 0, 0}});
  auto c = s.client();
  auto get = [&](httplib::Headers h) {
    auto r = c.Get("/v1/models", h);
    return r ? r->status : -1;
  };
  EXPECT_EQ(get({{"Authorization", "BEARER secret"}}), 200);
  EXPECT_EQ(get({{"Authorization", "bEaReR   secret"}}), 200);
  EXPECT_EQ(get({{"x-api-key", "wrong"}, {"Authorization", "Bearer secret"}}), 200);
  EXPECT_EQ(get({{"x-api-key", "secret"}, {"Authorization", "Bearer wrong"}}), 200);
  EXPECT_EQ(get({{"x-api-key", "wrong"}, {"Authorization", "Bearer wrong"}}), 401);
  EXPECT_EQ(get({{"Authorization", "Basic secret"}}), 401);
  EXPECT_EQ(get({}), 401);
}

// ---- the request log ----

TEST(ServerHostile, LogLinesCannotBeForged) {
  Running s({}, {ScriptedReply{"", "one two three four five six seven eight nine ten", 30, 0}});
  testing::internal::CaptureStderr();
  auto c = s.client();
  (void)c.Get("/v1/models%0D%0Adsv4: GET /forged 200 1 ms%1B[31m");
  (void)c.Post("/v1/chat/completions",
               R"({"model": "x\r\ndsv4: POST /forged 200", "messages": [{"role": "user", "content": "hi"}]})",
               "application/json");
  // A stream whose client leaves after a few tokens logs the tokens it got.
  const int fd = open_request(s.port, "/v1/chat/completions",
                              R"({"model": "tiny", "stream": true, "messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_GE(fd, 0);
  std::string got;
  while (std::count(got.begin(), got.end(), '\n') < 12) {
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  std::this_thread::sleep_for(1500ms);  // the cancelled job's log line follows within a token
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log.find("\ndsv4: GET /forged"), std::string::npos) << log;
  EXPECT_EQ(log.find("\ndsv4: POST /forged"), std::string::npos) << log;
  EXPECT_EQ(log.find('\x1b'), std::string::npos);
  EXPECT_NE(log.find("\\x0d\\x0a"), std::string::npos) << log;
  const size_t line = log.find("client disconnected");
  ASSERT_NE(line, std::string::npos) << log;
  const size_t start = log.rfind('\n', line);
  const std::string entry = log.substr(start + 1, line - start);
  EXPECT_EQ(entry.find("completion=0"), std::string::npos) << entry;
  EXPECT_NE(entry.find("completion="), std::string::npos) << entry;
}

// ---- shutdown ----

namespace {

// The scripted engine whose session save at shutdown fails.
class FailingShutdownBackend final : public Backend {
 public:
  explicit FailingShutdownBackend(std::unique_ptr<ScriptedBackend> inner) : inner_(std::move(inner)) {}
  const Tokenizer& tokenizer() const override { return inner_->tokenizer(); }
  uint32_t context_size() const override { return inner_->context_size(); }
  std::string describe() const override { return inner_->describe(); }
  const std::vector<int32_t>& session_tokens() const override { return inner_->session_tokens(); }
  expected<GenerateResult> generate(JobSlot& job, std::span<const int32_t> prompt, const GenerateOptions& options,
                                    const GenerateCallbacks& hooks) override {
    return inner_->generate(job, prompt, options, hooks);
  }
  void shutdown(bool) override { throw std::runtime_error("disk full while saving the sessions"); }

 private:
  std::unique_ptr<ScriptedBackend> inner_;
};

}  // namespace

TEST(ServerHostile, ShutdownSurvivesAFailingSessionSave) {
  FailingShutdownBackend backend(make_backend({ScriptedReply{"", "ok", 0, 0}}));
  ServerOptions o;
  o.port = 0;
  o.model_id = "tiny";
  HttpServer http(o, backend);
  ASSERT_TRUE(http.bind().has_value());
  std::thread serving([&] { (void)http.serve(); });
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(http.shutdown(false));
  serving.join();  // the listener stopped although the save failed
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("disk full while saving the sessions"), std::string::npos) << log;
}
