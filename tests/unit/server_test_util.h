// Shared helpers of the server tests: a tokenizer with the DeepSeek V4
// special tokens (no model file needed), the scripted fake engine, SSE
// parsing, and DSML spelled with "|" for the marker.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_request.h"
#include "runtime/scripted_backend.h"
#include "synth/synth_vocab.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server::test {

using namespace dsv4::runtime;

inline std::unique_ptr<Tokenizer> make_tokenizer() {
  SynthVocab v = make_synth_vocab(1024);
  auto t = Tokenizer::from_vocab(v.tokens, v.merges, v.types);
  DSV4_ASSERT(t.has_value(), "synthetic vocabulary");
  return std::move(*t);
}

inline std::unique_ptr<ScriptedBackend> make_backend(std::vector<ScriptedReply> replies, uint32_t ctx = 4096) {
  return std::make_unique<ScriptedBackend>(make_tokenizer(), ctx, std::move(replies));
}

// "|" stands for the DSML marker "｜DSML｜" (test strings stay readable).
inline std::string dsml(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += k_token_dsml;
    else
      out += c;
  }
  return out;
}

// A one-call DSML block as the model writes it (formats.md §4.4).
inline std::string call_block(const std::string& name, const std::string& params) {
  return dsml("\n\n<|tool_calls>\n<|invoke name=\"" + name + "\">\n" + params + "\n</|invoke>\n</|tool_calls>");
}
inline std::string string_param(const std::string& k, const std::string& v) {
  return dsml("<|parameter name=\"" + k + "\" string=\"true\">" + v + "</|parameter>");
}

struct SseFrame {
  std::string event;  // "" when the frame has no event line
  std::string data;
  bool comment = false;
  nlohmann::ordered_json json() const { return nlohmann::ordered_json::parse(data, nullptr, false); }
};

// Splits an SSE text into frames (blank-line separated); comments are frames too.
inline std::vector<SseFrame> parse_sse(const std::string& text) {
  std::vector<SseFrame> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) end = text.size();
    std::string block = text.substr(pos, end - pos);
    pos = end + 2;
    if (block.empty()) continue;
    SseFrame f;
    size_t lp = 0;
    while (lp <= block.size()) {
      size_t le = block.find('\n', lp);
      if (le == std::string::npos) le = block.size();
      std::string line = block.substr(lp, le - lp);
      lp = le + 1;
      if (line.rfind(": ", 0) == 0 || line == ":")
        f.comment = true;
      else if (line.rfind("event: ", 0) == 0)
        f.event = line.substr(7);
      else if (line.rfind("data: ", 0) == 0)
        f.data += line.substr(6);
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace dsv4::server::test
