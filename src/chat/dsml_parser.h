// Incremental parser of a DSV4 completion (what the model generates after the
// rendered prompt): reasoning, visible content and a DSML tool-call block
// (formats.md §4.4, §4.6).
//
// Input: the completion text in chunks (typically one decoded token at a
// time), optionally ending in the EOS marker; then finish().
//
// Grammar (lenient superset of the official one; P is the tag prefix chosen
// by the opener: "｜DSML｜" canonically, also "DSML｜" or "" as ds4 accepts):
//   completion := [reasoning "</think>"]  (thinking mode only)
//                 content [ws* block] [EOS]
//   block      := "<" P "tool_calls" ws* ">" ws* (invoke ws*)* "</" P "tool_calls" ws* ">"
//   invoke     := "<" P "invoke" attrs ">" ws* (param ws*)* "</" P "invoke" ws* ">"
//   param      := "<" P "parameter" attrs ">" body "</" P "parameter" ws* ">"
//   attrs      := (ws+ key ws* "=" ws* '"' value '"')* ws*
// `name` is required on invoke and parameter; `string` is "true" or "false"
// and defaults to "true". Attribute values and string bodies are entity-
// decoded (&amp; &lt; &gt; &quot; &apos;). A body ends at the first "</" P
// "parameter"; an EOS marker anywhere in a block means the block was cut off.
//
// Events are emitted as soon as they are certain; only a suffix that could
// still become a marker (or an entity, or a UTF-8 sequence) is held back,
// plus trailing whitespace of the content, which belongs to the block if a
// block follows. Concatenating the deltas of each kind gives the final
// message fields, whatever the chunking.
//
// Tool-call arguments stream as JSON text in the official form
// `{"k": v, "k2": v2}`: "{" with the call's start, then `"k": ` (plus `"` for
// a string value) when a parameter tag completes, then the string body
// JSON-escaped as it arrives, then `"`; "}" at </invoke>. A non-string value
// is emitted raw once its closing tag is seen and it is known to be valid
// JSON; an empty one becomes null, an invalid one a JSON string (with a
// warning), so the arguments are always valid JSON. Nothing bounds the
// nesting of what the model writes, so a non-string value nesting deeper than
// k_max_json_depth - 1 levels is also passed as a string (with a warning): the
// arguments object of every call nests at most k_max_json_depth levels, the
// limit of all JSON the server reads (json_limits.h), so a client can send a
// reply back and the server can parse its own calls.
//
// Malformed output never fails: if a block turns out malformed or cut off, a
// TOOL_CALLS_ABORTED event withdraws the calls it started, and the block's
// text (from the whitespace before its opener) follows as content; the rest
// of the completion is plain content. Text after a complete block (other than
// whitespace and EOS) and text after EOS are dropped with a warning.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "chat/chat_message.h"

namespace dsv4 {

enum class DsmlEventKind {
  CONTENT,             // text: a content delta
  REASONING,           // text: a reasoning delta (thinking mode, before </think>)
  TOOL_CALL_START,     // index, text: the function name
  TOOL_CALL_ARGS,      // index, text: an arguments JSON fragment
  TOOL_CALL_END,       // index
  TOOL_CALLS_ABORTED,  // every call started so far is withdrawn; content deltas follow
};

const char* dsml_event_kind_name(DsmlEventKind kind);

struct DsmlEvent {
  DsmlEventKind kind = DsmlEventKind::CONTENT;
  size_t index = 0;  // tool-call index (0-based) for TOOL_CALL_*
  std::string text;
};

struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ChatToolCall> tool_calls;  // ids empty: the server assigns them
  // The sampled block text, from the whitespace before its opener to the end
  // of its closing tag, when a block was parsed: content + raw_dsml is exactly
  // what the model generated (formats.md §4.6, exact replay).
  std::string raw_dsml;
  std::vector<std::string> warnings;
  bool saw_eos = false;  // the EOS marker was seen
};

class DsmlParser {
 public:
  explicit DsmlParser(ThinkingMode mode);

  // Feeds the next chunk of completion text; appends the events it makes certain.
  void feed(std::string_view chunk, std::vector<DsmlEvent>& events);
  // End of generation: flushes everything held back. Call once, after the last feed.
  void finish(std::vector<DsmlEvent>& events);

  // True while the parser is inside DSML structure (tags, attribute text,
  // JSON outside string literals, the tag closing a value), where sampling
  // should be greedy; false in reasoning, content, string parameter bodies
  // and JSON string literals.
  bool in_dsml_structure() const;
  // The tool_calls block has closed: generation can stop (formats.md §4.6).
  bool block_closed() const { return block_closed_; }
  bool finished() const { return finished_; }

  // The message so far; complete after finish().
  const ParsedMessage& message() const { return msg_; }

 private:
  enum class State {
    REASONING,     // thinking mode, before </think>
    CONTENT,       // visible content; looking for EOS and block openers
    BLOCK,         // inside <tool_calls>: expects <invoke or </tool_calls
    OPEN_TAG,      // after "<P invoke" / "<P parameter": attributes up to '>'
    INVOKE_BODY,   // inside <invoke>: expects <parameter or </invoke
    STRING_VALUE,  // string parameter body
    JSON_VALUE,    // non-string parameter body
    CLOSE_TAG,     // after "</P parameter|invoke|tool_calls": ws* '>'
    AFTER_BLOCK,   // block closed; only whitespace and EOS expected
    PLAIN,         // after a malformed block: everything is content
    DONE,          // EOS seen
  };
  enum class TagKind { INVOKE, PARAMETER };
  enum class CloseKind { PARAMETER, INVOKE, TOOL_CALLS };

  bool step(std::vector<DsmlEvent>& ev);
  bool step_reasoning(std::vector<DsmlEvent>& ev);
  bool step_content(std::vector<DsmlEvent>& ev);
  bool step_expect_tag(std::vector<DsmlEvent>& ev);
  bool step_open_tag(std::vector<DsmlEvent>& ev);
  bool step_value(std::vector<DsmlEvent>& ev);
  bool step_close_tag(std::vector<DsmlEvent>& ev);
  bool step_after_block();
  bool step_plain(std::vector<DsmlEvent>& ev);
  void finish_value(std::vector<DsmlEvent>& ev);
  void fail(const std::string& reason, std::vector<DsmlEvent>& ev);

  std::string_view rest() const { return std::string_view(in_).substr(pos_); }
  void consume(size_t n);
  bool in_block() const;
  size_t held_param_close() const;
  void emit_text(DsmlEventKind kind, std::string_view s, std::vector<DsmlEvent>& ev);
  void emit_args(std::string_view s, std::vector<DsmlEvent>& ev);
  void warn(std::string w) { msg_.warnings.push_back(std::move(w)); }

  State state_;
  std::string in_;  // input not yet consumed starts at pos_
  size_t pos_ = 0;
  bool eof_ = false;
  bool finished_ = false;
  bool block_closed_ = false;
  size_t content_ws_known_ = 0;  // CONTENT: leading bytes of rest() known to be held whitespace

  // The open block.
  std::string lit_invoke_, lit_param_, lit_param_close_, lit_invoke_close_, lit_block_close_;
  std::string lead_ws_;    // whitespace between the content and the opener
  std::string block_raw_;  // consumed block text
  size_t n_calls_ = 0;     // calls started in this block
  TagKind tag_kind_ = TagKind::INVOKE;
  CloseKind close_kind_ = CloseKind::TOOL_CALLS;
  std::set<std::string> param_names_;  // of the open invoke
  bool value_is_string_ = true;
  std::string param_name_;
  std::string json_value_;  // JSON_VALUE text so far
  bool json_in_string_ = false, json_escape_ = false;

  bool warned_after_block_ = false, warned_after_eos_ = false;
  ParsedMessage msg_;
};

// Parses a whole completion at once (feed + finish).
ParsedMessage parse_completion(std::string_view text, ThinkingMode mode);

}  // namespace dsv4
