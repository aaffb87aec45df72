// The connection layer of `dsv4 serve`: cpp-httplib's request parsing,
// routing and response writing, under a socket loop of our own that decides
// what a client may hold.
//
//   accept      (httplib's listener thread) a connection beyond
//               max_connections_per_client from one address, or beyond
//               max_connections in all, is answered 429 / 503 and closed.
//   reactor     one thread polls every connection that is not being served:
//               it reads, frames the request (http_framing.h: body limit for
//               every transfer encoding, head limit, strict framing) and
//               enforces the deadlines — a request's head and body must
//               arrive within read_timeout of its first byte (else 408), an
//               idle keep-alive connection is closed after idle_timeout.
//               It answers "100 Continue" itself. Slow or idle clients
//               cost a socket and a buffer, never an HTTP thread; past
//               max_buffered_bytes of unfinished requests it stops reading
//               the connections that hold them.
//   workers     `threads` HTTP threads get only complete requests; each runs
//               httplib's process_request over the request's bytes (the
//               handler never waits for the client to send) and writes the
//               response with write_timeout per write; the connection then
//               goes back to the reactor (keep-alive) or is closed.
//
// Invariant: a connection is in exactly one place at a time — the reactor's
// set or one worker — so its buffer and socket have one owner.
#pragma once

#include <httplib.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "server/http_framing.h"

namespace dsv4::server {

struct TransportOptions {
  int threads = 16;                        // HTTP threads (workers)
  double read_timeout_seconds = 30;        // a request's head and body, from its first byte
  double idle_timeout_seconds = 5;         // keep-alive: silence allowed between two requests
  double write_timeout_seconds = 60;       // one blocked write of a response
  size_t max_connections_per_client = 64;  // open connections from one address
  size_t max_connections = 1024;           // open connections in all
  size_t keep_alive_max_requests = 1000;   // requests on one connection
  // Bytes of unfinished requests the reactor holds at most before it stops
  // reading the connections that hold them (backpressure; one read round of
  // 1 MiB per connection may pass it).
  size_t max_buffered_bytes = size_t{256} << 20;
  FramingLimits framing;
};

// A request the transport answered itself (it never reached a handler).
struct TransportRefusal {
  int status = 0;       // 400, 408, 413, 417, 429, 431, 501, 503, 505
  std::string message;  // why, for the client and the log
  std::string method;   // empty when the request line never arrived
  std::string target;
  std::string client;  // numeric peer address
};

class HttpTransport : public httplib::Server {
 public:
  // Turns a refusal into the response body (JSON in the route's dialect) and
  // records it (log line, metrics). Called on the reactor or accept thread.
  using RefusalHook = std::function<std::string(const TransportRefusal&)>;

  HttpTransport(TransportOptions options, RefusalHook on_refusal);
  ~HttpTransport() override;

  // Raises the listen backlog after binding (Debian's build listens with 5).
  void raise_backlog(int n);
  // Closes the listening socket, also before listen_after_bind() has
  // started (then it returns at once; httplib's stop() acts only on a
  // running listener, so a stop racing the start would be lost).
  void close_listener();
  // After close_listener(): closes every connection (aborting responses
  // still being written) and joins the reactor and the workers.
  void stop_connections();

  // The connected socket of the request this thread is handling; -1 outside
  // a handler and in serve_bytes(). Valid until the handler returns (or its
  // streamed response ends).
  static int current_socket();

  // Feeds `bytes` to the framing and the handlers as one connection would
  // (pipelined requests, keep-alive) and returns everything the server wrote
  // back; a request left incomplete at the end is dropped. No socket is
  // involved: tests and the HTTP fuzzer.
  std::string serve_bytes(std::string_view bytes);

  size_t open_connections() const;
  // Bytes of unfinished requests in the reactor (as of its last poll round).
  size_t buffered_bytes() const;

  struct Loop;

 private:
  bool process_and_close_socket(socket_t sock) override;

  std::unique_ptr<Loop> loop_;
};

}  // namespace dsv4::server
