// The seam between the transport and the dialect adapters. An adapter turns a
// request body into a PreparedRequest: the typed job for the engine worker,
// the tool policy, and a ReplyWriter that renders the reply in the dialect,
// either as one JSON body or as SSE frames.
//
// Streaming order, driven by the transport:
//   stream_begin()                  once, right after the job is queued
//   stream_events(...)              as events arrive, zero or more times
//   stream_keepalive()              whenever nothing was written for a while
//   stream_end(reply) | stream_error(error)   once
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "runtime/job.h"
#include "server/reply_assembler.h"

namespace dsv4::server {

class ReplyWriter {
 public:
  virtual ~ReplyWriter() = default;
  virtual std::string stream_begin() = 0;
  virtual std::string stream_events(const std::vector<OutEvent>& events) = 0;
  virtual std::string stream_end(const FinalReply& reply) = 0;
  virtual std::string stream_error(const ApiError& error) = 0;
  virtual std::string stream_keepalive() = 0;
  virtual nlohmann::ordered_json body(const FinalReply& reply) = 0;
};

struct PreparedRequest {
  runtime::JobInput job;
  bool stream = false;
  ReplyAssembler::Policy policy;
  ResponseFormat response_format = ResponseFormat::TEXT;  // checked on the finished reply
  int n = 1;  // OpenAI n: choices, each its own job (seed + i); not streamed
  std::unique_ptr<ReplyWriter> writer;
  size_t prompt_tokens = 0;
};

}  // namespace dsv4::server
