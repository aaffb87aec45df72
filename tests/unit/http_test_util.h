// Helpers of the tests that run `dsv4 serve`'s HTTP layer on loopback: a
// server on a free port with the scripted fake engine, and raw sockets so a
// test decides exactly what a client sends and when it hangs up.
#pragma once

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/http_server.h"
#include "server_test_util.h"

namespace dsv4::server::test {

using namespace dsv4::runtime;

using namespace std::chrono_literals;

struct Running {
  std::unique_ptr<ScriptedBackend> backend;
  std::unique_ptr<HttpServer> http;
  std::thread thread;
  int port = 0;

  Running(ServerOptions o, std::vector<ScriptedReply> replies, uint32_t ctx = 4096) {
    o.host = "127.0.0.1";
    o.port = 0;
    if (o.model_id.empty()) o.model_id = "tiny";
    backend = make_backend(std::move(replies), ctx);
    http = std::make_unique<HttpServer>(o, *backend);
    auto st = http->bind();
    EXPECT_TRUE(st.has_value());
    port = http->port();
    thread = std::thread([this] { (void)http->serve(); });
  }
  ~Running() {
    http->shutdown(true);
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(20, 0);
    return c;
  }
  std::string metrics() const {
    auto r = client().Get("/metrics");
    return r ? r->body : "";
  }
  // Waits until `needle` shows up in /metrics (the request log runs after a
  // response is written, so counters lag the client by a moment).
  bool metrics_show(const std::string& needle,
                    std::chrono::milliseconds limit = std::chrono::milliseconds(3000)) const {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < end) {
      if (metrics().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

// A connected loopback socket (-1 on failure); reads give up after 10 s.
inline int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& s) {
  return ::send(fd, s.data(), s.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(s.size());
}

// A raw HTTP/1.1 request on its own socket, so the test decides when to hang up.
inline int open_request(int port, const std::string& path, const std::string& body) {
  int fd = connect_to(port);
  if (fd < 0) return -1;
  const std::string req = "POST " + path +
                          " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  if (::send(fd, req.data(), req.size(), 0) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until `needle` arrived (or the peer closed); returns what was read.
inline std::string read_until(int fd, const std::string& needle) {
  std::string got;
  char buf[4096];
  while (got.find(needle) == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

}  // namespace dsv4::server::test
