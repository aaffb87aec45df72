// The text side of a generation loop, shared by generate() and the server's
// scripted backend: tokens in; UTF-8-safe text, stop strings, the DSML parse
// and the events out, into a GenerateResult.
//
//   ReplyStream rs(tok, options, callbacks, result);
//   for each token t (already appended to result.tokens, EOS handled by the caller):
//     if (rs.push(t)) break;     // a stop string or a closed tool-call block ended it
//   rs.finish();                 // flush held-back text, close the parse, final finish reason
//
// push() sets result.finish (STOP with result.stop_string, or TOOL_CALLS) when
// it returns true. finish() emits the text the decoder and the stop matcher held
// back (unless a stop string already ended the reply), closes the DSML parser
// (when options.parse_chat) and fills result.message; a reply with tool calls
// finishes as TOOL_CALLS unless it was cancelled.
#pragma once

#include <string_view>
#include <vector>

#include "chat/dsml_parser.h"
#include "generate/generate.h"
#include "sampling/sampler.h"
#include "tokenizer/stream_decoder.h"

namespace dsv4 {

class ReplyStream {
 public:
  ReplyStream(const Tokenizer& tok, const GenerateOptions& o, const GenerateCallbacks& cb, GenerateResult& r);

  // Feeds one generated token (not EOS); true when the reply must end here.
  bool push(int32_t token);
  void finish();
  // Whether the next token is inside DSML structure (sampled greedily).
  bool in_dsml_structure() const { return o_.parse_chat && parser_.in_dsml_structure(); }

 private:
  void deliver(std::string_view text);
  // Appends decoded text to the reply, passes it through the stop-string
  // matcher and delivers what that releases; true when a stop string ended it.
  bool feed(const std::string& piece);

  const GenerateOptions& o_;
  const GenerateCallbacks& cb_;
  GenerateResult& r_;
  StreamDecoder decoder_;
  StopMatcher stops_;
  DsmlParser parser_;
  std::vector<DsmlEvent> events_;
};

}  // namespace dsv4
