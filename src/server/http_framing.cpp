#include "server/http_framing.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4::server {

namespace {

constexpr size_t k_max_chunk_line = 1024;  // "HEX[;ext]" of one chunk

bool is_tchar(char c) {  // RFC 9110 token characters
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_tchar); }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return (x >= 'A' && x <= 'Z' ? x + 32 : x) == (y >= 'A' && y <= 'Z' ? y + 32 : y);
         });
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Field values may hold visible characters, spaces, tabs and obs-text; no other control characters.
bool valid_field_value(std::string_view v) {
  return std::none_of(v.begin(), v.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return (u < 0x20 && c != '\t') || u == 0x7f;
  });
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

RequestFramer::State RequestFramer::fail(int status, std::string message) {
  state_ = State::BAD;
  status_ = status;
  message_ = std::move(message);
  return state_;
}

RequestFramer::State RequestFramer::feed(std::string_view bytes) {
  if (state_ != State::INCOMPLETE) return state_;
  if (!head_done_ && parse_head(bytes) != State::INCOMPLETE) return state_;
  if (!head_done_) return state_;
  if (chunked_) return parse_chunks(bytes);
  total_ = head_bytes_ + static_cast<size_t>(length_);
  body_ = std::min<uint64_t>(length_, bytes.size() - head_bytes_);
  if (bytes.size() >= total_) state_ = State::COMPLETE;
  return state_;
}

RequestFramer::State RequestFramer::parse_head(std::string_view bytes) {
  for (;;) {
    const size_t nl = bytes.find('\n', scan_);
    if (nl == std::string_view::npos) {
      if (bytes.size() > limits_.max_head_bytes)
        return fail(431, strfmt("the request head exceeds %zu bytes", limits_.max_head_bytes));
      return state_;
    }
    if (nl + 1 > limits_.max_head_bytes)
      return fail(431, strfmt("the request head exceeds %zu bytes", limits_.max_head_bytes));
    if (nl == scan_ || bytes[nl - 1] != '\r') return fail(400, "a request line or header line does not end in CRLF");
    const size_t line_begin = scan_;
    const std::string_view line = bytes.substr(scan_, nl - 1 - scan_);
    scan_ = nl + 1;

    if (line_begin == 0) {  // request line: METHOD SP TARGET SP HTTP/1.x
      const size_t a = line.find(' '), b = a == std::string_view::npos ? a : line.find(' ', a + 1);
      if (b == std::string_view::npos || line.find(' ', b + 1) != std::string_view::npos)
        return fail(400, "malformed request line");
      const std::string_view method = line.substr(0, a), target = line.substr(a + 1, b - a - 1),
                             version = line.substr(b + 1);
      if (!is_token(method) || target.empty() || !valid_field_value(target) || target.find('\t') != target.npos)
        return fail(400, "malformed request line");
      method_ = std::string(method);
      target_ = std::string(target);
      if (version != "HTTP/1.1" && version != "HTTP/1.0") return fail(505, "only HTTP/1.1 and HTTP/1.0 are supported");
      continue;
    }
    if (line.empty()) {  // the blank line ends the head
      head_done_ = true;
      head_bytes_ = scan_;
      if (chunked_ && have_length_)
        return fail(400, "a request must not have both Content-Length and Transfer-Encoding");
      if (have_length_ && length_ > limits_.max_body_bytes)
        return fail(413, strfmt("the request body (%llu bytes) exceeds the server's limit of %zu bytes",
                                static_cast<unsigned long long>(length_), limits_.max_body_bytes));
      return state_;
    }
    if (line.front() == ' ' || line.front() == '\t') return fail(400, "folded header lines are not accepted");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !is_token(line.substr(0, colon))) return fail(400, "malformed header line");
    const std::string_view name = line.substr(0, colon), value = trim_ows(line.substr(colon + 1));
    if (!valid_field_value(value)) return fail(400, "a header value holds control characters");
    if (iequals(name, "content-length")) {
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return fail(400, "Content-Length must be a decimal number");
      uint64_t n = 0;
      for (char c : value) n = n * 10 + static_cast<uint64_t>(c - '0');
      if (have_length_ && n != length_) return fail(400, "conflicting Content-Length headers");
      have_length_ = true;
      length_ = n;
    } else if (iequals(name, "transfer-encoding")) {
      if (chunked_) return fail(400, "Transfer-Encoding is given twice");
      if (!iequals(value, "chunked")) return fail(501, "only the \"chunked\" Transfer-Encoding is supported");
      chunked_ = true;
    } else if (iequals(name, "expect")) {
      if (!iequals(value, "100-continue")) return fail(417, "only \"Expect: 100-continue\" is supported");
      expect_continue_ = true;
      expect_begin_ = line_begin;
      expect_end_ = scan_;
    }
  }
}

RequestFramer::State RequestFramer::parse_chunks(std::string_view bytes) {
  for (;;) {
    switch (chunk_) {
      case Chunk::SIZE: {
        const size_t nl = bytes.find('\n', scan_);
        if (nl == std::string_view::npos) {
          if (bytes.size() - scan_ > k_max_chunk_line) return fail(400, "a chunk size line is too long");
          return state_;
        }
        if (nl - scan_ > k_max_chunk_line) return fail(400, "a chunk size line is too long");
        if (nl == scan_ || bytes[nl - 1] != '\r') return fail(400, "a chunk size line does not end in CRLF");
        std::string_view line = bytes.substr(scan_, nl - 1 - scan_);
        scan_ = nl + 1;
        uint64_t size = 0;
        size_t digits = 0;
        for (; digits < line.size() && hex_digit(line[digits]) >= 0; ++digits) {
          size = size * 16 + static_cast<uint64_t>(hex_digit(line[digits]));
          if (size > limits_.max_body_bytes)
            return fail(413, strfmt("the chunked request body exceeds the server's limit of %zu bytes",
                                    limits_.max_body_bytes));
        }
        if (digits == 0) return fail(400, "malformed chunk size");
        const std::string_view rest = trim_ows(line.substr(digits));
        if (!rest.empty() && (rest.front() != ';' || !valid_field_value(rest)))
          return fail(400, "malformed chunk size");
        if (size == 0) {
          chunk_ = Chunk::LAST;
          break;
        }
        body_ += size;
        if (body_ > limits_.max_body_bytes)
          return fail(
              413, strfmt("the chunked request body exceeds the server's limit of %zu bytes", limits_.max_body_bytes));
        chunk_left_ = size;
        chunk_ = Chunk::DATA;
        break;
      }
      case Chunk::DATA: {
        const uint64_t have = std::min<uint64_t>(chunk_left_, bytes.size() - scan_);
        scan_ += static_cast<size_t>(have);
        chunk_left_ -= have;
        if (chunk_left_ > 0) return state_;
        chunk_ = Chunk::DATA_END;
        break;
      }
      case Chunk::DATA_END:
      case Chunk::LAST: {
        if (bytes.size() - scan_ < 2) return state_;
        if (bytes[scan_] != '\r' || bytes[scan_ + 1] != '\n')
          return fail(400, chunk_ == Chunk::LAST ? "chunked trailer fields are not supported"
                                                 : "chunk data is not followed by CRLF");
        scan_ += 2;
        if (chunk_ == Chunk::LAST) {
          total_ = scan_;
          state_ = State::COMPLETE;
          return state_;
        }
        chunk_ = Chunk::SIZE;
        break;
      }
    }
  }
}

}  // namespace dsv4::server
