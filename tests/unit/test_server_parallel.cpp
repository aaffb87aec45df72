// `dsv4 serve --parallel N` on the synthetic tiny model (CPU), through HTTP
// on loopback: concurrent streaming requests are all streaming before the
// first one finishes, and each gives exactly the text (and logprobs) it gives
// on a server that runs one request at a time; with a session memory budget
// for two sessions, four concurrent requests still all complete, two at a
// time (KV admission), with the same replies; /metrics shows the batched steps;
// OpenAI n > 1 gives the n seeded single replies as its choices, prefilling
// the prompt once; parallel
// requests save their prompts to the disk KV cache and restore them after a
// restart, with the same replies; with MTP proposals (--mtp, --draft), one at a time or two at once
// (verify passes inside the batched steps), the same replies, and /metrics counts the verify passes.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "dsv4/engine.h"
#include "http_test_util.h"
#include "kv_test_util.h"
#include "runtime/engine_backend.h"
#include "server/http_server.h"
#include "server_test_util.h"
#include "synth/synth.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;
using ordered_json = nlohmann::ordered_json;
using clock_type = std::chrono::steady_clock;

namespace {

std::unique_ptr<Engine> load_engine(const std::string& mtp = "") {
  EngineOptions o;
  o.mtp_path = mtp;
  o.synthetic = "tiny";
  o.synthetic_seed = 3;
  o.backend = BackendChoice::CPU;
  o.ctx = 1024;
  o.prefill_batch = 128;
  o.show_progress = false;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
  return e ? std::move(*e) : nullptr;
}

struct Served {
  std::unique_ptr<EngineBackend> backend;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  Served(size_t parallel, uint64_t session_memory_mb = 0, const std::string& disk_dir = "", const std::string& mtp = "",
         int draft = 0) {
    KvCacheOptions c;
    c.session_memory_mb = session_memory_mb;
    if (!disk_dir.empty()) {
      c.disk_dir = disk_dir;
      c.min_tokens = 64;
      c.frontier = 0;
      c.write_queue = 16;
    }
    BatchingOptions b;
    b.parallel = parallel;
    b.step_tokens = 32;  // prompts take several steps, between the others' decode rows
    b.draft = draft;
    auto eb = EngineBackend::create(load_engine(mtp), 1024, c, b);
    EXPECT_TRUE(eb.has_value()) << (eb ? "" : eb.error().message);
    backend = std::move(*eb);
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_id = "tiny";
    o.parallel = parallel;
    http = std::make_unique<HttpServer>(o, *backend);
    EXPECT_TRUE(http->bind().has_value());
    port = http->port();
    thread = std::thread([this] { (void)http->serve(); });
  }
  ~Served() {
    http->shutdown(true);
    thread.join();
  }
  ordered_json post(const ordered_json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return ordered_json::parse(r->body, nullptr, false);
  }
  std::string metrics() const {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/metrics");
    return r ? r->body : "";
  }
};

double metric(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + name.size() + 1));
    ++at;
  }
  return -1;
}

ordered_json chat(int i, int max_tokens, bool stream) {
  ordered_json b = {
      {"model", "deepseek-chat"},  // thinking off: the client's sampling applies
      {"max_tokens", max_tokens},
      {"temperature", i % 2 == 0 ? 0.0 : 0.9},
      {"seed", 100 + i},
      {"stream", stream},
      {"messages", ordered_json::array({{{"role", "user"},
                                         {"content", "request number " + std::to_string(i) + " " +
                                                         std::string(static_cast<size_t>(i) * 7, 'x')}}})}};
  if (!stream) {
    b["logprobs"] = true;
    b["top_logprobs"] = 2;
  }
  return b;
}

// A streamed reply: the content deltas, when its first delta and its end arrived.
struct Stream {
  std::string content;
  clock_type::time_point first, done;
};

Stream stream_chat(int port, const ordered_json& body) {
  Stream s;
  const int fd = dsv4::server::test::connect_to(port);
  EXPECT_GE(fd, 0);
  if (fd < 0) return s;
  const std::string b = body.dump();
  const std::string req =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(b.size()) + "\r\nConnection: close\r\n\r\n" + b;
  EXPECT_TRUE(dsv4::server::test::send_all(fd, req));
  std::string got;
  char buf[4096];
  size_t scanned = 0;
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
    if (s.first == clock_type::time_point{} && got.find("content\":\"", scanned) != std::string::npos)
      s.first = clock_type::now();
    scanned = got.size() > 16 ? got.size() - 16 : 0;
    if (got.find("data: [DONE]") != std::string::npos) break;
  }
  s.done = clock_type::now();
  ::close(fd);
  for (const auto& f : dsv4::server::test::parse_sse(got.substr(got.find("\r\n\r\n") + 4))) {
    if (f.data == "[DONE]") continue;
    auto j = ordered_json::parse(f.data, nullptr, false);
    if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
    const auto& d = j["choices"][0]["delta"];
    for (const char* k : {"reasoning_content", "content"})
      if (d.contains(k) && d[k].is_string()) s.content += d[k].get<std::string>();
  }
  return s;
}

}  // namespace

TEST(ServerParallel, ConcurrentStreamsOverlapAndEqualTheSerialReplies) {
  constexpr int n = 4;
  std::vector<std::string> serial(n);
  {
    Served one(1);
    for (int i = 0; i < n; ++i) serial[i] = stream_chat(one.port, chat(i, 40, true)).content;
  }
  Served s(n);
  std::vector<Stream> got(n);
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) clients.emplace_back([&, i] { got[i] = stream_chat(s.port, chat(i, 40, true)); });
  for (auto& t : clients) t.join();
  clock_type::time_point last_first = got[0].first, first_done = got[0].done;
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].content, serial[i]) << "request " << i;
    EXPECT_FALSE(got[i].content.empty());
    last_first = std::max(last_first, got[i].first);
    first_done = std::min(first_done, got[i].done);
  }
  EXPECT_LT(last_first, first_done) << "a request finished before another one started streaming";
  const std::string m = s.metrics();
  EXPECT_EQ(metric(m, "dsv4_parallel_max"), n);
  EXPECT_GT(metric(m, "dsv4_steps_total"), 0);
  // Some step ran more than one session: fewer steps with one row than in all.
  EXPECT_LT(metric(m, "dsv4_step_rows_bucket{le=\"1\"}"), metric(m, "dsv4_steps_total")) << m;
  EXPECT_EQ(metric(m, "dsv4_time_to_first_token_seconds_count"), n);
}

TEST(ServerParallel, AMemoryBudgetForTwoSessionsRunsFourRequestsTwoAtATime) {
  constexpr int n = 4;
  std::vector<ordered_json> serial(n);
  {
    Served one(1);
    for (int i = 0; i < n; ++i) serial[i] = one.post(chat(i, 24, false));
  }
  // Room for two sessions of 1024 tokens.
  std::unique_ptr<Engine> probe = load_engine();
  const uint64_t two_mb = (2 * probe->session_bytes(1024) + (1 << 20) - 1) >> 20;
  probe.reset();
  Served s(n, two_mb);
  std::vector<ordered_json> got(n);
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) clients.emplace_back([&, i] { got[i] = s.post(chat(i, 24, false)); });
  for (auto& t : clients) t.join();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(got[i]["choices"][0]["message"].dump(), serial[i]["choices"][0]["message"].dump()) << i;
    EXPECT_EQ(got[i]["choices"][0]["logprobs"].dump(), serial[i]["choices"][0]["logprobs"].dump()) << i;
  }
  const std::string m = s.metrics();
  EXPECT_EQ(metric(m, "dsv4_sessions_max"), 2) << m;
  EXPECT_EQ(metric(m, "dsv4_sessions_live"), 2);
  EXPECT_EQ(metric(m, "dsv4_jobs_total{result=\"ok\"}"), n);
}

TEST(ServerParallel, NChoicesAreTheSeededSingleRequestsSideBySide) {
  Served s(4);
  ordered_json body = chat(1, 20, false);
  body["seed"] = 7;
  body["n"] = 3;
  const ordered_json three = s.post(body);
  ASSERT_EQ(three["choices"].size(), 3u) << three.dump();
  // The prompt was prefilled once (one job led, the others copied its state): a fresh server prefilled
  // exactly the prompt's tokens for the three jobs.
  EXPECT_EQ(metric(s.metrics(), "dsv4_prefilled_tokens_total"), three["usage"]["prompt_tokens"].get<double>());
  uint64_t completion = 0;
  for (int i = 0; i < 3; ++i) {
    ordered_json one_body = chat(1, 20, false);
    one_body["seed"] = 7 + i;
    const ordered_json one = s.post(one_body);
    EXPECT_EQ(three["choices"][i]["index"], i);
    EXPECT_EQ(three["choices"][i]["message"].dump(), one["choices"][0]["message"].dump()) << i;
    EXPECT_EQ(three["choices"][i]["logprobs"].dump(), one["choices"][0]["logprobs"].dump()) << i;
    completion += one["usage"]["completion_tokens"].get<uint64_t>();
    EXPECT_EQ(three["usage"]["prompt_tokens"], one["usage"]["prompt_tokens"]);
  }
  EXPECT_EQ(three["usage"]["completion_tokens"].get<uint64_t>(), completion);
  // The legacy completions endpoint too.
  httplib::Client c("127.0.0.1", s.port);
  auto r = c.Post("/v1/completions", R"({"model":"tiny","prompt":"once upon","max_tokens":5,"n":2,"seed":3})",
                  "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(ordered_json::parse(r->body)["choices"].size(), 2u);
  // Refused: streamed n > 1, and more than 16 choices.
  body["stream"] = true;
  r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("cannot be streamed"), std::string::npos) << r->body;
  body["stream"] = false;
  body["n"] = 17;
  r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("at most 16"), std::string::npos) << r->body;
}

TEST(ServerParallel, ParallelRequestsUseTheDiskCacheEachOnItsOwnSession) {
  kvtest::TempDir dir("parallel");
  auto long_chat = [](int i) {
    ordered_json b = chat(i, 12, false);
    std::string sys;
    for (int k = 0; k < 40; ++k) sys += "rule " + std::to_string(k) + " of agent " + std::to_string(i) + ". ";
    b["messages"].insert(b["messages"].begin(), ordered_json{{"role", "system"}, {"content", sys}});
    return b;
  };
  constexpr int n = 3;
  std::vector<ordered_json> first(n), again(n);
  {
    Served s(n, 0, dir.path);
    std::vector<std::thread> clients;
    for (int i = 0; i < n; ++i) clients.emplace_back([&, i] { first[i] = s.post(long_chat(i)); });
    for (auto& t : clients) t.join();
  }  // shutdown: every live session is saved
  Served s(n, 0, dir.path);
  std::vector<std::thread> clients;
  for (int i = 0; i < n; ++i) clients.emplace_back([&, i] { again[i] = s.post(long_chat(i)); });
  for (auto& t : clients) t.join();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(first[i]["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << i;
    EXPECT_GT(again[i]["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(), 64u) << again[i].dump();
    EXPECT_EQ(again[i]["choices"][0]["message"].dump(), first[i]["choices"][0]["message"].dump()) << i;
    EXPECT_EQ(again[i]["choices"][0]["logprobs"].dump(), first[i]["choices"][0]["logprobs"].dump()) << i;
  }
  EXPECT_GE(metric(s.metrics(), "dsv4_kv_disk_hits_total"), n);
}

TEST(ServerParallel, MtpProposalsGiveTheSameRepliesAndShowInMetrics) {
  kvtest::TempDir dir("mtp");
  std::filesystem::create_directories(dir.path);
  const std::string mtp = dir.file("tiny-mtp.gguf");
  ASSERT_TRUE(synth_write(synth_mtp_plan(*find_preset("tiny"), 4), mtp, 1).has_value());
  std::vector<std::string> plain;
  {
    Served one(1);
    for (int i = 0; i < 2; ++i) plain.push_back(one.post(chat(i, 24, false)).dump());
  }
  // One at a time, and two at once through the step batcher (their verify passes are items of its steps).
  for (size_t parallel : {1, 2}) {
    Served s(parallel, 0, "", mtp, 3);
    std::vector<ordered_json> got(2);
    std::vector<std::thread> clients;
    for (int i = 0; i < 2; ++i)
      clients.emplace_back([&, i] { got[static_cast<size_t>(i)] = s.post(chat(i, 24, false)); });
    for (auto& c : clients) c.join();
    for (int i = 0; i < 2; ++i)
      EXPECT_EQ(got[static_cast<size_t>(i)]["choices"], ordered_json::parse(plain[static_cast<size_t>(i)])["choices"])
          << "request " << i << ", --parallel " << parallel;
    const std::string m = s.metrics();
    EXPECT_GT(metric(m, "dsv4_spec_passes_total"), 0) << m;
    EXPECT_GT(metric(m, "dsv4_spec_proposed_tokens_total"), 0) << m;
    EXPECT_GE(metric(m, "dsv4_spec_accepted_tokens_total"), 0) << m;
  }
}
