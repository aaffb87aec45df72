#include "server/http_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace dsv4::server {

namespace {

using Clock = std::chrono::steady_clock;

thread_local int t_socket = -1;

constexpr size_t k_read_chunk = size_t{64} << 10;
constexpr size_t k_read_round = size_t{1} << 20;    // bytes read from one connection per poll round
constexpr auto k_linger = std::chrono::seconds(2);  // a refused connection's unread input is drained this long

Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int poll_ms(Clock::duration d) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(d).count();
  return static_cast<int>(std::clamp<decltype(ms)>(ms, 0, 1000));
}

const char* reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

// A whole response for a request the transport refuses; the connection closes after it.
std::string refusal_response(int status, const std::string& body) {
  std::string s =
      strfmt("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n", status,
             reason_phrase(status), body.size());
  if (status == 429 || status == 503) s += "Retry-After: 1\r\n";
  return s + "\r\n" + body;
}

// Best effort on a non-blocking socket: what the send buffer takes now.
void send_now(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::send(fd, s.data(), s.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    s.remove_prefix(static_cast<size_t>(n));
  }
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  const int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (rc != 0 || ::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof host, serv, sizeof serv,
                               NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    ip = "unknown";
    port = -1;
    return;
  }
  ip = host;
  port = std::atoi(serv);
}

// httplib's listener hands each accepted socket to its task queue; this one
// runs the hand-over inline (process_and_close_socket only registers the
// socket with the reactor), so no listener-side thread pool exists.
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// One request's bytes for httplib to parse; the response goes to the socket
// (each write waits at most the write timeout) or, without one, to `sink`.
class RequestStream : public httplib::Stream {
 public:
  RequestStream(std::string_view request, int fd, Clock::duration write_timeout, std::string* sink,
                const std::string& remote_ip, int remote_port, const std::string& local_ip, int local_port)
      : in_(request),
        fd_(fd),
        write_timeout_(write_timeout),
        sink_(sink),
        remote_ip_(remote_ip),
        remote_port_(remote_port),
        local_ip_(local_ip),
        local_port_(local_port) {}

  bool is_readable() const override { return pos_ < in_.size(); }
  bool is_writable() const override { return sink_ || wait_writable(write_timeout_); }
  ssize_t read(char* p, size_t n) override {
    n = std::min(n, in_.size() - pos_);
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* p, size_t n) override {
    if (sink_) {
      sink_->append(p, n);
      return static_cast<ssize_t>(n);
    }
    const auto deadline = Clock::now() + write_timeout_;
    size_t done = 0;
    while (done < n) {
      const ssize_t k = ::send(fd_, p + done, n - done, MSG_NOSIGNAL);
      if (k > 0) {
        done += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_writable(deadline - Clock::now())) continue;
      return -1;  // the peer is gone, or it has not read for the whole write timeout
    }
    return static_cast<ssize_t>(n);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = remote_ip_;
    port = remote_port_;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_ip_;
    port = local_port_;
  }
  socket_t socket() const override { return fd_; }

 private:
  bool wait_writable(Clock::duration limit) const {
    if (limit <= Clock::duration::zero()) return false;
    pollfd p{fd_, POLLOUT, 0};
    const int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(limit).count());
    int rc;
    do rc = ::poll(&p, 1, ms);
    while (rc < 0 && errno == EINTR);
    return rc > 0 && (p.revents & POLLOUT) && !(p.revents & (POLLERR | POLLHUP | POLLNVAL));
  }

  std::string_view in_;
  size_t pos_ = 0;
  int fd_;
  Clock::duration write_timeout_;
  std::string* sink_;
  const std::string& remote_ip_;
  int remote_port_;
  const std::string& local_ip_;
  int local_port_;
};

struct Conn {
  int fd = -1;
  std::string client, local_ip;
  int client_port = -1, local_port = -1;
  std::string buf;                      // received, not yet handed to a worker
  std::optional<RequestFramer> framer;  // set from the current request's first byte
  bool continue_sent = false;
  bool draining = false;  // refused: reading and dropping until the peer closes or the linger ends
  Clock::time_point deadline;
  size_t served = 0;
};

}  // namespace

struct HttpTransport::Loop {
  HttpTransport& owner;
  const TransportOptions o;
  const RefusalHook hook;

  mutable std::mutex mu;
  bool stopping = false;
  size_t open = 0;
  std::atomic<size_t> buffered{0};  // bytes of unfinished requests the reactor holds (its last count)
  std::unordered_map<std::string, size_t> per_client;
  std::vector<std::unique_ptr<Conn>> incoming;  // new or returned by a worker; the reactor takes them
  std::deque<std::unique_ptr<Conn>> ready;      // a complete request each, waiting for a worker
  std::unordered_set<int> serving;              // sockets in workers
  std::condition_variable ready_cv;
  int wake_fds[2] = {-1, -1};

  std::thread reactor;
  std::vector<std::thread> workers;
  std::vector<std::unique_ptr<Conn>> conns;  // the reactor's own

  Loop(HttpTransport& t, TransportOptions opts, RefusalHook h) : owner(t), o(std::move(opts)), hook(std::move(h)) {
    DSV4_ASSERT(::pipe2(wake_fds, O_NONBLOCK | O_CLOEXEC) == 0, "pipe2 failed");
    reactor = std::thread([this] { reactor_loop(); });
    for (int i = 0; i < std::max(1, o.threads); ++i) workers.emplace_back([this] { worker_loop(); });
  }
  ~Loop() {
    stop();
    ::close(wake_fds[0]);
    ::close(wake_fds[1]);
  }

  void wake() {
    const char c = 1;
    (void)!::write(wake_fds[1], &c, 1);
  }

  void close_conn(std::unique_ptr<Conn> c) {
    ::close(c->fd);
    std::lock_guard<std::mutex> lock(mu);
    --open;
    auto it = per_client.find(c->client);
    if (it != per_client.end() && --it->second == 0) per_client.erase(it);
  }

  std::string refusal_body(int status, std::string message, const RequestFramer* f, const std::string& client) {
    TransportRefusal r{status, std::move(message), f ? f->method() : "", f ? f->target() : "", client};
    return refusal_response(status, hook ? hook(r) : std::string("{}"));
  }

  // Answers and stops reading requests: the connection lingers so the
  // client reads the answer instead of a reset from unread input.
  void refuse(Conn& c, int status, std::string message) {
    send_now(c.fd, refusal_body(status, std::move(message), c.framer ? &*c.framer : nullptr, c.client));
    ::shutdown(c.fd, SHUT_WR);
    c.draining = true;
    c.buf.clear();
    c.deadline = Clock::now() + k_linger;
  }

  // Called on the listener thread for every accepted socket.
  void accept(int fd) {
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    address_of(fd, true, c->client, c->client_port);
    address_of(fd, false, c->local_ip, c->local_port);
    int status = 0;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping) {
        status = 503;
        why = "the server is shutting down";
      } else if (open >= o.max_connections) {
        status = 503;
        why = strfmt("the server has %zu open connections, its limit", o.max_connections);
      } else if (per_client[c->client] >= o.max_connections_per_client) {
        status = 429;
        why = strfmt("too many open connections from %s (the limit is %zu per client address)", c->client.c_str(),
                     o.max_connections_per_client);
      } else {
        ++per_client[c->client];
        ++open;
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
        c->deadline = Clock::now() + to_duration(o.idle_timeout_seconds);
        incoming.push_back(std::move(c));
      }
      if (status == 0) {
        wake();
        return;
      }
      if (per_client[c->client] == 0) per_client.erase(c->client);
    }
    send_now(fd, refusal_body(status, why, nullptr, c->client));
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }

  enum class Next { WAIT, DISPATCH, CLOSE };

  // Frames what the connection has sent so far.
  Next advance(Conn& c, Clock::time_point now) {
    if (c.buf.empty()) {
      c.framer.reset();
      return Next::WAIT;
    }
    if (!c.framer) {
      c.framer.emplace(o.framing);
      c.continue_sent = false;
      c.deadline = now + to_duration(o.read_timeout_seconds);
    }
    RequestFramer& f = *c.framer;
    switch (f.feed(c.buf)) {
      case RequestFramer::State::BAD: refuse(c, f.status(), f.message()); return Next::WAIT;
      case RequestFramer::State::COMPLETE: return Next::DISPATCH;
      case RequestFramer::State::INCOMPLETE:
        if (f.head_complete() && f.expect_continue() && !c.continue_sent && !f.body_started(c.buf)) {
          send_now(c.fd, "HTTP/1.1 100 Continue\r\n\r\n");
          c.continue_sent = true;
        }
        return Next::WAIT;
    }
    DSV4_UNREACHABLE();
  }

  // Reads what is there, at most `limit` bytes (in k_read_chunk reads);
  // false once the peer has closed its side (or the socket failed).
  static bool receive(Conn& c, size_t limit) {
    static thread_local char tmp[k_read_chunk];
    for (size_t got = 0; got < limit;) {
      const ssize_t n = ::recv(c.fd, tmp, sizeof tmp, 0);
      if (n > 0) {
        if (!c.draining) c.buf.append(tmp, static_cast<size_t>(n));
        got += static_cast<size_t>(n);
        if (static_cast<size_t>(n) < sizeof tmp) return true;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
    return true;
  }

  void reactor_loop() {
    std::vector<pollfd> fds;
    for (;;) {
      std::vector<std::unique_ptr<Conn>> arrived;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) break;
        arrived.swap(incoming);
      }
      auto now = Clock::now();
      for (auto& c : arrived) {
        // A returning connection may hold the next (pipelined) request already.
        if (!c->buf.empty() && advance(*c, now) == Next::DISPATCH) {
          dispatch(std::move(c));
          continue;
        }
        conns.push_back(std::move(c));
      }

      // Memory: past max_buffered_bytes of unfinished requests, connections
      // that hold part of one are not read (TCP pushes back on their
      // senders) until requests complete and leave for the workers; new
      // requests are still read, so small ones get through.
      size_t held = 0;
      for (const auto& c : conns) held += c->buf.size();
      buffered = held;
      fds.assign(1, pollfd{wake_fds[0], POLLIN, 0});
      Clock::time_point next = now + std::chrono::seconds(1);
      for (const auto& c : conns) {
        const bool read = held < o.max_buffered_bytes || c->buf.empty() || c->draining;
        fds.push_back(pollfd{c->fd, static_cast<short>(read ? POLLIN | POLLRDHUP : POLLRDHUP), 0});
        next = std::min(next, c->deadline);
      }
      int rc;
      do rc = ::poll(fds.data(), fds.size(), poll_ms(next - now));
      while (rc < 0 && errno == EINTR);
      if (fds[0].revents & POLLIN) {
        char drain[256];
        while (::read(wake_fds[0], drain, sizeof drain) > 0) {
        }
      }
      now = Clock::now();
      for (size_t i = 0; i < conns.size(); ++i) {
        Conn& c = *conns[i];
        Next next_step = Next::WAIT;
        // Over the budget, a connection holding part of a request is not
        // read (it stays readable for a later round) and others get one
        // chunk, enough for a small request.
        const bool over = held >= o.max_buffered_bytes;
        if (fds[i + 1].revents != 0 && !(over && !c.buf.empty() && !c.draining)) {
          const size_t before = c.buf.size();
          const bool open_still = receive(c, over ? k_read_chunk : k_read_round);
          held += c.buf.size() - before;
          if (!c.draining) next_step = advance(c, now);
          // A peer that sent a whole request and then shut its side down
          // (printf ... | nc) is answered; the connection closes after it.
          if (!open_still && next_step == Next::DISPATCH)
            c.served = o.keep_alive_max_requests;
          else if (!open_still)
            next_step = Next::CLOSE;
        }
        if (next_step == Next::WAIT && now >= c.deadline) {
          if (c.draining || !c.framer)
            next_step = Next::CLOSE;  // linger over, or idle between requests
          else
            refuse(c, 408, strfmt("the request did not arrive within %g s (--read-timeout)", o.read_timeout_seconds));
        }
        if (next_step == Next::CLOSE)
          close_conn(std::move(conns[i]));
        else if (next_step == Next::DISPATCH)
          dispatch(std::move(conns[i]));
      }
      std::erase_if(conns, [](const std::unique_ptr<Conn>& c) { return !c; });
    }
    for (auto& c : conns) close_conn(std::move(c));
    conns.clear();
  }

  void dispatch(std::unique_ptr<Conn> c) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ready.push_back(std::move(c));
    }
    ready_cv.notify_one();
  }

  void worker_loop() {
    for (;;) {
      std::unique_ptr<Conn> c;
      {
        std::unique_lock<std::mutex> lock(mu);
        ready_cv.wait(lock, [&] { return stopping || !ready.empty(); });
        if (stopping) return;
        c = std::move(ready.front());
        ready.pop_front();
        serving.insert(c->fd);
      }
      const bool keep = serve(*c);
      bool closing = !keep;
      {
        std::lock_guard<std::mutex> lock(mu);
        serving.erase(c->fd);
        if (keep && !stopping) {
          c->deadline = Clock::now() + to_duration(o.idle_timeout_seconds);
          incoming.push_back(std::move(c));
        } else {
          closing = true;
        }
      }
      if (closing) {
        ::shutdown(c->fd, SHUT_RDWR);
        close_conn(std::move(c));
      } else {
        wake();
      }
    }
  }

  // The complete request at the front of c.buf, without its Expect line.
  static std::string take_request(Conn& c) {
    const RequestFramer& f = *c.framer;
    const size_t n = f.request_bytes();
    std::string request;
    if (n == c.buf.size()) {
      request = std::move(c.buf);
      c.buf.clear();
    } else {
      request = c.buf.substr(0, n);
      c.buf.erase(0, n);
    }
    if (f.expect_continue()) request.erase(f.expect_line().first, f.expect_line().second - f.expect_line().first);
    c.framer.reset();
    return request;
  }

  // Runs one request through httplib; true when the connection stays open.
  bool serve(Conn& c) {
    const std::string request = take_request(c);
    const bool last = ++c.served >= o.keep_alive_max_requests;
    RequestStream strm(request, c.fd, to_duration(o.write_timeout_seconds), nullptr, c.client, c.client_port,
                       c.local_ip, c.local_port);
    t_socket = c.fd;
    bool closed = false, ok = false;
    try {
      ok = owner.process_request(strm, last, closed, nullptr);
    } catch (const std::exception& e) {
      log_warn("HTTP request from %s failed: %s", c.client.c_str(), e.what());
    }
    t_socket = -1;
    return ok && !closed && !last;
  }

  std::string serve_bytes(std::string_view bytes) {
    std::string out;
    const std::string local = "127.0.0.1";
    Conn c;
    c.buf.assign(bytes);
    c.client = local;
    while (!c.buf.empty()) {
      c.framer.emplace(o.framing);
      const auto st = c.framer->feed(c.buf);
      if (st == RequestFramer::State::INCOMPLETE) break;
      if (st == RequestFramer::State::BAD) {
        out += refusal_body(c.framer->status(), c.framer->message(), &*c.framer, c.client);
        break;
      }
      const std::string request = take_request(c);
      RequestStream strm(request, -1, to_duration(o.write_timeout_seconds), &out, local, 0, local, 0);
      t_socket = -1;
      bool closed = false;
      const bool ok = owner.process_request(strm, false, closed, nullptr);
      if (!ok || closed) break;
    }
    return out;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopping && !reactor.joinable()) return;
      stopping = true;
      for (int fd : serving) ::shutdown(fd, SHUT_RDWR);
    }
    wake();
    ready_cv.notify_all();
    if (reactor.joinable()) reactor.join();
    for (auto& w : workers)
      if (w.joinable()) w.join();
    workers.clear();
    std::vector<std::unique_ptr<Conn>> left;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto& c : incoming) left.push_back(std::move(c));
      for (auto& c : ready) left.push_back(std::move(c));
      incoming.clear();
      ready.clear();
    }
    for (auto& c : left) close_conn(std::move(c));
  }
};

HttpTransport::HttpTransport(TransportOptions options, RefusalHook on_refusal) {
  set_payload_max_length(options.framing.max_body_bytes);
  set_keep_alive_max_count(options.keep_alive_max_requests);
  set_tcp_nodelay(true);
  new_task_queue = [] { return new InlineQueue(); };
  loop_ = std::make_unique<Loop>(*this, std::move(options), std::move(on_refusal));
}

HttpTransport::~HttpTransport() { stop_connections(); }

void HttpTransport::raise_backlog(int n) {
  const auto s = svr_sock_.load();
  if (s != INVALID_SOCKET) ::listen(s, n);
}

void HttpTransport::close_listener() {
  const socket_t s = svr_sock_.exchange(INVALID_SOCKET);
  if (s == INVALID_SOCKET) return;
  ::shutdown(s, SHUT_RDWR);
  ::close(s);
}

void HttpTransport::stop_connections() { loop_->stop(); }

int HttpTransport::current_socket() { return t_socket; }

std::string HttpTransport::serve_bytes(std::string_view bytes) { return loop_->serve_bytes(bytes); }

size_t HttpTransport::buffered_bytes() const { return loop_->buffered.load(); }

size_t HttpTransport::open_connections() const {
  std::lock_guard<std::mutex> lock(loop_->mu);
  return loop_->open;
}

bool HttpTransport::process_and_close_socket(socket_t sock) {
  loop_->accept(sock);
  return true;
}

}  // namespace dsv4::server
