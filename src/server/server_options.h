// Options of `dsv4 serve` (filled from the command line, printed at start).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dsv4::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;          // 0: any free port (tests)
  std::string api_key;      // empty: no authentication (then Host, Origin and Content-Type are checked)
  std::string cors_origin;  // empty: no CORS headers, and browser requests (Origin) are refused when keyless
  std::vector<std::string> allowed_hosts;  // Host names a keyless server accepts beside its own ("*": any)
  std::string model_id;                    // the served model id
  std::vector<std::string> aliases;        // extra accepted model names
  size_t max_queue = 64;                   // jobs waiting for the engine; more get 503
  size_t max_body_bytes = size_t{32} << 20;
  size_t parallel = 1;                 // requests the runtime runs at once (--parallel), for the thread count
  int http_threads = 0;                // 0: max_queue + parallel + 16
  double read_timeout_seconds = 30;    // a request's head and body must arrive within this (408)
  double idle_timeout_seconds = 5;     // keep-alive connections idle longer are closed
  double write_timeout_seconds = 60;   // a response write blocked longer drops the connection
  size_t max_client_connections = 64;  // open connections per client address (more: 429)
  size_t max_connections = 1024;       // open connections in all (more: 503)
  size_t max_buffered_bytes = 0;       // unfinished request bytes held before reads pause (0: max(4 bodies, 256 MiB))
  double keepalive_seconds = 10;       // SSE keepalive while nothing else is written
  double shutdown_grace_seconds = 30;  // SIGINT/SIGTERM: time in-flight requests get to finish

  int effective_http_threads() const {
    return http_threads > 0 ? http_threads : static_cast<int>(max_queue + parallel) + 16;
  }
  std::string describe() const;  // one line, printed at start (never the API key)
};

}  // namespace dsv4::server
