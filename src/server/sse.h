// Server-sent events framing (WHATWG HTML §9.2). A frame is optional
// "event: NAME" line, one "data: ..." line, and a blank line. JSON payloads are
// written compactly (json_dump), so they never contain a raw newline and one
// data line suffices. A line starting with ':' is a comment, which clients
// ignore: used as keepalive while a request waits in the queue or prefills.
//
// Dialects:
//   OpenAI chat / completions: "data: {chunk}\n\n" ... "data: [DONE]\n\n"
//   OpenAI Responses:          "event: response.x\ndata: {..., \"type\": \"response.x\"}\n\n"
//   Anthropic messages:        "event: message_start\ndata: {...}\n\n" ..., keepalive "event: ping"
#pragma once

#include <string>
#include <string_view>

#include "server/json_util.h"

namespace dsv4::server {

inline std::string sse_data(const ordered_json& j) { return "data: " + json_dump(j) + "\n\n"; }

inline std::string sse_event(std::string_view name, const ordered_json& j) {
  std::string s = "event: ";
  s.append(name);
  s += "\ndata: ";
  s += json_dump(j);
  s += "\n\n";
  return s;
}

inline std::string sse_done() { return "data: [DONE]\n\n"; }

inline std::string sse_comment(std::string_view text) {
  std::string s = ": ";
  s.append(text);
  s += "\n\n";
  return s;
}

}  // namespace dsv4::server
