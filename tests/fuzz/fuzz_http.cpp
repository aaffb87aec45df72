// Fuzz target: `dsv4 serve` from the first byte a client sends — request
// framing (http_framing.h), cpp-httplib's request parsing, the keyless and
// keyed access rules, every route and dialect adapter, generation with the
// scripted engine (plain and streamed replies, tool calls) — through
// HttpServer::serve_bytes, which feeds the bytes to the handlers as one
// connection would (pipelined requests, keep-alive), without a socket.
//
// FUZZ_HTTP_PRINT=1 prints the server's replies (to see what a corpus file reaches).
//
// Input: byte 0 bit 0 picks the server (0: keyless, 1: API key "k"); the
// rest is what the client sends. Checked on every input:
//   * the server writes only whole HTTP/1.1 responses (status line, headers
//     with Content-Length or chunked framing, body), never a 500 (an
//     exception or internal error in a handler);
//   * afterwards it still answers GET /health with 200.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "server/http_server.h"
#include "runtime/scripted_backend.h"
#include "synth/synth_vocab.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace dsv4;
using namespace dsv4::runtime;
using namespace dsv4::server;

#define FUZZ_CHECK(cond, what)                                                             \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "fuzz_http: check failed: %s (line %d): %s\n", #cond, __LINE__, \
                   std::string(what).substr(0, 400).c_str());                              \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

struct Served {
  std::unique_ptr<ScriptedBackend> backend;
  std::unique_ptr<HttpServer> http;

  explicit Served(const std::string& key) {
    SynthVocab v = make_synth_vocab(1024);
    auto tok = Tokenizer::from_vocab(v.tokens, v.merges, v.types);
    if (!tok) std::abort();
    std::vector<ScriptedReply> replies = {
        ScriptedReply{
            "weather",
            std::string("Let me check.</think>\n\n<") +
                "｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" "
                "string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
            0, 0},
        ScriptedReply{"json", "{\"a\": [1, 2, {\"b\": null}]}", 0, 0},
        ScriptedReply{"", "Hello there, this is a reply.", 0, 0},
    };
    backend = std::make_unique<ScriptedBackend>(std::move(*tok), 4096, std::move(replies));
    ServerOptions o;
    o.model_id = "tiny";
    o.api_key = key;
    o.max_body_bytes = size_t{256} << 10;
    o.max_queue = 4;
    o.host = "127.0.0.1";
    o.port = 0;
    http = std::make_unique<HttpServer>(o, *backend);
    // Bound (a loopback port nobody connects to) but never served: httplib
    // ends streamed responses early when the server has no listening socket.
    if (!http->bind()) std::abort();
  }
};

// Walks the responses in `out`; aborts on anything that is not one.
void check_responses(std::string_view out) {
  while (!out.empty()) {
    FUZZ_CHECK(out.rfind("HTTP/1.1 ", 0) == 0, out);
    const size_t head_end = out.find("\r\n\r\n");
    FUZZ_CHECK(head_end != std::string_view::npos, out);
    const std::string_view head = out.substr(0, head_end + 2);
    const int status = std::atoi(std::string(head.substr(9, 3)).c_str());
    // 5xx only as the transport's refusals (501, 503, 505); a 500 is a handler that failed.
    FUZZ_CHECK(status >= 100 && status < 600 && status != 500 && status != 502 && status != 504, head);
    out.remove_prefix(head_end + 4);
    if (status == 100) continue;
    auto header = [&](std::string_view name) -> std::string {
      for (size_t p = head.find("\r\n"); p != std::string_view::npos && p + 2 < head.size();) {
        const size_t e = head.find("\r\n", p + 2);
        const std::string_view line = head.substr(p + 2, e - p - 2);
        const size_t colon = line.find(':');
        if (colon != std::string_view::npos && line.substr(0, colon).size() == name.size()) {
          std::string k(line.substr(0, colon));
          for (char& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
          if (k == name)
            return std::string(line.substr(colon + 1 + (line.size() > colon + 1 && line[colon + 1] == ' ')));
        }
        p = e;
      }
      return "";
    };
    if (header("transfer-encoding") == "chunked") {
      for (;;) {
        const size_t nl = out.find("\r\n");
        FUZZ_CHECK(nl != std::string_view::npos, out);
        const size_t n = std::strtoul(std::string(out.substr(0, nl)).c_str(), nullptr, 16);
        out.remove_prefix(nl + 2);
        FUZZ_CHECK(out.size() >= n + 2 && out.substr(n, 2) == "\r\n", out);
        out.remove_prefix(n + 2);
        if (n == 0) break;
      }
    } else {
      const std::string len = header("content-length");
      const size_t n = len.empty() ? 0 : std::strtoul(len.c_str(), nullptr, 10);
      // A reply to HEAD has the headers of the GET reply and no body: the
      // next reply (or the end) follows the head at once.
      if (out.empty() || out.rfind("HTTP/1.1 ", 0) == 0) continue;
      FUZZ_CHECK(out.size() >= n, head);
      out.remove_prefix(n);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Served keyless(""), keyed("k");
  if (size == 0) return 0;
  Served& s = (data[0] & 1) ? keyed : keyless;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string out = s.http->serve_bytes(bytes);
  if (std::getenv("FUZZ_HTTP_PRINT"))
    std::fwrite(out.data(), 1, out.size(), stdout);  // FUZZ_HTTP_PRINT=1: show replies
  check_responses(out);
  const std::string health = s.http->serve_bytes("GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
  FUZZ_CHECK(health.rfind("HTTP/1.1 200", 0) == 0, health);
  return 0;
}
