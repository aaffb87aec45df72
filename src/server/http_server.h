// The HTTP layer of `dsv4 serve`: routes, who may ask, request log,
// metrics, SSE streaming with keepalive, disconnect detection and graceful
// shutdown, over the connection layer of http_transport.h (framing, body and
// head limits, read/idle/write timeouts, connection caps). It parses nothing
// itself: each route hands the JSON body to its dialect adapter, which
// returns a typed job for the runtime (runtime/runtime.h) and a writer for the reply
// (reply_writer.h).
//
// Routes:
//   GET  /health                     {"status": "ok", ...}; 503 while shutting down; never needs a key
//   GET  /metrics                    Prometheus text (metrics.h)
//   GET  /v1/models                  OpenAI list; Anthropic's shape when an anthropic-version header is sent
//   POST /v1/chat/completions        openai_chat.h
//   POST /v1/completions             openai_completions.h
//   POST /v1/responses               openai_responses.h
//   POST /v1/messages                anthropic_messages.h
//   POST /v1/messages/count_tokens   anthropic_messages.h
//   OPTIONS *                        CORS preflight (only with a CORS origin)
//
// Rules:
//   * with an API key, every route but /health (and CORS preflights) needs
//     "Authorization: Bearer KEY" or "x-api-key: KEY" (constant-time check;
//     either matching is enough); otherwise 401 in the dialect's error shape;
//   * without an API key: the Host header must name this server (localhost,
//     127.0.0.1, [::1], the bound address, --allowed-hosts; any IP literal
//     when bound to all interfaces), a request with an Origin header must
//     come from the --cors origin, and POST bodies must be application/json
//     (403 / 403 / 415) — so web pages cannot use or read a local server;
//   * errors are JSON in the dialect's shape (Anthropic for /v1/messages*,
//     OpenAI elsewhere), including httplib's and the transport's own;
//   * a full queue answers 503 with Retry-After: 1; a queued request whose
//     client left gives its slot back at once;
//   * a client that disconnects cancels its job: the socket is polled every
//     50 ms while the request is queued, prefilling or decoding, and a failed
//     write cancels too;
//   * streams send the dialect's keepalive (a comment, or Anthropic's ping)
//     when nothing was written for keepalive_seconds;
//   * one log line per request: method, path, status, prompt/cached/completion
//     tokens, milliseconds (control characters escaped by the logger);
//     metrics count requests per route (a fixed set of labels).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/error.h"
#include "runtime/runtime.h"
#include "server/chat_request.h"
#include "server/metrics.h"
#include "server/server_options.h"

namespace dsv4::server {

class HttpServer {
 public:
  HttpServer(ServerOptions options, runtime::Backend& backend);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket (an error names the address).
  Status bind();
  int port() const { return port_; }
  // Serves until shutdown() has finished; blocking.
  Status serve();
  // Graceful shutdown, callable from any thread: refuse new generation
  // requests, give in-flight ones shutdown_grace_seconds to finish, cancel
  // the rest, stop the worker, save the live sessions to the disk cache and
  // wait for its writes (Backend::shutdown), stop the listener. `now`:
  // cancel at once and skip the session saves.
  void shutdown(bool now = false);

  // Runs raw request bytes through the transport's framing and the handlers
  // as one connection would, without a socket; returns what the server wrote
  // (HttpTransport::serve_bytes). Call bind() first: httplib cuts streamed
  // responses short on a server without a listening socket. Tests and the
  // HTTP fuzzer.
  std::string serve_bytes(std::string_view bytes);

  // Bytes of unfinished requests the connection layer holds (HttpTransport::buffered_bytes).
  size_t buffered_request_bytes() const;

  Metrics& metrics() { return metrics_; }
  runtime::Runtime& runtime() { return *runtime_; }
  runtime::ToolMemory& tool_memory() { return runtime_->tool_memory(); }
  int active_requests() const { return active_.load(); }

  struct Impl;

 private:
  ServerOptions options_;
  Metrics metrics_;  // before runtime_: its worker reports here until it stops
  std::unique_ptr<runtime::Runtime> runtime_;
  ServeContext context_;
  std::unique_ptr<Impl> impl_;
  int port_ = -1;
  std::atomic<bool> draining_{false};
  std::atomic<bool> force_{false};  // shutdown(true) was asked for: stop waiting
  std::atomic<int> active_{0};
  std::mutex shutdown_mu_;  // the final steps run once
  bool stopped_ = false;
};

}  // namespace dsv4::server
