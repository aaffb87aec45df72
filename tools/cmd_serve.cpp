// dsv4 serve: the OpenAI- and Anthropic-compatible HTTP server
// (src/server/http_server.h). Loads the model, owns it from one engine worker
// thread, and serves until SIGINT/SIGTERM: the first signal drains (new
// requests get 503, in-flight ones get --shutdown-grace seconds, then are
// cancelled), a second one cancels at once; the exit status is 0.
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "chat/chat_message.h"
#include "commands.h"
#include "kv_cache_flags.h"
#include "engine_flags.h"
#include "chat/thinking.h"
#include "core/log.h"
#include "dsv4/engine.h"
#include "runtime/engine_backend.h"
#include "server/http_server.h"
#include "runtime/scripted_backend.h"
#include "vocab.h"

namespace dsv4::tools {

namespace {

struct ServeArgs {
  EngineOptions engine;
  server::ServerOptions server;
  runtime::KvCacheOptions cache;
  runtime::BatchingOptions batching;
  CudaOptions cuda;
  size_t max_body_mb = 32;
  std::string script;
  SpeculationArgs spec;
};

std::atomic<int> g_signals{0};

// Connections are file descriptors: raise the soft open-file limit to the
// hard one and keep --max-connections below it (a reserve stays for the
// model, cache files and logs), so a flood of connections meets 503s, not
// an accept() that fails for everyone.
Status fit_open_files(server::ServerOptions& o) {
  constexpr rlim_t k_reserve = 128;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return {};
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? std::max<rlim_t>(lim.rlim_cur, 65536) : lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur == RLIM_INFINITY) return {};
  if (lim.rlim_cur <= k_reserve + 16)
    return make_error("the open-file limit (%llu) is too low to serve; raise it with ulimit -n",
                      static_cast<unsigned long long>(lim.rlim_cur));
  const size_t fit = static_cast<size_t>(lim.rlim_cur - k_reserve);
  if (o.max_connections > fit) {
    std::fprintf(stderr, "dsv4 serve: --max-connections %zu lowered to %zu (open-file limit %llu)\n", o.max_connections,
                 fit, static_cast<unsigned long long>(lim.rlim_cur));
    o.max_connections = fit;
  }
  return {};
}

extern "C" void on_stop_signal(int) { g_signals.fetch_add(1); }

expected<std::unique_ptr<runtime::Backend>> make_backend(const ServeArgs& a) {
  if (!a.script.empty()) {
    std::ifstream in(a.script, std::ios::binary);
    if (!in) return make_error("cannot read the script %s", a.script.c_str());
    std::stringstream ss;
    ss << in.rdbuf();
    DSV4_TRY_ASSIGN(auto json, parse_json_text(ss.str()));
    auto replies = runtime::scripted_replies_from_json(json);
    if (!replies) return replies.error().with_context(a.script);
    DSV4_TRY_ASSIGN(auto tok, load_vocabulary(a.engine.model_path));
    if (!a.cache.disk_dir.empty() || a.cache.sessions > 1 || a.batching.parallel > 1)
      std::fprintf(stderr,
                   "dsv4 serve: --script runs no model: --kv-disk-dir, --sessions and --parallel are ignored\n");
    return std::unique_ptr<runtime::Backend>(
        std::make_unique<runtime::ScriptedBackend>(std::move(tok), a.engine.ctx, std::move(*replies)));
  }
  std::fprintf(stderr, "dsv4 serve: %s\n", a.engine.describe().c_str());
  DSV4_TRY_ASSIGN(auto engine, Engine::load(a.engine));
  DSV4_TRY_ASSIGN(auto backend, runtime::EngineBackend::create(std::move(engine), a.engine.ctx, a.cache, a.batching));
  std::fprintf(stderr, "dsv4 serve: cache: %s\n", backend->describe_cache().c_str());
  return std::unique_ptr<runtime::Backend>(std::move(backend));
}

int run_serve(ServeArgs a) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "dsv4 serve: error: %s\n", m.c_str());
    return 1;
  };
  a.engine.cuda = cuda_options_for(a.cuda);
  if (a.server.port < 0 || a.server.port > 65535) return fail("--port must be between 0 and 65535");
  if (a.server.max_queue == 0) return fail("--queue must be at least 1");
  if (a.max_body_mb == 0 || a.max_body_mb > 4096) return fail("--max-body-mb must be between 1 and 4096");
  if (!(a.server.read_timeout_seconds >= 0.1 && a.server.read_timeout_seconds <= 3600))
    return fail("--read-timeout must be between 0.1 and 3600 seconds");
  if (a.server.max_client_connections < 1) return fail("--max-client-connections must be at least 1");
  if (auto st = fit_open_files(a.server); !st) return fail(st.error().message);
  if (auto st = check_kv_cache_options(a.cache); !st) return fail(st.error().message);
  if (a.batching.parallel < 1 || a.batching.parallel > 64) return fail("--parallel must be between 1 and 64");
  a.server.parallel = a.batching.parallel;
  auto draft = a.spec.draft_in_effect();
  if (!draft) return fail(draft.error().message);
  a.spec.apply(a.engine);
  a.batching.draft = *draft;
  a.batching.draft_margin = a.spec.margin;
  a.server.max_body_bytes = a.max_body_mb << 20;
  if (a.server.model_id.empty()) a.server.model_id = std::filesystem::path(a.engine.model_path).stem().string();
  if (a.server.model_id.empty()) a.server.model_id = "dsv4";

  auto backend = make_backend(a);
  if (!backend) return fail(backend.error().message);

  // Signals only now: while the model loads, Ctrl-C simply ends the process.
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);

  server::HttpServer http(a.server, **backend);
  if (auto st = http.bind(); !st) return fail(st.error().message);
  std::fprintf(stderr, "dsv4 serve: %s %s\n", a.server.describe().c_str(), a.cache.describe().c_str());
  std::fprintf(stderr, "dsv4 serve: model: %s\n", (*backend)->describe().c_str());
  if ((*backend)->context_size() < k_think_max_min_ctx)
    std::fprintf(stderr,
                 "dsv4 serve: thinking: on by default; reasoning_effort \"max\" runs as \"high\" because the context "
                 "(%u) is below %u tokens\n",
                 (*backend)->context_size(), k_think_max_min_ctx);
  std::fprintf(stderr, "dsv4 serve: listening on http://%s:%d (model ids:", a.server.host.c_str(), http.port());
  server::ModelCatalog catalog{a.server.model_id, a.server.aliases};
  for (const auto& id : catalog.ids()) std::fprintf(stderr, " %s", id.c_str());
  std::fprintf(stderr, ")\n");

  // The watcher turns signals into a graceful shutdown (first) or an
  // immediate one (second); shutdown runs on its own thread so a second
  // signal is seen while the first waits for requests to finish.
  std::atomic<bool> serving{true};
  std::thread graceful;
  std::thread watcher([&] {
    bool started = false, forced = false;
    while (serving) {
      const int n = g_signals.load();
      if (n >= 1 && !started) {
        started = true;
        std::fprintf(stderr, "dsv4 serve: stopping (send the signal again to cancel running requests now)\n");
        // An exception must not escape a thread (std::terminate: no saves).
        graceful = std::thread([&] {
          try {
            http.shutdown(false);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "dsv4 serve: error while stopping: %s\n", e.what());
          }
        });
      }
      if (n >= 2 && !forced) {
        forced = true;
        try {
          http.shutdown(true);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "dsv4 serve: error while stopping: %s\n", e.what());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto served = http.serve();
  serving = false;
  watcher.join();
  if (graceful.joinable()) graceful.join();
  http.shutdown(true);
  if (!served) return fail(served.error().message);
  std::fprintf(stderr, "dsv4 serve: stopped\n");
  return 0;
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  a->engine.ctx = 32768;
  CLI::App* cmd = app.add_subcommand("serve",
                                     "Serve the model over HTTP: OpenAI (chat, completions, responses) and "
                                     "Anthropic (messages) APIs with streaming and tool calls");
  cmd->add_option("-m,--model", a->engine.model_path, "Model GGUF")->required();
  cmd->add_option("-c,--ctx", a->engine.ctx, "Context of each live session in tokens (prompt + reply)")
      ->capture_default_str();
  add_backend_flags(cmd, &a->engine.backend, &a->engine.numerics);
  cmd->add_option("-t,--threads", a->engine.threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--batch", a->engine.prefill_batch,
                  "Tokens per prefill batch; 0 = the backend's default (CUDA 4096, CPU 512)")
      ->capture_default_str();
  cmd->add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->server.port, "Port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", a->server.api_key,
                  "Require this key on every endpoint but /health ('Authorization: Bearer KEY' or 'x-api-key: KEY')")
      ->envname("DSV4_API_KEY");
  cmd->add_option(
      "--cors", a->server.cors_origin,
      "Send CORS headers allowing this origin (e.g. * or http://localhost:3000); without --api-key, browser "
      "requests from any other origin are refused");
  cmd->add_option("--allowed-hosts", a->server.allowed_hosts,
                  "Without --api-key, Host names accepted beside localhost, 127.0.0.1, [::1] and the bound address "
                  "(comma-separated or repeated; * accepts any)")
      ->delimiter(',');
  cmd->add_option("--model-id", a->server.model_id, "Model id to serve (default: the model file name without .gguf)");
  cmd->add_option("--alias", a->server.aliases,
                  "Another model name to accept (repeatable); deepseek-v4-flash, deepseek-chat (thinking off) and "
                  "deepseek-reasoner (thinking on) are always accepted");
  cmd->add_option("--queue", a->server.max_queue, "Requests that may wait for the engine; more get 503")
      ->capture_default_str();
  cmd->add_option("--max-body-mb", a->max_body_mb, "Largest request body in MiB; larger ones get 413")
      ->capture_default_str();
  cmd->add_option(
         "--http-threads", a->server.http_threads,
         "HTTP threads, which serve complete requests (0: queue + parallel + 16); slow or idle connections hold "
         "none")
      ->capture_default_str();
  cmd->add_option("--read-timeout", a->server.read_timeout_seconds,
                  "Seconds a request's headers and body may take to arrive from its first byte; slower ones get 408")
      ->capture_default_str();
  cmd->add_option("--max-client-connections", a->server.max_client_connections,
                  "Open connections one client address may hold; more are answered 429 and closed")
      ->capture_default_str();
  cmd->add_option("--max-connections", a->server.max_connections,
                  "Open connections in all (at most the open-file limit less a reserve); more are answered 503")
      ->capture_default_str();
  cmd->add_option("--keepalive", a->server.keepalive_seconds,
                  "Seconds of silence after which a stream gets a keepalive (comment or Anthropic ping)")
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", a->server.shutdown_grace_seconds,
                  "Seconds in-flight requests get to finish after SIGINT/SIGTERM before they are cancelled")
      ->capture_default_str();
  add_kv_cache_flags(cmd, &a->cache, /*with_sessions=*/true);
  cmd->add_option("--parallel,--batched-session", a->batching.parallel,
                  "Requests generating at once; their forward passes are batched into one step (continuous "
                  "batching). Each holds a resident session: --sessions is raised to at least this")
      ->capture_default_str();
  cmd->add_option("--step-tokens", a->batching.step_tokens,
                  "With --parallel: tokens one batched step takes at most, decode rows first, then prompt chunks "
                  "(0: the prefill batch). Smaller keeps decoding smoother beside long prompts")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a->batching.prefill_chunk,
                  "With --parallel: prompt tokens a step takes while other requests decode (0: a quarter of "
                  "--step-tokens); smaller gives them their next token sooner, larger prefills faster")
      ->capture_default_str();
  cmd->add_option("--script", a->script,
                  "Reply from this JSON script instead of running the model (client testing; only the model's "
                  "vocabulary is loaded; see src/runtime/scripted_backend.h)");
  add_speculation_flags(cmd, &a->spec);
  add_expert_stats_flag(cmd, &a->engine.expert_stats);
  add_cuda_flags(cmd, &a->cuda);
  cmd->callback([a] { set_exit_code(run_serve(*a)); });
}

}  // namespace dsv4::tools
