#include "chat/dsml_parser.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <initializer_list>
#include <utility>

#include "chat/json_limits.h"
#include "chat/markers.h"
#include "chat/py_json.h"
#include "core/utf8.h"

namespace dsv4 {
namespace {

namespace mk = chat_marker;

// Block openers accepted in content, each with the tag prefix its block uses.
struct Opener {
  std::string_view literal;
  std::string_view prefix;
};
constexpr std::array<Opener, 3> OPENERS = {{
    {"<｜DSML｜tool_calls", "｜DSML｜"},
    {"<DSML｜tool_calls", "DSML｜"},
    {"<tool_calls", ""},
}};

// An open tag longer than this without its closing '>' is malformed.
constexpr size_t MAX_TAG_BYTES = 4096;

struct Entity {
  std::string_view text;
  char decoded;
};
constexpr std::array<Entity, 5> ENTITIES = {
    {{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}}};

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t leading_ws(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && is_ws(s[n])) ++n;
  return n;
}

// Earliest complete occurrence at or after `from` of any literal.
struct Found {
  size_t pos = std::string_view::npos;
  size_t which = 0;
};
Found find_first(std::string_view s, size_t from, std::initializer_list<std::string_view> lits) {
  Found f;
  size_t k = 0;
  for (std::string_view lit : lits) {
    size_t p = s.find(lit, from);
    if (p < f.pos) f = Found{p, k};
    ++k;
  }
  return f;
}

// Length of the longest suffix of `s` that is a proper, non-empty prefix of
// one of the literals (all of which start with '<'): what must be held back.
size_t partial_suffix(std::string_view s, std::initializer_list<std::string_view> lits) {
  size_t max_len = 0;
  for (std::string_view lit : lits) max_len = std::max(max_len, lit.size());
  const size_t start = s.size() >= max_len ? s.size() - max_len + 1 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    if (s[i] != '<') continue;
    std::string_view tail = s.substr(i);
    for (std::string_view lit : lits)
      if (tail.size() < lit.size() && lit.substr(0, tail.size()) == tail) return s.size() - i;
  }
  return 0;
}

// Length of a suffix of `s` that could still grow into an entity.
size_t partial_entity(std::string_view s) {
  const size_t amp = s.rfind('&');
  if (amp == std::string_view::npos) return 0;
  std::string_view tail = s.substr(amp);
  for (const auto& e : ENTITIES)
    if (tail.size() < e.text.size() && e.text.substr(0, tail.size()) == tail) return tail.size();
  return 0;
}

std::string decode_entities(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '&') {
      bool matched = false;
      for (const auto& e : ENTITIES) {
        if (s.substr(i, e.text.size()) == e.text) {
          out += e.decoded;
          i += e.text.size();
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    out += s[i++];
  }
  return out;
}

// Invalid UTF-8 bytes replaced by U+FFFD one byte at a time, so that the
// result does not depend on how the text was split (the callers never split a
// valid sequence). Used for the arguments JSON, which must be valid UTF-8;
// content and reasoning keep the sampled bytes.
std::string utf8_sanitize(std::string_view s) {
  if (utf8_valid(s)) return std::string(s);
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = utf8_sequence_length(s.substr(i));
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s, i, n);
      i += n;
    }
  }
  return out;
}

// Whether `s` is a proper prefix of one of the literals, or starts with one.
enum class TagMatch { NONE, PARTIAL, FULL };
TagMatch match_literal(std::string_view s, std::string_view lit) {
  if (s.size() >= lit.size()) return s.substr(0, lit.size()) == lit ? TagMatch::FULL : TagMatch::NONE;
  return lit.substr(0, s.size()) == s ? TagMatch::PARTIAL : TagMatch::NONE;
}

struct Attr {
  std::string key, value;
};

// attrs := (ws+ key ws* "=" ws* '"' value '"')* ws*   (the text between the
// tag name and its '>'). Values are entity-decoded; keys must be unique.
expected<std::vector<Attr>> parse_attrs(std::string_view s) {
  std::vector<Attr> attrs;
  size_t i = 0;
  while (true) {
    const size_t ws = leading_ws(s.substr(i));
    i += ws;
    if (i == s.size()) return attrs;
    if (ws == 0) return make_error("expected whitespace before an attribute");
    size_t k = i;
    while (k < s.size() &&
           (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_' || s[k] == '-' || s[k] == ':' || s[k] == '.'))
      ++k;
    if (k == i) return make_error("bad attribute syntax");
    std::string key(s.substr(i, k - i));
    i = k + leading_ws(s.substr(k));
    if (i >= s.size() || s[i] != '=') return make_error("attribute '%s' has no value", key.c_str());
    ++i;
    i += leading_ws(s.substr(i));
    if (i >= s.size() || s[i] != '"') return make_error("attribute '%s' is not quoted", key.c_str());
    const size_t close = s.find('"', i + 1);
    if (close == std::string_view::npos) return make_error("attribute '%s' is not terminated", key.c_str());
    for (const auto& a : attrs)
      if (a.key == key) return make_error("duplicate attribute '%s'", key.c_str());
    attrs.push_back(Attr{std::move(key), decode_entities(s.substr(i + 1, close - i - 1))});
    i = close + 1;
  }
}

}  // namespace

const char* dsml_event_kind_name(DsmlEventKind kind) {
  switch (kind) {
    case DsmlEventKind::CONTENT: return "content";
    case DsmlEventKind::REASONING: return "reasoning";
    case DsmlEventKind::TOOL_CALL_START: return "tool_call_start";
    case DsmlEventKind::TOOL_CALL_ARGS: return "tool_call_args";
    case DsmlEventKind::TOOL_CALL_END: return "tool_call_end";
    case DsmlEventKind::TOOL_CALLS_ABORTED: return "tool_calls_aborted";
  }
  DSV4_UNREACHABLE();
}

DsmlParser::DsmlParser(ThinkingMode mode)
    : state_(mode == ThinkingMode::THINKING ? State::REASONING : State::CONTENT) {}

bool DsmlParser::in_block() const {
  switch (state_) {
    case State::BLOCK:
    case State::OPEN_TAG:
    case State::INVOKE_BODY:
    case State::STRING_VALUE:
    case State::JSON_VALUE:
    case State::CLOSE_TAG: return true;
    case State::REASONING:
    case State::CONTENT:
    case State::AFTER_BLOCK:
    case State::PLAIN:
    case State::DONE: return false;
  }
  DSV4_UNREACHABLE();
}

void DsmlParser::consume(size_t n) {
  DSV4_ASSERT(n <= in_.size() - pos_, "consume past the input");
  if (in_block()) block_raw_.append(in_, pos_, n);
  pos_ += n;
  content_ws_known_ = 0;
}

void DsmlParser::emit_text(DsmlEventKind kind, std::string_view s, std::vector<DsmlEvent>& ev) {
  if (s.empty()) return;
  DSV4_ASSERT(kind == DsmlEventKind::CONTENT || kind == DsmlEventKind::REASONING, "not a text event");
  (kind == DsmlEventKind::CONTENT ? msg_.content : msg_.reasoning_content) += s;
  ev.push_back(DsmlEvent{kind, 0, std::string(s)});
}

void DsmlParser::emit_args(std::string_view s, std::vector<DsmlEvent>& ev) {
  if (s.empty()) return;
  DSV4_ASSERT(!msg_.tool_calls.empty(), "arguments without a call");
  msg_.tool_calls.back().arguments += s;
  ev.push_back(DsmlEvent{DsmlEventKind::TOOL_CALL_ARGS, msg_.tool_calls.size() - 1, std::string(s)});
}

void DsmlParser::feed(std::string_view chunk, std::vector<DsmlEvent>& events) {
  DSV4_ASSERT(!finished_, "DsmlParser::feed after finish");
  in_.append(chunk);
  while (step(events)) {
  }
  in_.erase(0, pos_);
  pos_ = 0;
}

void DsmlParser::finish(std::vector<DsmlEvent>& events) {
  DSV4_ASSERT(!finished_, "DsmlParser::finish called twice");
  eof_ = true;
  while (step(events)) {
  }
  // At end of input every block state fails or completes, and the text states
  // flush everything.
  DSV4_ASSERT(rest().empty() && !in_block(), "input left after finish");
  if (state_ == State::REASONING) warn("the completion ended inside the reasoning (no </think>)");
  for (std::string_view m : {mk::BOS, mk::EOS, mk::THINK_START, mk::THINK_END, mk::DSML}) {
    if (msg_.content.find(m) != std::string::npos) warn("the content contains the special token " + std::string(m));
    if (msg_.reasoning_content.find(m) != std::string::npos)
      warn("the reasoning contains the special token " + std::string(m));
  }
  in_.clear();
  pos_ = 0;
  finished_ = true;
}

bool DsmlParser::step(std::vector<DsmlEvent>& ev) {
  switch (state_) {
    case State::REASONING: return step_reasoning(ev);
    case State::CONTENT: return step_content(ev);
    case State::BLOCK:
    case State::INVOKE_BODY: return step_expect_tag(ev);
    case State::OPEN_TAG: return step_open_tag(ev);
    case State::STRING_VALUE:
    case State::JSON_VALUE: return step_value(ev);
    case State::CLOSE_TAG: return step_close_tag(ev);
    case State::AFTER_BLOCK: return step_after_block();
    case State::PLAIN: return step_plain(ev);
    case State::DONE:
      if (!rest().empty()) {
        if (!warned_after_eos_) warn("text after the end-of-sentence marker was ignored");
        warned_after_eos_ = true;
        consume(rest().size());
      }
      return false;
  }
  DSV4_UNREACHABLE();
}

// Reasoning runs to the first </think> (DSML markers inside it are text).
// Held back: a partial </think> or EOS, then an incomplete UTF-8 sequence.
// Each step returns whether it consumed input or changed state.
bool DsmlParser::step_reasoning(std::vector<DsmlEvent>& ev) {
  std::string_view r = rest();
  const Found f = find_first(r, 0, {mk::THINK_END, mk::EOS});
  if (f.pos != std::string_view::npos) {
    emit_text(DsmlEventKind::REASONING, r.substr(0, f.pos), ev);
    if (f.which == 0) {
      consume(f.pos + mk::THINK_END.size());
      state_ = State::CONTENT;
    } else {
      consume(f.pos + mk::EOS.size());
      msg_.saw_eos = true;
      warn("the completion ended inside the reasoning (no </think>)");
      state_ = State::DONE;
    }
    return true;
  }
  size_t n = r.size();
  if (!eof_) {
    n -= partial_suffix(r, {mk::THINK_END, mk::EOS});
    n -= utf8_incomplete_suffix(r.substr(0, n));
  }
  emit_text(DsmlEventKind::REASONING, r.substr(0, n), ev);
  consume(n);
  return n > 0;
}

// After a malformed block: content up to EOS.
bool DsmlParser::step_plain(std::vector<DsmlEvent>& ev) {
  std::string_view r = rest();
  const size_t eos = r.find(mk::EOS);
  if (eos != std::string_view::npos) {
    emit_text(DsmlEventKind::CONTENT, r.substr(0, eos), ev);
    consume(eos + mk::EOS.size());
    msg_.saw_eos = true;
    state_ = State::DONE;
    return true;
  }
  size_t n = r.size();
  if (!eof_) {
    n -= partial_suffix(r, {mk::EOS});
    n -= utf8_incomplete_suffix(r.substr(0, n));
  }
  emit_text(DsmlEventKind::CONTENT, r.substr(0, n), ev);
  consume(n);
  return n > 0;
}

// Content: emit up to the next marker, holding back trailing whitespace (it
// belongs to a block if one follows) and a possible partial marker.
bool DsmlParser::step_content(std::vector<DsmlEvent>& ev) {
  std::string_view r = rest();
  const size_t known_ws = content_ws_known_;
  // Start of the whitespace run that ends at `end` ([known_ws..) is scanned
  // only; bytes before it are whitespace already).
  auto ws_run_start = [&](size_t end) {
    size_t s = end;
    while (s > known_ws && is_ws(r[s - 1])) --s;
    return s == known_ws ? 0 : s;
  };
  const std::initializer_list<std::string_view> lits = {mk::EOS, OPENERS[0].literal, OPENERS[1].literal,
                                                        OPENERS[2].literal};
  size_t from = known_ws;
  while (true) {
    const Found f = find_first(r, from, lits);
    if (f.pos == std::string_view::npos) break;
    if (f.which == 0) {  // EOS: the content ends, trailing whitespace included
      emit_text(DsmlEventKind::CONTENT, r.substr(0, f.pos), ev);
      consume(f.pos + mk::EOS.size());
      msg_.saw_eos = true;
      state_ = State::DONE;
      return true;
    }
    const Opener& op = OPENERS[f.which - 1];
    size_t j = f.pos + op.literal.size();
    j += leading_ws(r.substr(j));
    if (j == r.size() && !eof_) {
      // Maybe an opener: emit what precedes its whitespace, wait for the rest.
      size_t n = ws_run_start(f.pos);
      n -= utf8_incomplete_suffix(r.substr(0, n));
      emit_text(DsmlEventKind::CONTENT, r.substr(0, n), ev);
      consume(n);
      return n > 0;
    }
    if (j < r.size() && r[j] == '>') {
      const size_t ws = ws_run_start(f.pos);
      emit_text(DsmlEventKind::CONTENT, r.substr(0, ws), ev);
      lead_ws_ = std::string(r.substr(ws, f.pos - ws));
      consume(f.pos);
      const std::string prefix(op.prefix);
      lit_invoke_ = "<" + prefix + "invoke";
      lit_param_ = "<" + prefix + "parameter";
      lit_param_close_ = "</" + prefix + "parameter";
      lit_invoke_close_ = "</" + prefix + "invoke";
      lit_block_close_ = "</" + prefix + "tool_calls";
      if (f.which != 1) warn("the tool_calls block uses the non-canonical tag prefix '" + prefix + "'");
      block_raw_.clear();
      n_calls_ = 0;
      state_ = State::BLOCK;
      consume(j + 1 - f.pos);
      return true;
    }
    from = f.pos + 1;  // "<tool_calls" followed by something else: plain text
  }
  size_t hold = eof_ ? r.size() : r.size() - partial_suffix(r, lits);
  size_t n = eof_ ? hold : ws_run_start(hold);
  size_t utf8_hold = eof_ ? 0 : utf8_incomplete_suffix(r.substr(0, n));
  n -= utf8_hold;
  emit_text(DsmlEventKind::CONTENT, r.substr(0, n), ev);
  consume(n);
  content_ws_known_ = utf8_hold == 0 ? hold - n : 0;
  return n > 0;
}

// BLOCK expects <invoke or </tool_calls; INVOKE_BODY expects <parameter or
// </invoke; whitespace before them is skipped.
bool DsmlParser::step_expect_tag(std::vector<DsmlEvent>& ev) {
  const size_t ws = leading_ws(rest());
  consume(ws);
  std::string_view r = rest();
  if (r.empty()) {
    if (eof_) fail("the block is cut off", ev);
    return ws > 0 || eof_;
  }
  const bool in_invoke = state_ == State::INVOKE_BODY;
  const std::string& open = in_invoke ? lit_param_ : lit_invoke_;
  const std::string& close = in_invoke ? lit_invoke_close_ : lit_block_close_;
  const TagMatch mo = match_literal(r, open), mc = match_literal(r, close);
  if (mo == TagMatch::FULL) {
    consume(open.size());
    tag_kind_ = in_invoke ? TagKind::PARAMETER : TagKind::INVOKE;
    state_ = State::OPEN_TAG;
    return true;
  }
  if (mc == TagMatch::FULL) {
    consume(close.size());
    close_kind_ = in_invoke ? CloseKind::INVOKE : CloseKind::TOOL_CALLS;
    state_ = State::CLOSE_TAG;
    return true;
  }
  if ((mo == TagMatch::PARTIAL || mc == TagMatch::PARTIAL) && !eof_) return ws > 0;
  fail(in_invoke ? "expected a parameter or the end of the invoke" : "expected an invoke or the end of the block", ev);
  return true;
}

bool DsmlParser::step_open_tag(std::vector<DsmlEvent>& ev) {
  std::string_view r = rest();
  const size_t limit = std::min(r.size(), MAX_TAG_BYTES + 1);
  size_t gt = std::string_view::npos;
  bool quoted = false;
  for (size_t k = 0; k < limit; ++k) {
    if (r[k] == '"') {
      quoted = !quoted;
    } else if (r[k] == '>' && !quoted) {
      gt = k;
      break;
    }
  }
  const std::string_view scanned = r.substr(0, gt == std::string_view::npos ? limit : gt + 1);
  if (scanned.find(mk::EOS) != std::string_view::npos) {
    fail("the block is cut off by the end-of-sentence marker", ev);
    return true;
  }
  if (gt == std::string_view::npos) {
    if (r.size() > MAX_TAG_BYTES) {
      fail("a tag is too long", ev);
      return true;
    }
    if (eof_) fail("the block is cut off", ev);
    return eof_;
  }
  auto attrs = parse_attrs(r.substr(0, gt));
  if (!attrs) {
    fail(attrs.error().message, ev);
    return true;
  }
  const std::string* name = nullptr;
  const std::string* string_attr = nullptr;
  std::vector<std::string> ignored;
  for (const auto& a : *attrs) {
    if (a.key == "name")
      name = &a.value;
    else if (a.key == "string" && tag_kind_ == TagKind::PARAMETER)
      string_attr = &a.value;
    else
      ignored.push_back(a.key);
  }
  if (!name || name->empty()) {
    fail(tag_kind_ == TagKind::INVOKE ? "an invoke has no name" : "a parameter has no name", ev);
    return true;
  }
  if (tag_kind_ == TagKind::INVOKE) {
    const std::string fn = *name;
    for (const auto& k : ignored) warn("ignored attribute '" + k + "' on invoke '" + fn + "'");
    consume(gt + 1);
    msg_.tool_calls.push_back(ChatToolCall{"", fn, ""});
    ++n_calls_;
    ev.push_back(DsmlEvent{DsmlEventKind::TOOL_CALL_START, msg_.tool_calls.size() - 1, fn});
    emit_args("{", ev);
    param_names_.clear();
    state_ = State::INVOKE_BODY;
    return true;
  }
  if (string_attr && *string_attr != "true" && *string_attr != "false") {
    fail("parameter '" + *name + "' has string=\"" + *string_attr + "\"", ev);
    return true;
  }
  if (param_names_.count(*name)) {
    fail("duplicate parameter '" + *name + "'", ev);
    return true;
  }
  param_name_ = *name;
  value_is_string_ = !string_attr || *string_attr == "true";
  for (const auto& k : ignored) warn("ignored attribute '" + k + "' on parameter '" + param_name_ + "'");
  consume(gt + 1);
  std::string head = param_names_.empty() ? "" : ", ";
  head += py_json_quote(utf8_sanitize(param_name_));
  head += ": ";
  if (value_is_string_) head += '"';
  param_names_.insert(param_name_);
  emit_args(head, ev);
  json_value_.clear();
  json_in_string_ = json_escape_ = false;
  state_ = value_is_string_ ? State::STRING_VALUE : State::JSON_VALUE;
  return true;
}

// A parameter body runs to the first "</P parameter". String bodies stream
// (entity-decoded, JSON-escaped); JSON bodies are collected for validation.
bool DsmlParser::step_value(std::vector<DsmlEvent>& ev) {
  std::string_view r = rest();
  const bool is_string = state_ == State::STRING_VALUE;
  auto take = [&](std::string_view body) {
    if (is_string) {
      std::string esc;
      py_json_escape_to(esc, utf8_sanitize(decode_entities(body)));
      emit_args(esc, ev);
    } else {
      for (char c : body) {
        if (json_escape_)
          json_escape_ = false;
        else if (json_in_string_ && c == '\\')
          json_escape_ = true;
        else if (c == '"')
          json_in_string_ = !json_in_string_;
      }
      json_value_ += body;
    }
    consume(body.size());
  };
  const Found f = find_first(r, 0, {lit_param_close_, mk::EOS});
  if (f.pos != std::string_view::npos) {
    take(r.substr(0, f.pos));
    if (f.which == 1) {
      fail("the block is cut off by the end-of-sentence marker", ev);
      return true;
    }
    consume(lit_param_close_.size());
    close_kind_ = CloseKind::PARAMETER;
    state_ = State::CLOSE_TAG;
    return true;
  }
  if (eof_) {
    take(r);
    fail("the block is cut off", ev);
    return true;
  }
  size_t n = r.size() - partial_suffix(r, {lit_param_close_, mk::EOS});
  if (is_string) {
    if (n == r.size()) n -= partial_entity(r);
    n -= utf8_incomplete_suffix(r.substr(0, n));
  }
  take(r.substr(0, n));
  return n > 0;
}

void DsmlParser::finish_value(std::vector<DsmlEvent>& ev) {
  if (value_is_string_) {
    emit_args("\"", ev);
    return;
  }
  const std::string v = utf8_sanitize(json_value_);
  if (leading_ws(v) == v.size()) {
    warn("parameter '" + param_name_ + "' has an empty non-string value; using null");
    emit_args("null", ev);
  } else if (!check_json_text_depth(v, k_max_json_depth - 1)) {
    // (the value is one level inside the call's arguments object)
    warn("parameter '" + param_name_ + "' nests deeper than " + std::to_string(k_max_json_depth - 1) +
         " levels; passed as a string");
    emit_args(py_json_quote(v), ev);
  } else if (v.find('\0') == std::string::npos && nlohmann::ordered_json::accept(v)) {
    // (nlohmann's lexer ends the input at a NUL byte: "2\0 junk" would pass accept() and then
    // break the arguments object; raw control characters are never valid JSON outside strings.)
    emit_args(v, ev);
  } else {
    warn("parameter '" + param_name_ + "' is marked string=\"false\" but is not valid JSON; passed as a string");
    emit_args(py_json_quote(v), ev);
  }
}

bool DsmlParser::step_close_tag(std::vector<DsmlEvent>& ev) {
  const size_t ws = leading_ws(rest());
  consume(ws);
  std::string_view r = rest();
  if (r.empty()) {
    if (eof_) fail("the block is cut off", ev);
    return ws > 0 || eof_;
  }
  if (r[0] != '>') {
    fail("malformed closing tag", ev);
    return true;
  }
  consume(1);
  switch (close_kind_) {
    case CloseKind::PARAMETER:
      finish_value(ev);
      state_ = State::INVOKE_BODY;
      break;
    case CloseKind::INVOKE:
      emit_args("}", ev);
      ev.push_back(DsmlEvent{DsmlEventKind::TOOL_CALL_END, msg_.tool_calls.size() - 1, ""});
      state_ = State::BLOCK;
      break;
    case CloseKind::TOOL_CALLS:
      if (n_calls_ == 0) warn("the tool_calls block is empty");
      msg_.raw_dsml = lead_ws_ + block_raw_;
      block_closed_ = true;
      state_ = State::AFTER_BLOCK;
      break;
  }
  return true;
}

bool DsmlParser::step_after_block() {
  std::string_view r = rest();
  const size_t eos = r.find(mk::EOS);
  size_t n = eos != std::string_view::npos ? eos : eof_ ? r.size() : r.size() - partial_suffix(r, {mk::EOS});
  if (leading_ws(r.substr(0, n)) != n && !warned_after_block_) {
    warn("text after the tool_calls block was ignored");
    warned_after_block_ = true;
  }
  if (eos != std::string_view::npos) {
    consume(eos + mk::EOS.size());
    msg_.saw_eos = true;
    state_ = State::DONE;
    return true;
  }
  consume(n);
  return n > 0;
}

void DsmlParser::fail(const std::string& reason, std::vector<DsmlEvent>& ev) {
  DSV4_ASSERT(in_block(), "fail outside a block");
  if (n_calls_ > 0) {
    ev.push_back(DsmlEvent{DsmlEventKind::TOOL_CALLS_ABORTED, 0, ""});
    msg_.tool_calls.clear();
  }
  warn("malformed tool_calls block (" + reason + "); its text is kept as content");
  state_ = State::PLAIN;
  emit_text(DsmlEventKind::CONTENT, lead_ws_ + block_raw_, ev);
  lead_ws_.clear();
  block_raw_.clear();
  n_calls_ = 0;
}

size_t DsmlParser::held_param_close() const {
  std::string_view r = rest();
  if (r.size() >= 2 && match_literal(r, lit_param_close_) == TagMatch::PARTIAL) return r.size();
  return 0;
}

bool DsmlParser::in_dsml_structure() const {
  switch (state_) {
    case State::REASONING:
    case State::CONTENT:
    case State::PLAIN:
    case State::DONE: return false;
    case State::BLOCK:
    case State::OPEN_TAG:
    case State::INVOKE_BODY:
    case State::CLOSE_TAG:
    case State::AFTER_BLOCK: return true;
    case State::STRING_VALUE: return held_param_close() > 0;
    case State::JSON_VALUE: return !json_in_string_ || held_param_close() > 0;
  }
  DSV4_UNREACHABLE();
}

ParsedMessage parse_completion(std::string_view text, ThinkingMode mode) {
  DsmlParser p(mode);
  std::vector<DsmlEvent> events;
  p.feed(text, events);
  p.finish(events);
  return p.message();
}

}  // namespace dsv4
