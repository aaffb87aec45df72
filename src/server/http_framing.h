// Where one HTTP/1.1 request ends in the bytes a connection has sent, decided
// by the transport before any handler runs, so that the limits hold for every
// transfer encoding and a request is handed to an HTTP thread only once all
// of it has arrived (http_transport.h).
//
// A request is: request line CRLF, header lines CRLF, CRLF, then the body:
//   * Content-Length: N        exactly N bytes;
//   * Transfer-Encoding: chunked   chunks "HEX[;ext] CRLF data CRLF" up to the
//                              last chunk "0[;ext] CRLF" and a final CRLF
//                              (trailer fields are refused);
//   * neither                  no body (RFC 9112 §6.3 for requests).
// The framing is strict where leniency would let two parsers disagree
// (request smuggling): every line ends in CRLF; no folded header lines;
// Content-Length is plain digits, given once (or repeated with one value);
// Transfer-Encoding is exactly "chunked" and never beside Content-Length.
//
// Limits: the head (request line + headers) at most max_head_bytes (431),
// the body at most max_body_bytes whether declared or chunked (413, decided
// as soon as the declared length or the chunk sizes pass the limit, before
// the bytes are read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::server {

struct FramingLimits {
  size_t max_head_bytes = size_t{64} << 10;
  size_t max_body_bytes = size_t{32} << 20;
};

// Incremental: feed() is called with all the bytes of the connection's
// current request seen so far (a prefix that only grows) and resumes where
// the previous call stopped, so a request costs O(its size) in total.
class RequestFramer {
 public:
  enum class State { INCOMPLETE, COMPLETE, BAD };

  explicit RequestFramer(FramingLimits limits) : limits_(limits) {}

  State feed(std::string_view bytes);

  State state() const { return state_; }
  bool head_complete() const { return head_done_; }
  // Known once the request line has arrived (empty before).
  const std::string& method() const { return method_; }
  const std::string& target() const { return target_; }
  // The head asked "Expect: 100-continue". expect_line() is its byte range in
  // the head, which the transport removes once it has answered 100 itself.
  bool expect_continue() const { return expect_continue_; }
  std::pair<size_t, size_t> expect_line() const { return {expect_begin_, expect_end_}; }
  bool body_started(std::string_view bytes) const { return head_done_ && bytes.size() > head_bytes_; }
  // COMPLETE: the request's length in bytes (head + body framing).
  size_t request_bytes() const { return total_; }
  size_t head_bytes() const { return head_bytes_; }
  // Body bytes so far (decoded chunk payload for chunked bodies).
  uint64_t body_bytes() const { return body_; }
  // BAD: the HTTP status to answer (400, 413, 431, 501) and why.
  int status() const { return status_; }
  const std::string& message() const { return message_; }

 private:
  State fail(int status, std::string message);
  State parse_head(std::string_view bytes);
  State parse_chunks(std::string_view bytes);

  FramingLimits limits_;
  State state_ = State::INCOMPLETE;
  // Head.
  size_t scan_ = 0;  // next byte to look at
  bool head_done_ = false;
  size_t head_bytes_ = 0;
  std::string method_, target_;
  bool have_length_ = false, chunked_ = false, expect_continue_ = false;
  uint64_t length_ = 0;
  size_t expect_begin_ = 0, expect_end_ = 0;
  // Body.
  enum class Chunk { SIZE, DATA, DATA_END, LAST };
  Chunk chunk_ = Chunk::SIZE;
  uint64_t chunk_left_ = 0;
  uint64_t body_ = 0;
  size_t total_ = 0;
  int status_ = 0;
  std::string message_;
};

}  // namespace dsv4::server
