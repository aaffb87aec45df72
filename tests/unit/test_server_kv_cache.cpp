// `dsv4 serve` with resident sessions and the on-disk KV cache, on the
// synthetic tiny model (CPU), through HTTP on loopback: a long prompt is
// reused after a restart and only the suffix is prefilled; a reply continued
// from a restored prefix equals the live one (logprobs bitwise); two agents
// alternating stay warm with --sessions 2 (and via the disk with 1); damaged,
// truncated and foreign files are removed with a warning and the request
// succeeds (a model that differs in one byte is foreign; its identity is
// remembered across restarts); an unusable directory or a failing write
// degrades to no (new) cache files with a warning; shutdown saves the live sessions; thinking
// without tools reuses the whole turn through its visible transcript; tool
// call ids are recovered from cache files after a restart; frontier saves
// during prefill and decode, but not inside tool calls; the size budget.
// Also the pure helpers: visible transcripts, piece prefixes, anchors and the
// tool-call memory's block index.
#include <gtest/gtest.h>
#include <httplib.h>

#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

#include "runtime/session_cache.h"
#include "kv_test_util.h"
#include "runtime/engine_backend.h"
#include "server/http_server.h"
#include "server/openai_chat.h"
#include "server_test_util.h"
#include "synth/synth.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;
using ordered_json = nlohmann::ordered_json;
using kvtest::TempDir;
using namespace std::chrono_literals;

namespace {

struct Model {
  std::string dir, path;
  Model() {
    dir = (std::filesystem::temp_directory_path() / ("dsv4_srvkv_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    path = dir + "/tiny.gguf";
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 11), path, 2).has_value());
  }
  ~Model() { std::filesystem::remove_all(dir); }
};

const std::string& model_path() {
  static Model m;
  return m.path;
}

std::unique_ptr<Engine> load_engine(const std::string& path = model_path()) {
  EngineOptions o;
  o.model_path = path;
  o.backend = BackendChoice::CPU;
  o.ctx = 4096;
  o.prefill_batch = 128;
  o.show_progress = false;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
  return e ? std::move(*e) : nullptr;
}

KvCacheOptions cache_options(const std::string& dir, size_t sessions = 1) {
  KvCacheOptions c;
  c.sessions = sessions;
  c.disk_dir = dir;
  c.min_tokens = 64;
  c.frontier = 0;
  c.write_queue = 16;  // the tiny model outruns the writer; tests count every save
  return c;
}

// A server object on a loopback port; a "restart" is a new one on the same directory.
struct Served {
  std::unique_ptr<EngineBackend> backend;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;
  bool stopped = false;

  explicit Served(const KvCacheOptions& c, const std::string& model = model_path()) {
    auto b = EngineBackend::create(load_engine(model), 4096, c);
    EXPECT_TRUE(b.has_value()) << (b ? "" : b.error().message);
    backend = std::move(*b);
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.model_id = "tiny";
    http = std::make_unique<HttpServer>(o, *backend);
    EXPECT_TRUE(http->bind().has_value());
    port = http->port();
    thread = std::thread([this] { (void)http->serve(); });
  }
  ~Served() { stop(true); }
  // Graceful (`now` false): live sessions are saved; either way pending writes finish.
  void stop(bool now) {
    if (stopped) return;
    stopped = true;
    http->shutdown(now);
    thread.join();
  }
  ordered_json post(const std::string& path, const ordered_json& body, int want_status = 200) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    auto r = c.Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {};
    EXPECT_EQ(r->status, want_status) << r->body;
    return ordered_json::parse(r->body, nullptr, false);
  }
  double metric(const std::string& name) const {
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/metrics");
    if (!r) return -1;
    size_t at = 0;
    const std::string& s = r->body;
    while ((at = s.find(name + " ", at)) != std::string::npos) {
      if (at == 0 || s[at - 1] == '\n') return std::stod(s.substr(at + name.size() + 1));
      ++at;
    }
    return -1;
  }
  // Counters the writer thread moves lag the reply a little.
  bool wait_metric(const std::string& name, double want) const {
    for (int i = 0; i < 500; ++i) {
      if (metric(name) == want) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

std::string long_system(const std::string& who, int rules) {
  std::string s = "You are " + who + ".";
  for (int i = 0; i < rules; ++i) s += " Rule " + std::to_string(i) + ": answer about " + who + " briefly.";
  return s;
}

ordered_json msg(const std::string& role, const std::string& content) {
  return ordered_json{{"role", role}, {"content", content}};
}

ordered_json chat(const ordered_json& messages, int max_tokens = 4, const std::string& model = "deepseek-chat") {
  return ordered_json{{"model", model}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

size_t cached_of(const ordered_json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<size_t>(); }
size_t prompt_of(const ordered_json& r) { return r["usage"]["prompt_tokens"].get<size_t>(); }
size_t completion_of(const ordered_json& r) { return r["usage"]["completion_tokens"].get<size_t>(); }
std::string content_of(const ordered_json& r) {
  const auto& c = r["choices"][0]["message"]["content"];
  return c.is_string() ? c.get<std::string>() : std::string();
}

struct FileInfo {
  std::string name;
  KvHeader header;
  uint64_t bytes = 0;
};

// The valid cache files of a directory, from their headers.
std::vector<FileInfo> cache_files(const std::string& dir) {
  std::vector<FileInfo> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (!kv_parse_file_name(name)) continue;
    const auto bytes = kvtest::read_bytes(e.path().string());
    auto h = kv_parse_header(bytes, bytes.size());
    if (h) out.push_back(FileInfo{name, *h, bytes.size()});
  }
  return out;
}

std::vector<FileInfo> files_with(const std::vector<FileInfo>& files, SaveReason reason) {
  std::vector<FileInfo> out;
  for (const auto& f : files)
    if (f.header.reason == reason) out.push_back(f);
  return out;
}

size_t count_of(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(ServerKvCache, RestartReusesTheLongPromptAndPrefillsOnlyTheSuffix) {
  TempDir tmp("srv_restart");
  const KvCacheOptions c = cache_options(tmp.path);
  const std::string sys = long_system("the release assistant", 10);
  {
    Served a(c);
    auto r = a.post("/v1/chat/completions", chat({msg("system", sys), msg("user", "What changed in version 2?")}));
    EXPECT_EQ(cached_of(r), 0u);
    EXPECT_EQ(a.metric("dsv4_kv_disk_misses_total"), 1);
    a.stop(false);
  }
  // The system prompt (cold, stored during the prefill) and the whole live session (shutdown).
  const auto files = cache_files(tmp.path);
  ASSERT_EQ(files_with(files, SaveReason::COLD).size(), 1u);
  ASSERT_EQ(files_with(files, SaveReason::SHUTDOWN).size(), 1u);
  const size_t cold = files_with(files, SaveReason::COLD)[0].header.n_tokens;
  EXPECT_GE(cold, 64u);
  for (const auto& f : files) EXPECT_EQ(kvtest::mode_of(tmp.file(f.name)), 0600u);
  EXPECT_EQ(kvtest::mode_of(tmp.path), 0700u);

  Served b(c);
  auto r = b.post("/v1/chat/completions", chat({msg("system", sys), msg("user", "And in version 3, what changed?")}));
  const size_t cached = cached_of(r), prompt = prompt_of(r);
  EXPECT_EQ(cached, cold);
  EXPECT_LT(cached, prompt);
  EXPECT_EQ(r["usage"]["prompt_cache_hit_tokens"].get<size_t>(), cold);
  EXPECT_EQ(b.metric("dsv4_kv_disk_hits_total"), 1);
  EXPECT_EQ(b.metric("dsv4_kv_disk_restored_tokens_total"), static_cast<double>(cold));
  EXPECT_EQ(b.metric("dsv4_cached_prompt_tokens_total"), static_cast<double>(cold));
  EXPECT_EQ(b.metric("dsv4_prefilled_tokens_total"), static_cast<double>(prompt - cold));  // only the suffix
  // Anthropic reports the same split: input_tokens prefilled, cache_read_input_tokens reused.
  auto m = b.post("/v1/messages", ordered_json{{"model", "deepseek-chat"},
                                               {"max_tokens", 3},
                                               {"system", sys},
                                               {"messages", {msg("user", "And in version 4?")}}});
  EXPECT_GE(m["usage"]["cache_read_input_tokens"].get<size_t>(), cold);
  EXPECT_GT(m["usage"]["input_tokens"].get<size_t>(), 0u);
}

TEST(ServerKvCache, ReplyFromARestoredPrefixEqualsTheLiveReply) {
  // Greedy decoding with logprobs: the prefill split at the save point and the
  // restored state must give bitwise the same logits as one live prefill.
  TempDir tmp("srv_equal");
  const std::string sys = long_system("the numerics checker", 8);
  ordered_json body = chat({msg("system", sys), msg("user", "Check the sum of the series.")}, 6);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  ordered_json live;
  {
    KvCacheOptions none;
    Served s(none);
    live = s.post("/v1/chat/completions", body);
    EXPECT_EQ(s.metric("dsv4_kv_disk_enabled"), 0);
  }
  ASSERT_TRUE(live["choices"][0]["logprobs"].is_object());
  {
    Served s(cache_options(tmp.path));
    auto split = s.post("/v1/chat/completions", body);  // prefilled to the cold length, saved, then the rest
    EXPECT_EQ(split["choices"][0]["logprobs"].dump(), live["choices"][0]["logprobs"].dump());
    EXPECT_EQ(files_with(cache_files(tmp.path), SaveReason::COLD).size(), 1u);
  }
  Served s(cache_options(tmp.path));
  auto restored = s.post("/v1/chat/completions", body);
  EXPECT_GT(cached_of(restored), 0u);
  EXPECT_EQ(content_of(restored), content_of(live));
  EXPECT_EQ(restored["choices"][0]["logprobs"].dump(), live["choices"][0]["logprobs"].dump());
}

namespace {

struct AgentTurn {
  size_t cached = 0;         // reused by an agent's first request after the other agent's turn
  size_t previous_turn = 0;  // prompt + completion tokens of the agent's previous turn
};

// Whether a reply's text is exactly the bytes of its tokens. The random tiny
// model often ends a reply inside a UTF-8 sequence; a client cannot send such
// a reply back byte for byte, so its session's tail can never match (a real
// model's replies end with EOS or a tool call).
bool reply_round_trips(const ordered_json& r) {
  if (r["choices"][0]["finish_reason"] != "length") return false;
  std::string bytes;
  for (const auto& t : r["choices"][0]["logprobs"]["content"])
    for (const auto& b : t["bytes"]) bytes.push_back(static_cast<char>(b.get<int>()));
  return bytes == content_of(r);
}

// Two agents (different system prompts) alternate, three turns each; each
// request sends the agent's whole conversation back with the replies. A turn
// whose reply does not round-trip is regenerated (same prompt, another seed),
// which keeps it on the agent's own session.
std::vector<AgentTurn> alternate_agents(const KvCacheOptions& c, std::unique_ptr<Served>* keep = nullptr) {
  std::vector<AgentTurn> out;
  auto s = std::make_unique<Served>(c);
  ordered_json conv[2] = {ordered_json::array({msg("system", long_system("the build agent", 6))}),
                          ordered_json::array({msg("system", long_system("the docs agent", 6))})};
  size_t previous[2] = {0, 0};
  for (int round = 0; round < 3; ++round) {
    for (int a = 0; a < 2; ++a) {
      conv[a].push_back(msg("user", "step " + std::to_string(round) + " for agent " + std::to_string(a)));
      ordered_json r;
      for (int seed = 0;; ++seed) {
        ordered_json body = chat(conv[a], 3);
        body["temperature"] = 1;
        body["seed"] = seed;
        body["logprobs"] = true;
        r = s->post("/v1/chat/completions", body);
        if (seed == 0 && round > 0) out.push_back(AgentTurn{cached_of(r), previous[a]});
        if (reply_round_trips(r)) break;
        EXPECT_LT(seed, 200) << "no reply that round-trips";
        if (seed >= 200) return out;
      }
      previous[a] = prompt_of(r) + completion_of(r);
      conv[a].push_back(msg("assistant", content_of(r)));
    }
  }
  if (keep) *keep = std::move(s);
  return out;
}

}  // namespace

TEST(ServerKvCache, TwoAlternatingAgentsStayWarmWithTwoSessions) {
  std::unique_ptr<Served> s;
  KvCacheOptions two;
  two.sessions = 2;
  const auto turns = alternate_agents(two, &s);
  ASSERT_EQ(turns.size(), 4u);
  for (const AgentTurn& t : turns) EXPECT_EQ(t.cached, t.previous_turn);  // the whole previous turn
  EXPECT_EQ(s->metric("dsv4_sessions_live"), 2);
  EXPECT_EQ(s->metric("dsv4_session_picks_total{pick=\"displaced\"}"), 0);
  EXPECT_GE(s->metric("dsv4_session_picks_total{pick=\"extends\"}"), 4);
}

TEST(ServerKvCache, TwoAlternatingAgentsMissWithOneSessionAndHitViaTheDisk) {
  KvCacheOptions one;
  auto turns = alternate_agents(one);
  ASSERT_EQ(turns.size(), 4u);
  for (const AgentTurn& t : turns) EXPECT_LT(t.cached, 10u);  // "You are the" at most
  // With a disk cache, each displaced session is saved and restored when its agent returns.
  TempDir tmp("srv_agents");
  std::unique_ptr<Served> s;
  turns = alternate_agents(cache_options(tmp.path), &s);
  ASSERT_EQ(turns.size(), 4u);
  for (const AgentTurn& t : turns) EXPECT_EQ(t.cached, t.previous_turn);
  EXPECT_EQ(s->metric("dsv4_kv_disk_hits_total"), 4);
  EXPECT_EQ(s->metric("dsv4_session_picks_total{pick=\"displaced\"}"), 5);
  EXPECT_EQ(s->metric("dsv4_kv_disk_saves_total{reason=\"displaced\"}"), 5);
}

TEST(ServerKvCache, DamagedTruncatedAndForeignFilesAreRemovedWithAWarning) {
  TempDir tmp("srv_damaged");
  const KvCacheOptions c = cache_options(tmp.path);
  const std::string sys = long_system("the storage agent", 8);
  {
    Served a(c);
    a.post("/v1/chat/completions", chat({msg("system", sys), msg("user", "first")}));
    a.stop(false);
  }
  auto files = cache_files(tmp.path);
  ASSERT_EQ(files.size(), 2u);
  const FileInfo cold = files_with(files, SaveReason::COLD).at(0);
  const FileInfo whole = files_with(files, SaveReason::SHUTDOWN).at(0);
  // A bit flip inside the cold file's payload: only a full read notices it.
  auto img = kvtest::read_bytes(tmp.file(cold.name));
  img[cold.header.payload_offset() + 1000] ^= 0x10;
  kvtest::write_bytes(tmp.file(cold.name), img);
  // Another model's file: the shutdown file with a different identity, checksums redone.
  img = kvtest::read_bytes(tmp.file(whole.name));
  img[16] ^= 0xff;
  kv_seal(img);
  kvtest::write_bytes(tmp.file(whole.name), img);
  // A truncated copy and garbage, under valid names.
  img = kvtest::read_bytes(tmp.file(cold.name));
  img.resize(img.size() / 2);
  kvtest::write_bytes(tmp.file(std::string(64, 'a') + ".kv"), img);
  kvtest::write_bytes(tmp.file(std::string(64, 'b') + ".kv"), std::vector<uint8_t>(5000, 0x5a));

  testing::internal::CaptureStderr();
  {
    Served b(c);
    auto r = b.post("/v1/chat/completions", chat({msg("system", sys), msg("user", "second")}));
    EXPECT_EQ(cached_of(r), 0u);  // the only matching file was damaged
    EXPECT_EQ(b.metric("dsv4_kv_disk_rejected_files_total"), 4);
    EXPECT_EQ(b.metric("dsv4_kv_disk_hits_total"), 0);
    b.stop(true);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "KV disk cache: removing"), 4u) << err;
  EXPECT_NE(err.find("foreign model"), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  for (const auto& name : {whole.name, std::string(64, 'a') + ".kv", std::string(64, 'b') + ".kv"})
    EXPECT_FALSE(std::filesystem::exists(tmp.file(name))) << name;
  // The request stored a fresh cold file (same key, so the same name); the next server restores it.
  Served d(c);
  auto r = d.post("/v1/chat/completions", chat({msg("system", sys), msg("user", "third")}));
  EXPECT_EQ(cached_of(r), cold.header.n_tokens);
}

// A model file that differs from the served one in one byte in the middle of
// a tensor is another model: its server removes the first model's files as
// foreign. Each model's identity is remembered next to the cache, so a
// restart with the first model hashes nothing.
TEST(ServerKvCache, OneChangedByteMakesAnotherModelWhoseFilesAreForeign) {
  TempDir tmp("srv_middle");
  const std::string flipped = std::filesystem::path(model_path()).parent_path().string() + "/tiny-flipped.gguf";
  ASSERT_TRUE(kvtest::write_flipped_copy(model_path(), flipped));
  const KvCacheOptions c = cache_options(tmp.path);
  const auto prompt = chat({msg("system", long_system("the identity agent", 8)), msg("user", "first")});
  {
    Served a(c);
    EXPECT_EQ(cached_of(a.post("/v1/chat/completions", prompt)), 0u);
    a.stop(false);
  }
  const size_t written = cache_files(tmp.path).size();
  ASSERT_GE(written, 1u);
  testing::internal::CaptureStderr();
  {
    Served b(c, flipped);
    EXPECT_EQ(cached_of(b.post("/v1/chat/completions", prompt)), 0u);
    EXPECT_EQ(b.metric("dsv4_kv_disk_rejected_files_total"), static_cast<double>(written));
    EXPECT_EQ(b.metric("dsv4_kv_disk_hits_total"), 0);
    b.stop(true);
  }
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "foreign model"), written) << err;
  EXPECT_NE(err.find("model identity: hashed"), std::string::npos) << err;
  testing::internal::CaptureStderr();
  {
    Served d(c);
    EXPECT_EQ(cached_of(d.post("/v1/chat/completions", prompt)), 0u);  // the second model's cold file is foreign here
    d.stop(true);
  }
  err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("model identity from cache"), std::string::npos) << err;
  EXPECT_EQ(err.find("model identity: hashed"), std::string::npos) << err;
  EXPECT_NE(err.find("foreign model"), std::string::npos) << err;
  std::filesystem::remove(flipped);
}

TEST(ServerKvCache, UnusableDirectoryMeansNoDiskCacheWithAWarning) {
  TempDir tmp("srv_unusable");
  std::filesystem::create_directories(tmp.path);
  kvtest::write_bytes(tmp.file("plain"), {1, 2, 3});
  std::filesystem::create_directories(tmp.file("shared"));
  ::chmod(tmp.file("shared").c_str(), 0777);
  for (const std::string& dir : {tmp.file("plain") + "/kv", tmp.file("shared")}) {
    testing::internal::CaptureStderr();
    Served s(cache_options(dir));
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("KV disk cache disabled, serving without it"), std::string::npos) << err;
    EXPECT_FALSE(s.backend->disk_enabled());
    EXPECT_NE(s.backend->describe_cache().find("KV disk cache off ("), std::string::npos);
    auto r = s.post("/v1/chat/completions", chat({msg("system", long_system("x", 4)), msg("user", "hi")}));
    EXPECT_GT(completion_of(r), 0u);
    EXPECT_EQ(s.metric("dsv4_kv_disk_enabled"), 0);
  }
}

TEST(ServerKvCache, AFailingWriteLeavesTheCacheReadOnlyAndTheServerServing) {
  // RLIMIT_FSIZE makes the writer's write fail with EFBIG, as a full disk fails with ENOSPC.
  TempDir tmp("srv_fsize");
  Served s(cache_options(tmp.path));
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 16 * 1024;
  testing::internal::CaptureStderr();
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  auto r = s.post("/v1/chat/completions", chat({msg("system", long_system("the quota agent", 8)), msg("user", "hi")}));
  const bool failed = s.wait_metric("dsv4_kv_disk_write_failures_total", 1);
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(failed);
  EXPECT_GT(completion_of(r), 0u);
  EXPECT_NE(err.find("no new cache files will be written"), std::string::npos) << err;
  EXPECT_EQ(s.metric("dsv4_kv_disk_writable"), 0);
  EXPECT_EQ(s.metric("dsv4_kv_disk_enabled"), 1);
  // Still serving; nothing more is written, no temporary file is left behind.
  auto again =
      s.post("/v1/chat/completions", chat({msg("system", long_system("the other agent", 8)), msg("user", "hi")}));
  EXPECT_GT(completion_of(again), 0u);
  s.stop(false);
  // The directory holds only the model identity remembered at start.
  for (const auto& e : std::filesystem::directory_iterator(tmp.path))
    EXPECT_EQ(e.path().filename().string(), ModelIdentityStore::k_file_name);
}

TEST(ServerKvCache, ShutdownSavesEveryLiveSession) {
  TempDir tmp("srv_shutdown");
  std::vector<uint64_t> sizes;
  {
    Served s(cache_options(tmp.path, 2));
    for (const char* who : {"the first agent", "the second agent"})
      s.post("/v1/chat/completions", chat({msg("system", long_system(who, 6)), msg("user", "go")}));
    sizes = s.backend->cache_report().session_tokens;
    s.stop(false);
  }
  ASSERT_EQ(sizes.size(), 2u);
  auto saved = files_with(cache_files(tmp.path), SaveReason::SHUTDOWN);
  ASSERT_EQ(saved.size(), 2u);
  std::vector<uint64_t> got{saved[0].header.n_tokens, saved[1].header.n_tokens};
  std::sort(got.begin(), got.end());
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(got, sizes);
  // A forced shutdown (second signal) saves nothing.
  TempDir forced("srv_forced");
  {
    Served s(cache_options(forced.path));
    s.post("/v1/chat/completions", chat({msg("system", long_system("the third agent", 6)), msg("user", "go")}));
    s.stop(true);
  }
  EXPECT_TRUE(files_with(cache_files(forced.path), SaveReason::SHUTDOWN).empty());
}

namespace {

// An Anthropic thinking turn (budget 3, so </think> comes early) without tools.
ordered_json thinking_turn(const std::string& sys, const ordered_json& messages) {
  return ordered_json{{"model", "tiny"}, {"max_tokens", 10}, {"thinking", {{"type", "enabled"}, {"budget_tokens", 3}}},
                      {"system", sys},   {"seed", 5},        {"messages", messages}};
}

size_t anthropic_total(const ordered_json& r) {
  const auto& u = r["usage"];
  return u["input_tokens"].get<size_t>() + u["cache_read_input_tokens"].get<size_t>() +
         u["output_tokens"].get<size_t>();
}

}  // namespace

TEST(ServerKvCache, ThinkingWithoutToolsReusesTheWholeTurnThroughItsVisibleTranscript) {
  // The client sends a turn back without its reasoning (the renderer drops
  // it anyway); the session still holds it. The turn's visible transcript
  // keys the session, in memory and on disk.
  TempDir tmp("srv_thinking");
  const std::string sys = long_system("the thinking agent", 6);
  ordered_json messages = ordered_json::array({msg("user", "Why is the sky blue?")});
  size_t second_total = 0;
  {
    Served s(cache_options(tmp.path));
    auto r1 = s.post("/v1/messages", thinking_turn(sys, messages));
    ASSERT_EQ(r1["content"][0]["type"], "thinking");
    ASSERT_FALSE(r1["content"][0]["thinking"].get<std::string>().empty());
    messages.push_back(ordered_json{{"role", "assistant"}, {"content", r1["content"]}});
    messages.push_back(msg("user", "And at sunset?"));
    auto r2 = s.post("/v1/messages", thinking_turn(sys, messages));
    EXPECT_EQ(r2["usage"]["cache_read_input_tokens"].get<size_t>(), anthropic_total(r1));  // every token of turn 1
    second_total = anthropic_total(r2);
    messages.push_back(ordered_json{{"role", "assistant"}, {"content", r2["content"]}});
    messages.push_back(msg("user", "And at night?"));
    s.stop(false);
  }
  // The shutdown file is keyed by the transcript, not by the decoded tokens.
  auto saved = files_with(cache_files(tmp.path), SaveReason::SHUTDOWN);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_FALSE(saved[0].header.decoded_key());
  EXPECT_EQ(saved[0].header.n_tokens, second_total);
  // After a restart, turn 3 restores both earlier turns, reasoning included, from that file.
  Served s(cache_options(tmp.path));
  auto r3 = s.post("/v1/messages", thinking_turn(sys, messages));
  EXPECT_EQ(r3["usage"]["cache_read_input_tokens"].get<size_t>(), second_total);
  EXPECT_EQ(s.metric("dsv4_kv_disk_hits_total"), 1);
}

TEST(ServerKvCache, ToolCallIdsAreRecoveredFromCacheFilesAfterARestart) {
  // A conversation whose assistant turn is a tool call the model wrote in a
  // non-canonical way (a string given as JSON): only exact replay of the
  // sampled block renders the bytes the cached session holds. After a
  // restart the id is known only to the cache file.
  TempDir tmp("srv_tools");
  const ordered_json tool = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "Weather for a city"},
        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  const std::string raw = test::dsml(
      "\n\n<|tool_calls>\n<|invoke name=\"get_weather\">\n<|parameter name=\"city\" "
      "string=\"false\">\"Paris\"</|parameter>\n"
      "</|invoke>\n</|tool_calls>");
  auto assistant = [](const std::string& id) {
    return ordered_json{{"role", "assistant"},
                        {"content", nullptr},
                        {"tool_calls",
                         {{{"id", id},
                           {"type", "function"},
                           {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}};
  };
  const std::string sys = long_system("the weather agent", 6);
  size_t saved_tokens = 0;
  {
    // The state the server would have saved after generating the call: prompt + the sampled block.
    auto engine = load_engine();
    const Tokenizer& tok = engine->tokenizer();
    ToolMemory memory;
    memory.remember(ToolCallRecord{raw, "", {ChatToolCall{"call_0123", "get_weather", "{\"city\": \"Paris\"}"}}});
    ServeContext ctx{tok, 4096, ModelCatalog{"tiny", {}}, memory};
    ordered_json body = {{"model", "deepseek-chat"},
                         {"tools", {tool}},
                         {"messages", {msg("system", sys), msg("user", "Weather in Paris?"), assistant("call_0123")}}};
    auto p = prepare_openai_chat(body, ctx);
    ASSERT_TRUE(p.has_value()) << p.error().message;
    ASSERT_NE(rendered_text(p->job.rendered).find(raw), std::string::npos);
    auto session = engine->new_session();
    ASSERT_TRUE(session.has_value());
    ASSERT_TRUE((*session)->prefill(p->job.prompt).has_value());
    DiskCacheOptions o;
    o.dir = tmp.path;
    auto disk = DiskCache::open(o, cache_identity(*engine));
    ASSERT_TRUE(disk.has_value());
    const ToolDsmlMap calls{{"call_0123", raw}};
    auto st = cache_save(**disk, tok, **session, CacheSave{SaveReason::EXPLICIT, std::nullopt, &calls});
    ASSERT_TRUE(st.has_value());
    saved_tokens = p->job.prompt.size();
  }
  auto conversation = [&](const std::string& id) {
    return ordered_json{{"model", "deepseek-chat"},
                        {"tools", {tool}},
                        {"max_tokens", 3},
                        {"messages",
                         {msg("system", sys), msg("user", "Weather in Paris?"), assistant(id),
                          ordered_json{{"role", "tool"}, {"tool_call_id", id}, {"content", "sunny, 24 C"}}}}};
  };
  Served s(cache_options(tmp.path));
  EXPECT_FALSE(s.http->tool_memory().knows("call_0123"));
  auto r = s.post("/v1/chat/completions", conversation("call_0123"));
  EXPECT_EQ(cached_of(r), saved_tokens);
  EXPECT_TRUE(s.http->tool_memory().knows("call_0123"));
  // An id no file knows renders canonically: the cached block no longer matches.
  auto other = s.post("/v1/chat/completions", conversation("call_9999"));
  EXPECT_LT(cached_of(other), saved_tokens);
}

TEST(ServerKvCache, FrontiersDuringPrefillAndDecodeButNotInsideToolCalls) {
  const std::string sys = long_system("the long-form writer", 9);
  const ordered_json story = chat({msg("system", sys), msg("user", "Write a long story.")}, 40);
  auto frontiers = [](const std::string& dir) {
    std::vector<uint64_t> n;
    for (const auto& f : files_with(cache_files(dir), SaveReason::FRONTIER)) n.push_back(f.header.n_tokens);
    std::sort(n.begin(), n.end());
    return n;
  };
  auto run = [&](const std::string& dir, size_t frontier, const ordered_json& body) {
    KvCacheOptions c = cache_options(dir);
    c.frontier = frontier;
    Served s(c);
    auto r = s.post("/v1/chat/completions", body);
    s.stop(true);
    return std::pair<size_t, size_t>{prompt_of(r), completion_of(r)};
  };
  // The greedy reply's length, then a frontier with one multiple in the prompt and one in the reply.
  TempDir probe("srv_frontier_probe");
  const auto [P, C] = run(probe.path, 0, story);
  const size_t m = (P + 1) % 2 == 0 ? P + 1 : P + 2;
  // generate() feeds the reply's tokens one by one; a session of m tokens exists when m <= P + C - 2.
  ASSERT_GE(P + C, m + 2) << "the reply must cross the frontier for this test";
  TempDir plain("srv_frontier");
  EXPECT_EQ(run(plain.path, m / 2, story), std::make_pair(P, C));
  EXPECT_EQ(frontiers(plain.path), (std::vector<uint64_t>{m / 2, m}));  // one in the prefill, one while decoding

  // A forced tool call: the reply is a DSML block from its first token, so no frontier after the prompt.
  ordered_json forced_body = story;
  forced_body["seed"] = 3;
  forced_body["tools"] = ordered_json::array(
      {{{"type", "function"}, {"function", {{"name", "save_story"}, {"parameters", {{"type", "object"}}}}}}});
  forced_body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "save_story"}}}};
  TempDir forced("srv_frontier_tool");
  const auto [fp, fc] = run(forced.path, 16, forced_body);
  ASSERT_GT(fp + fc, (fp / 16 + 1) * 16 + 2) << "the reply must cross a frontier for this test";
  const auto ff = frontiers(forced.path);
  EXPECT_FALSE(ff.empty());
  for (uint64_t n : ff) EXPECT_LE(n, fp);
  // Thinking without tools: the reasoning never comes back, so no frontier after the prompt either.
  ordered_json think_body = story;
  think_body["model"] = "deepseek-reasoner";
  think_body["seed"] = 3;
  TempDir thinking("srv_frontier_think");
  const auto [tp, tc] = run(thinking.path, 16, think_body);
  ASSERT_GT(tp + tc, (tp / 16 + 1) * 16 + 2) << "the reply must cross a frontier for this test";
  const auto tf = frontiers(thinking.path);
  EXPECT_FALSE(tf.empty());
  for (uint64_t n : tf) EXPECT_LE(n, tp);
}

TEST(ServerKvCache, TheBudgetBoundsTheDirectory) {
  // Eviction order itself is tested on the store (test_disk_cache.cpp: EvictionOrderAndBudget).
  TempDir tmp("srv_budget");
  KvCacheOptions c = cache_options(tmp.path);
  c.disk_space_mb = 1;
  Served s(c);
  for (int i = 0; i < 6; ++i)
    s.post("/v1/chat/completions",
           chat({msg("system", long_system("agent number " + std::to_string(i), 8)), msg("user", "hi")}));
  s.stop(false);
  uint64_t total = 0;
  for (const auto& f : cache_files(tmp.path)) total += f.bytes;
  EXPECT_LE(total, uint64_t{1} << 20);
  const CacheReport rep = s.backend->cache_report();
  EXPECT_GT(rep.disk.evictions, 0u);
  EXPECT_GE(rep.disk.stores, 6u);
  EXPECT_EQ(rep.disk.files, cache_files(tmp.path).size());
}

// ---- pure helpers (scripted tokenizer, no model) ----

namespace {

TextPiece ctl(std::string_view s) { return TextPiece{std::string(s), true}; }
TextPiece txt(std::string s) { return TextPiece{std::move(s), false}; }

}  // namespace

TEST(ServerVisibleTranscript, ThinkingTurnBecomesWhatTheClientRendersNext) {
  auto tok = test::make_tokenizer();
  const RenderedPrompt prompt = {
      ctl(k_token_bos), txt("sys"), ctl(k_token_user), txt("q1"), ctl(k_token_assistant), ctl(k_token_think_begin)};
  GenerateResult r;
  r.tokens = tok->encode_with_specials("hmm</think>Blue.");
  r.tokens.push_back(tok->eos());
  r.finish = FinishReason::STOP;
  r.message.content = "Blue.";
  r.message.reasoning_content = "hmm";
  auto v = visible_transcript(*tok, prompt, r);
  ASSERT_TRUE(v.has_value());
  const RenderedPrompt want = {
      ctl(k_token_bos),       txt("sys"),   ctl(k_token_user), txt("q1"), ctl(k_token_assistant),
      ctl(k_token_think_end), txt("Blue."), ctl(k_token_eos)};
  ASSERT_EQ(v->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ((*v)[i].text, want[i].text) << i;
    EXPECT_EQ((*v)[i].control, want[i].control) << i;
  }
  // The next request renders the turn without reasoning, then the new question.
  RenderedPrompt next = want;
  next.push_back(ctl(k_token_user));
  next.push_back(txt("q2"));
  EXPECT_TRUE(starts_with_pieces(next, *v));
  // Cut by max_tokens: no EOS in the session, the transcript ends with the content.
  r.finish = FinishReason::LENGTH;
  r.tokens.pop_back();
  v = visible_transcript(*tok, prompt, r);
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->back().text, "Blue.");
  EXPECT_TRUE(starts_with_pieces(next, *v));
  // No transcript: a client stop string, no </think> yet, a tool-call block, a prompt not in thinking.
  GenerateResult stop = r;
  stop.finish = FinishReason::STOP;
  stop.stop_string = "Bl";
  EXPECT_FALSE(visible_transcript(*tok, prompt, stop).has_value());
  GenerateResult open = r;
  open.tokens = tok->encode_with_specials("still thinking");
  EXPECT_FALSE(visible_transcript(*tok, prompt, open).has_value());
  GenerateResult call = r;
  call.message.raw_dsml = test::call_block("f", "");
  EXPECT_FALSE(visible_transcript(*tok, prompt, call).has_value());
  RenderedPrompt chat_prompt = prompt;
  chat_prompt.back() = ctl(k_token_think_end);
  EXPECT_FALSE(visible_transcript(*tok, chat_prompt, r).has_value());
}

TEST(ServerVisibleTranscript, PiecePrefixesAndAnchoredReuse) {
  auto tok = test::make_tokenizer();
  const RenderedPrompt p = {ctl(k_token_bos), txt("hello world"), ctl(k_token_user), txt("more")};
  EXPECT_TRUE(starts_with_pieces(p, {ctl(k_token_bos), txt("hello")}));
  EXPECT_TRUE(starts_with_pieces(p, {ctl(k_token_bos), txt("hello world"), ctl(k_token_user)}));
  EXPECT_FALSE(starts_with_pieces(p, {ctl(k_token_bos), txt("hello"), ctl(k_token_user)}));
  // Client text spelling a marker is not the marker.
  EXPECT_FALSE(starts_with_pieces(p, {ctl(k_token_bos), txt("hello world"), txt(std::string(k_token_user))}));
  EXPECT_FALSE(starts_with_pieces(p, {txt(std::string(k_token_bos))}));
  EXPECT_EQ(rendered_text(rendered_prefix(p, 5 + k_token_bos.size())), std::string(k_token_bos) + "hello");
  // An anchor: the first 7 live tokens (hidden reasoning included) stand for the
  // first bytes of the prompt; the walk continues from there.
  std::vector<int32_t> live = tok->encode_with_specials(std::string(k_token_bos) + "hidden thoughts xyz");
  const RenderedPrompt visible = {ctl(k_token_bos), txt("hello world")};
  const std::vector<int32_t> canonical = *tok->encode_prompt(p);
  std::vector<int32_t> more = *tok->encode_prompt({ctl(k_token_user)});
  live.insert(live.end(), more.begin(), more.end());
  const TextAnchor anchor{live.size() - more.size(), rendered_text(visible).size()};
  EXPECT_EQ(reusable_tokens(*tok, live, canonical, p), 1u);  // only BOS without the anchor
  EXPECT_EQ(reusable_tokens(*tok, live, canonical, p, &anchor), live.size());
  PromptChoice c = choose_prompt_tokens(*tok, live, canonical, p, &anchor);
  EXPECT_EQ(c.reused, live.size());
  EXPECT_TRUE(c.stitched);
  std::vector<int32_t> want = live;
  auto rest = *tok->encode_prompt({txt("more")});
  want.insert(want.end(), rest.begin(), rest.end());
  EXPECT_EQ(c.tokens, want);
}

TEST(ServerToolMemoryCache, CallsInTextAndRecovery) {
  const std::string block = test::call_block("get_time", test::string_param("zone", "UTC"));
  const std::string block2 = test::call_block("get_date", "");
  ToolMemory memory;
  memory.remember(ToolCallRecord{block, "", {ChatToolCall{"call_a", "get_time", "{\"zone\": \"UTC\"}"}}});
  memory.remember(ToolCallRecord{block2, "", {ChatToolCall{"call_b", "get_date", "{}"}}});
  const std::string text = "prefix text" + block + "<eos>more" + block2.substr(2) + "tail";
  const ToolDsmlMap in = memory.calls_in(text);
  // block2's leading "\n\n" is missing from the text: only call_a's block occurs whole.
  ASSERT_EQ(in.size(), 1u);
  EXPECT_EQ(in.at("call_a"), block);
  EXPECT_TRUE(memory.calls_in("no blocks here").empty());

  // Recovery: ids from a finder (the disk cache) become records, checked against the message's calls.
  ToolMemory fresh;
  std::vector<ChatMessage> msgs(2);
  msgs[0].role = ChatRole::ASSISTANT;
  msgs[0].tool_calls = {ChatToolCall{"call_a", "get_time", "{\"zone\":\"UTC\"}"}};
  msgs[1].role = ChatRole::ASSISTANT;
  msgs[1].tool_calls = {ChatToolCall{"call_x", "get_date", "{}"}};
  std::vector<std::string> asked;
  auto finder = [&](const std::vector<std::string>& ids) {
    asked = ids;
    return ToolDsmlMap{{"call_a", block}};
  };
  EXPECT_EQ(recover_tool_calls(msgs, fresh, finder), 1u);
  EXPECT_EQ(asked, (std::vector<std::string>{"call_a", "call_x"}));
  EXPECT_TRUE(fresh.knows("call_a"));
  EXPECT_EQ(apply_exact_replay(msgs, fresh), 1u);
  ASSERT_TRUE(msgs[0].raw_dsml.has_value());
  EXPECT_EQ(*msgs[0].raw_dsml, block);
  EXPECT_FALSE(msgs[1].raw_dsml.has_value());
  // Known ids are not asked for again; a block whose calls differ is not replayed.
  asked.clear();
  EXPECT_EQ(recover_tool_calls(msgs, fresh, finder), 0u);
  EXPECT_EQ(asked, std::vector<std::string>{"call_x"});
  ToolMemory other;
  std::vector<ChatMessage> wrong(1);
  wrong[0].role = ChatRole::ASSISTANT;
  wrong[0].tool_calls = {ChatToolCall{"call_a", "get_time", "{\"zone\":\"CET\"}"}};
  EXPECT_EQ(recover_tool_calls(wrong, other, finder), 1u);
  EXPECT_EQ(apply_exact_replay(wrong, other), 0u);
}
