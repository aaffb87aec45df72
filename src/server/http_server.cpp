#include "server/http_server.h"

#include <arpa/inet.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <ctime>
#include <thread>

#include "core/log.h"
#include "server/anthropic_messages.h"
#include "server/choices.h"
#include "server/connection.h"
#include "server/http_transport.h"
#include "server/json_util.h"
#include "server/openai_chat.h"
#include "server/openai_completions.h"
#include "server/openai_responses.h"
#include "server/reply_writer.h"

namespace dsv4::server {

namespace {

using clock_type = std::chrono::steady_clock;
constexpr auto k_poll = std::chrono::milliseconds(50);  // disconnect / event polling interval

// What the request log line reports; filled on the HTTP thread that serves
// the request (handlers, stream providers and the logger all run on it).
struct RequestLog {
  clock_type::time_point start = clock_type::now();
  bool has_tokens = false;
  size_t prompt = 0, cached = 0, completion = 0;
  std::string note;
};
thread_local RequestLog t_log;

enum class Endpoint { CHAT, COMPLETIONS, RESPONSES, MESSAGES };

ErrorShape shape_for_path(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ErrorShape::ANTHROPIC : ErrorShape::OPENAI;
}

void send_json(httplib::Response& res, int status, const ordered_json& j) {
  res.status = status;
  res.set_content(json_dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e, ErrorShape shape) {
  send_json(res, e.status(), error_json(e, shape));
  if (e.kind == ApiErrorKind::OVERLOADED) res.set_header("Retry-After", "1");
  if (e.kind == ApiErrorKind::AUTHENTICATION) res.set_header("WWW-Authenticate", "Bearer");
  t_log.note = e.message.size() > 160 ? e.message.substr(0, 160) + "..." : e.message;
}

void record_tokens(const FinalReply& r) {
  t_log.has_tokens = true;
  t_log.prompt = r.prompt_tokens;
  t_log.cached = r.cached_tokens;
  t_log.completion = r.completion_tokens;
}

void record_tokens(const GenerateResult& r) {
  t_log.has_tokens = true;
  t_log.prompt = r.prompt_tokens;
  t_log.cached = r.cached_tokens;
  t_log.completion = r.tokens.size();
}

// At most `n` bytes of client-supplied text for a log line (the logger
// escapes control characters).
std::string clip(std::string_view s, size_t n = 200) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The host of a Host header value ("name", "name:port", "[v6]", "[v6]:port"),
// lowercase, without brackets or a trailing dot.
std::string host_of(std::string_view value) {
  value = trim(value);
  std::string_view h = value;
  if (!h.empty() && h.front() == '[') {
    const size_t close = h.find(']');
    h = close == std::string_view::npos ? h.substr(1) : h.substr(1, close - 1);
  } else if (std::count(h.begin(), h.end(), ':') == 1) {
    h = h.substr(0, h.find(':'));
  }
  if (!h.empty() && h.back() == '.') h.remove_suffix(1);
  return lower(h);
}

bool is_ip_literal(const std::string& h) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, h.c_str(), buf) == 1 || inet_pton(AF_INET6, h.c_str(), buf) == 1;
}

// A keyless server answers only requests addressed to itself (DNS rebinding:
// a page of another site whose name now resolves to this machine sends its
// own name as Host): localhost, the loopback addresses, the bound address
// (any IP literal when bound to all interfaces), and --allowed-hosts.
bool host_allowed(const std::string& host, const ServerOptions& o) {
  for (const auto& a : o.allowed_hosts)
    if (a == "*" || host_of(a) == host) return true;
  if (host == "localhost" || host == "127.0.0.1" || host == "::1") return true;
  const std::string bound = host_of(o.host);
  if (host == bound) return true;
  return (bound == "0.0.0.0" || bound == "::" || bound.empty()) && is_ip_literal(host);
}

// application/json, with or without parameters (charset).
bool is_json_media_type(std::string_view content_type) {
  return iequals(trim(content_type.substr(0, content_type.find(';'))), "application/json");
}

// The rules for a server without an API key, where any local process and
// any web page the user opens can reach the port: the request must be
// addressed to this server (Host), not come from a page of another origin
// (Origin, unless --cors allows it), and POST bodies must be JSON (a
// text/plain POST needs no CORS preflight, so a page could send one).
std::optional<ApiError> keyless_refusal(const httplib::Request& req, const ServerOptions& o) {
  if (req.has_header("Host")) {
    const std::string host = host_of(req.get_header_value("Host"));
    if (!host_allowed(host, o))
      return ApiError{ApiErrorKind::PERMISSION,
                      "the Host header names '" + clip(host, 100) +
                          "', which is not this server: a server without --api-key answers requests to localhost, "
                          "127.0.0.1, [::1] and its own address (--allowed-hosts adds names)",
                      "", ""};
  }
  if (req.has_header("Origin")) {
    const std::string origin = req.get_header_value("Origin");
    if (o.cors_origin != "*" && !iequals(o.cors_origin, origin))
      return ApiError{ApiErrorKind::PERMISSION,
                      "cross-origin request refused: a server without --api-key answers browsers only from the origin "
                      "--cors allows",
                      "", ""};
  }
  if (req.method == "POST" && !is_json_media_type(req.get_header_value("Content-Type")))
    return ApiError{ApiErrorKind::UNSUPPORTED_MEDIA,
                    "the request body must be sent with Content-Type: application/json", "", ""};
  return std::nullopt;
}

// The API key of a request: "x-api-key: KEY" or "Authorization: Bearer KEY"
// (the scheme is case-insensitive); either one matching is enough.
bool key_matches(const httplib::Request& req, const std::string& key, bool& any_given) {
  const std::string x = req.get_header_value("x-api-key");
  const std::string auth = req.get_header_value("Authorization");
  std::string bearer;
  if (auth.size() > 7 && iequals(std::string_view(auth).substr(0, 7), "bearer "))
    bearer = trim(std::string_view(auth).substr(7));
  any_given = !x.empty() || !bearer.empty();
  // Both are compared, so the time taken does not tell which one matched.
  const bool x_ok = !x.empty() && api_key_matches(x, key);
  const bool bearer_ok = !bearer.empty() && api_key_matches(bearer, key);
  return x_ok || bearer_ok;
}

ApiError refusal_error(const TransportRefusal& r) {
  switch (r.status) {
    case 408: return ApiError{ApiErrorKind::REQUEST_TIMEOUT, r.message, "", ""};
    case 413: return ApiError{ApiErrorKind::PAYLOAD_TOO_LARGE, r.message, "", ""};
    case 429: return ApiError{ApiErrorKind::RATE_LIMITED, r.message, "", ""};
    case 503: return ApiError{ApiErrorKind::OVERLOADED, r.message, "", ""};
    default: return ApiError{ApiErrorKind::INVALID_REQUEST, r.message, "", "", r.status == 400 ? 0 : r.status};
  }
}

// Decrements the active-request count when the last owner lets go (the
// handler for plain replies, the stream provider for streams).
struct ActiveToken {
  std::atomic<int>& n;
  explicit ActiveToken(std::atomic<int>& count) : n(count) { ++n; }
  ~ActiveToken() { --n; }
  ActiveToken(const ActiveToken&) = delete;
  ActiveToken& operator=(const ActiveToken&) = delete;
};

ApiError cancelled_error() {
  return ApiError{ApiErrorKind::OVERLOADED, "the request was cancelled because the server is shutting down", "", ""};
}

ApiError invalid_output_error(ResponseFormat f) {
  return ApiError{ApiErrorKind::INVALID_OUTPUT,
                  f == ResponseFormat::JSON_OBJECT
                      ? "the model's reply is not a valid JSON object (response_format json_object is checked, not "
                        "enforced while decoding)"
                      : "the model's reply is not valid JSON (response_format json_schema is checked for JSON "
                        "syntax, not enforced while decoding)",
                  "response_format", ""};
}

// One streamed reply: pulled by cpp-httplib's chunked content provider on the
// connection's thread until the job has finished and the last frame is written.
struct StreamSession {
  std::shared_ptr<runtime::Job> job;
  runtime::Runtime& runtime;
  ReplyAssembler assembler;
  std::unique_ptr<ReplyWriter> writer;
  ResponseFormat format;
  int fd;
  clock_type::duration keepalive;
  std::shared_ptr<ActiveToken> active;
  bool begun = false;
  clock_type::time_point last_write = clock_type::now();

  StreamSession(std::shared_ptr<runtime::Job> j, runtime::Runtime& r, ReplyAssembler a, std::unique_ptr<ReplyWriter> w,
                ResponseFormat f, int socket, clock_type::duration ka, std::shared_ptr<ActiveToken> act)
      : job(std::move(j)),
        runtime(r),
        assembler(std::move(a)),
        writer(std::move(w)),
        format(f),
        fd(socket),
        keepalive(ka),
        active(std::move(act)) {}
  // The response (and with it this session) goes before the connection closes.
  ~StreamSession() { job->clear_client_check(); }
  StreamSession(const StreamSession&) = delete;
  StreamSession& operator=(const StreamSession&) = delete;

  // The client is gone: stop the job, and free its queue slot if it still waits.
  bool client_gone() {
    job->cancel = true;
    runtime.withdraw(job);
    t_log.note = "client disconnected";
    return false;
  }

  bool write(httplib::DataSink& sink, const std::string& s) {
    if (s.empty()) return true;
    if (!sink.write(s.data(), s.size())) return false;
    last_write = clock_type::now();
    return true;
  }

  // One provider call: waits up to one poll interval, writes what is ready.
  // Returns false to abort the response (client gone).
  bool pump(httplib::DataSink& sink) {
    std::string out;
    if (!begun) {
      out = writer->stream_begin();
      begun = true;
    }
    std::vector<DsmlEvent> events;
    const bool done = job->wait(events, out.empty() ? k_poll : std::chrono::milliseconds(0));
    std::vector<OutEvent> outs;
    for (const auto& e : events) assembler.on_event(e, outs);
    if (!outs.empty()) out += writer->stream_events(outs);
    if (done) {
      const runtime::JobOutcome& o = job->outcome();
      if (o.error) {
        out += writer->stream_error(api_error(*o.error));
        t_log.note = "stream error: " + o.error->message;
      } else if (o.result.finish == FinishReason::CANCELLED) {
        record_tokens(o.result);
        if (connection_closed(fd)) {  // the worker noticed the hang-up first
          t_log.note = "client disconnected";
          return false;
        }
        out += writer->stream_error(cancelled_error());
        t_log.note = "cancelled";
      } else {
        outs.clear();
        FinalReply r = assembler.finish(o, outs);
        if (!outs.empty()) out += writer->stream_events(outs);
        record_tokens(r);
        if (!satisfies_response_format(r.content, format)) {
          out += writer->stream_error(invalid_output_error(format));
          t_log.note = "reply is not valid JSON";
        } else {
          out += writer->stream_end(r);
        }
      }
      if (!write(sink, out)) return false;
      sink.done();
      return true;
    }
    if (connection_closed(fd)) return client_gone();
    if (out.empty() && clock_type::now() - last_write >= keepalive) out = writer->stream_keepalive();
    if (!write(sink, out)) return client_gone();
    return true;
  }
};

}  // namespace

struct HttpServer::Impl {
  std::unique_ptr<HttpTransport> transport;
  int64_t started = unix_time();
  // Connection refusals (429/503 at accept) are logged at most once a second.
  std::mutex refusal_mu;
  clock_type::time_point refusal_logged{};
  size_t refusals_unlogged = 0;
};

namespace {

TransportOptions transport_options(const ServerOptions& o) {
  TransportOptions t;
  t.threads = o.effective_http_threads();
  t.read_timeout_seconds = o.read_timeout_seconds;
  t.idle_timeout_seconds = o.idle_timeout_seconds;
  t.write_timeout_seconds = o.write_timeout_seconds;
  t.max_connections_per_client = o.max_client_connections;
  t.max_connections = o.max_connections;
  t.framing.max_body_bytes = o.max_body_bytes;
  t.max_buffered_bytes =
      o.max_buffered_bytes > 0 ? o.max_buffered_bytes : std::max(4 * o.max_body_bytes, size_t{256} << 20);
  return t;
}

}  // namespace

HttpServer::HttpServer(ServerOptions options, runtime::Backend& backend)
    : options_(std::move(options)),
      runtime_(std::make_unique<runtime::Runtime>(backend, options_.max_queue,
                                                  [this](const runtime::JobOutcome& o) { metrics_.job_done(o); })),
      context_{backend.tokenizer(), backend.context_size(), ModelCatalog{options_.model_id, options_.aliases},
               runtime_->tool_memory(),
               [&backend](const std::vector<std::string>& ids) { return backend.find_tool_calls(ids); }},
      impl_(std::make_unique<Impl>()) {
  // Requests the transport refuses (framing, limits, timeouts, connection
  // caps) get the dialect's error body and a log line like any other.
  impl_->transport = std::make_unique<HttpTransport>(transport_options(options_), [this](const TransportRefusal& r) {
    const ApiError e = refusal_error(r);
    metrics_.request_done(r.target, r.status, 0);
    bool log = true;
    size_t unlogged = 0;
    if (r.method.empty() && (r.status == 429 || r.status == 503)) {
      std::lock_guard<std::mutex> lock(impl_->refusal_mu);
      const auto now = clock_type::now();
      log = now - impl_->refusal_logged >= std::chrono::seconds(1);
      if (log) {
        impl_->refusal_logged = now;
        unlogged = std::exchange(impl_->refusals_unlogged, 0);
      } else {
        ++impl_->refusals_unlogged;
      }
    }
    if (log)
      log_info("%s %s %d from %s - %s%s", r.method.empty() ? "-" : r.method.c_str(),
               r.target.empty() ? "-" : clip(r.target).c_str(), r.status, r.client.c_str(), e.message.c_str(),
               unlogged ? strfmt(" (%zu more refused since the last such line)", unlogged).c_str() : "");
    return json_dump(error_json(e, shape_for_path(r.target)));
  });
  auto& svr = *impl_->transport;
  if (!options_.cors_origin.empty()) {
    svr.set_default_headers({{"Access-Control-Allow-Origin", options_.cors_origin},
                             {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
                             {"Access-Control-Allow-Headers",
                              "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                              "openai-beta, x-stainless-os, x-stainless-lang, x-stainless-package-version, "
                              "x-stainless-runtime, x-stainless-runtime-version, x-stainless-arch, "
                              "x-stainless-retry-count, x-stainless-timeout"},
                             {"Access-Control-Max-Age", "86400"},
                             {"Vary", "Origin"}});
    svr.Options(".*", [](const httplib::Request&, httplib::Response& res) { res.status = 204; });
  }

  // Who may ask (and the start of the request's log entry): with an API
  // key, the key; without one, the keyless rules (keyless_refusal).
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    t_log = RequestLog{};
    if (options_.api_key.empty()) {
      if (auto e = keyless_refusal(req, options_)) {
        send_error(res, *e, shape_for_path(req.path));
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (req.path == "/health" || req.method == "OPTIONS") return httplib::Server::HandlerResponse::Unhandled;
    bool given = false;
    if (key_matches(req, options_.api_key, given)) return httplib::Server::HandlerResponse::Unhandled;
    send_error(
        res,
        ApiError{ApiErrorKind::AUTHENTICATION,
                 given ? "invalid API key" : "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
                 "", ""},
        shape_for_path(req.path));
    return httplib::Server::HandlerResponse::Handled;
  });

  // httplib's own errors (unknown route, body too large, ...) get a JSON body.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    // Bodies set by our handlers stay; 499 marks a client that went away (nobody reads it).
    if (!res.body.empty() || res.status == 499) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    switch (res.status) {
      case 404: e = ApiError{ApiErrorKind::NOT_FOUND, "no route for " + req.method + " " + req.path, "", ""}; break;
      case 413:
        e = ApiError{ApiErrorKind::PAYLOAD_TOO_LARGE, "the request body exceeds the server's limit", "", ""};
        break;
      default:
        e = res.status >= 500 ? internal_error(strfmt("HTTP %d", res.status))
                              : invalid_request(strfmt("bad request (HTTP %d)", res.status));
        break;
    }
    const int status = res.status;
    send_error(res, e, shape_for_path(req.path));
    res.status = status;
    return httplib::Server::HandlerResponse::Handled;
  }));

  svr.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
    send_error(res, internal_error("internal error while handling the request"), shape_for_path(req.path));
  });

  svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    const double seconds = std::chrono::duration<double>(clock_type::now() - t_log.start).count();
    metrics_.request_done(req.path, res.status, seconds);
    std::string tokens;
    if (t_log.has_tokens)
      tokens = strfmt(" prompt=%zu cached=%zu completion=%zu", t_log.prompt, t_log.cached, t_log.completion);
    log_info("%s %s %d%s %.0f ms%s%s", req.method.c_str(), clip(req.path).c_str(), res.status, tokens.c_str(),
             seconds * 1000, t_log.note.empty() ? "" : " - ", t_log.note.c_str());
  });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    ordered_json j = ordered_json::object();
    j["status"] = draining_ ? "shutting_down" : "ok";
    j["model"] = options_.model_id;
    j["backend"] = runtime_->describe();
    j["context"] = runtime_->context_size();
    j["queue_depth"] = runtime_->queue_depth();
    j["max_queue"] = runtime_->max_queue();
    j["running"] = runtime_->busy();
    j["running_jobs"] = runtime_->running();
    j["parallel"] = runtime_->parallel();
    send_json(res, draining_ ? 503 : 200, j);
  });

  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    RuntimeStatus rt;
    rt.queue_depth = runtime_->queue_depth();
    rt.running = runtime_->running();
    rt.parallel = runtime_->parallel();
    rt.waiting_for_session = runtime_->waiting_for_session();
    rt.steps = runtime_->step_report();
    res.set_content(metrics_.prometheus(rt, runtime_->cache_report()), "text/plain; version=0.0.4");
  });

  svr.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    const auto ids = context_.models.ids();
    ordered_json data = ordered_json::array();
    if (req.has_header("anthropic-version")) {
      char when[32];
      const std::time_t t = static_cast<std::time_t>(impl_->started);
      std::tm tm{};
      gmtime_r(&t, &tm);
      std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
      for (const auto& id : ids)
        data.push_back(ordered_json{{"type", "model"}, {"id", id}, {"display_name", id}, {"created_at", when}});
      send_json(res, 200,
                ordered_json{{"data", data}, {"has_more", false}, {"first_id", ids.front()}, {"last_id", ids.back()}});
      return;
    }
    for (const auto& id : ids)
      data.push_back(ordered_json{{"id", id}, {"object", "model"}, {"created", impl_->started}, {"owned_by", "dsv4"}});
    send_json(res, 200, ordered_json{{"object", "list"}, {"data", data}});
  });

  auto generation = [this](Endpoint ep) {
    return [this, ep](const httplib::Request& req, httplib::Response& res) {
      const ErrorShape shape = ep == Endpoint::MESSAGES ? ErrorShape::ANTHROPIC : ErrorShape::OPENAI;
      if (draining_)
        return send_error(res, ApiError{ApiErrorKind::OVERLOADED, "the server is shutting down", "", ""}, shape);
      auto body = parse_json_text(req.body);
      if (!body) return send_error(res, invalid_request(body.error().message), shape);
      expected<PreparedRequest, ApiError> prepared = [&]() -> expected<PreparedRequest, ApiError> {
        switch (ep) {
          case Endpoint::CHAT: return prepare_openai_chat(*body, context_);
          case Endpoint::COMPLETIONS: return prepare_openai_completions(*body, context_);
          case Endpoint::RESPONSES: return prepare_openai_responses(*body, context_);
          case Endpoint::MESSAGES: return prepare_anthropic_messages(*body, context_);
        }
        DSV4_UNREACHABLE();
      }();
      if (!prepared) return send_error(res, prepared.error(), shape);
      PreparedRequest& p = *prepared;
      t_log.has_tokens = true;
      t_log.prompt = p.prompt_tokens;
      if (p.n > 1) {
        if (p.stream)
          return send_error(res, invalid_request("'n' > 1 cannot be streamed: ask without stream, or n times"), shape);
        auto active = std::make_shared<ActiveToken>(active_);
        const int fd = HttpTransport::current_socket();
        ChoicesReply c = run_choices(*runtime_, p, [fd] { return connection_closed(fd); });
        if (c.client_gone) {
          t_log.note = "client disconnected";
          res.status = 499;
          return;
        }
        if (c.error) return send_error(res, *c.error, shape);
        if (c.cancelled) return send_error(res, cancelled_error(), shape);
        record_tokens(c.usage);
        if (c.bad_format) return send_error(res, invalid_output_error(p.response_format), shape);
        return send_json(res, 200, c.body);
      }
      auto active = std::make_shared<ActiveToken>(active_);
      auto job = std::make_shared<runtime::Job>(std::move(p.job));
      const int fd = HttpTransport::current_socket();
      job->set_client_check([fd] { return connection_closed(fd); });
      switch (runtime_->submit(job)) {
        case runtime::Runtime::Admit::OK: break;
        case runtime::Runtime::Admit::QUEUE_FULL:
          return send_error(res,
                            ApiError{ApiErrorKind::OVERLOADED,
                                     strfmt("the server is busy: %zu requests are already waiting; retry later",
                                            runtime_->max_queue()),
                                     "", ""},
                            shape);
        case runtime::Runtime::Admit::STOPPING:
          return send_error(res, ApiError{ApiErrorKind::OVERLOADED, "the server is shutting down", "", ""}, shape);
      }
      ReplyAssembler assembler(p.policy, runtime_->tool_memory());

      if (p.stream) {
        auto session = std::make_shared<StreamSession>(
            job, *runtime_, std::move(assembler), std::move(p.writer), p.response_format, fd,
            std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(options_.keepalive_seconds)),
            active);
        res.set_header("Cache-Control", "no-cache");
        res.set_header("X-Accel-Buffering", "no");
        res.set_chunked_content_provider(
            "text/event-stream", [session](size_t, httplib::DataSink& sink) { return session->pump(sink); },
            [session](bool success) {
              if (!success) session->job->cancel = true;
            });
        return;
      }

      struct Unwatch {
        runtime::Job& j;
        ~Unwatch() { j.clear_client_check(); }
      } unwatch{*job};
      std::vector<DsmlEvent> events;
      std::vector<OutEvent> outs;
      for (;;) {
        events.clear();
        const bool done = job->wait(events, k_poll);
        outs.clear();
        for (const auto& e : events) assembler.on_event(e, outs);
        if (done) break;
        if (connection_closed(fd)) {
          job->cancel = true;
          runtime_->withdraw(job);  // a queued job gives its slot back now
          t_log.note = "client disconnected";
          res.status = 499;  // nginx's "client closed request": nobody reads it, the log shows it
          return;
        }
      }
      const runtime::JobOutcome& o = job->outcome();
      if (o.error) return send_error(res, api_error(*o.error), shape);
      if (o.result.finish == FinishReason::CANCELLED) {
        record_tokens(o.result);
        if (connection_closed(fd)) {  // the worker noticed the hang-up first
          t_log.note = "client disconnected";
          res.status = 499;
          return;
        }
        return send_error(res, cancelled_error(), shape);
      }
      outs.clear();
      FinalReply r = assembler.finish(o, outs);
      record_tokens(r);
      if (!satisfies_response_format(r.content, p.response_format))
        return send_error(res, invalid_output_error(p.response_format), shape);
      send_json(res, 200, p.writer->body(r));
    };
  };
  svr.Post("/v1/chat/completions", generation(Endpoint::CHAT));
  svr.Post("/v1/completions", generation(Endpoint::COMPLETIONS));
  svr.Post("/v1/responses", generation(Endpoint::RESPONSES));
  svr.Post("/v1/messages", generation(Endpoint::MESSAGES));

  svr.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    auto body = parse_json_text(req.body);
    if (!body) return send_error(res, invalid_request(body.error().message), ErrorShape::ANTHROPIC);
    auto count = anthropic_count_tokens(*body, context_);
    if (!count) return send_error(res, count.error(), ErrorShape::ANTHROPIC);
    send_json(res, 200, *count);
  });
}

HttpServer::~HttpServer() { shutdown(true); }

std::string HttpServer::serve_bytes(std::string_view bytes) { return impl_->transport->serve_bytes(bytes); }

size_t HttpServer::buffered_request_bytes() const { return impl_->transport->buffered_bytes(); }

Status HttpServer::bind() {
  auto& svr = *impl_->transport;
  if (options_.port == 0) {
    port_ = svr.bind_to_any_port(options_.host);
  } else {
    port_ = svr.bind_to_port(options_.host, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0)
    return make_error("cannot listen on %s:%d (address in use, or not a local address?)", options_.host.c_str(),
                      options_.port);
  svr.raise_backlog(128);
  return {};
}

Status HttpServer::serve() {
  if (port_ <= 0) return make_error("serve() before bind()");
  // A client that hangs up makes the next write fail with EPIPE; without this
  // the process would die of SIGPIPE instead (cpp-httplib sends with flags 0).
  std::signal(SIGPIPE, SIG_IGN);
  if (!impl_->transport->listen_after_bind() && !draining_) return make_error("the HTTP listener stopped unexpectedly");
  return {};
}

void HttpServer::shutdown(bool now) {
  const bool first = !draining_.exchange(true);
  runtime_->drain();
  if (now) force_ = true;
  if (first && !now) {
    log_info("shutting down: waiting up to %.0f s for %d request(s) in flight", options_.shutdown_grace_seconds,
             active_.load());
    const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(options_.shutdown_grace_seconds));
    while (active_.load() > 0 && clock_type::now() < deadline && !force_) std::this_thread::sleep_for(k_poll);
  }
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (stopped_) return;
  if (active_.load() > 0) log_info("shutting down: cancelling %d request(s)", active_.load());
  runtime_->cancel_all();
  // Cancelled jobs finish within a token; their handlers then write a last frame.
  const auto deadline = clock_type::now() + std::chrono::seconds(5);
  while (active_.load() > 0 && clock_type::now() < deadline) std::this_thread::sleep_for(k_poll);
  // The worker stops, then the live sessions go to the disk cache (clean
  // shutdown only; a forced one just waits for writes already under way).
  // A failure there is logged; the listener stops regardless.
  try {
    runtime_->shutdown(!force_);
  } catch (const std::exception& e) {
    log_error("shutdown: saving the sessions failed: %s", e.what());
  }
  impl_->transport->close_listener();
  impl_->transport->stop_connections();
  stopped_ = true;
}

}  // namespace dsv4::server
