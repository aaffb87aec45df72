// What `dsv4 run` shows on the terminal: the streamed reply (reasoning dimmed
// and fenced off from the answer, tool calls on their own lines), the
// progress of loading and of long prefills, and the statistics line.
//
// The reply goes to stdout; everything else (options, progress, statistics,
// warnings) goes to stderr, so `dsv4 run -p ... > answer.txt` keeps only the
// reply. Colour (ANSI) is used on a stream only when it is a terminal, unless
// --no-color is given or NO_COLOR is set to a non-empty value
// (https://no-color.org).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "chat/dsml_parser.h"
#include "core/progress.h"
#include "generate/generate.h"

namespace dsv4::tools {

struct Colors {
  bool out = false;  // stdout
  bool err = false;  // stderr
};
// no_color_flag: --no-color.
Colors colors_for_terminal(bool no_color_flag);

// ANSI sequences (empty when colour is off).
struct Ansi {
  explicit Ansi(bool on) : on_(on) {}
  const char* dim() const { return on_ ? "\x1b[2m" : ""; }
  const char* bold() const { return on_ ? "\x1b[1m" : ""; }
  const char* cyan() const { return on_ ? "\x1b[36m" : ""; }
  const char* green() const { return on_ ? "\x1b[32m" : ""; }
  const char* red() const { return on_ ? "\x1b[31m" : ""; }
  const char* reset() const { return on_ ? "\x1b[0m" : ""; }

 private:
  bool on_;
};

// Streams one reply's DsmlEvents to stdout (or `out`):
//
//   [thinking]
//   ...reasoning...            (dimmed on a terminal)
//   [/thinking]
//
//   ...answer...
//   [tool call] name {"arg": "value"}
//
// A tool-call block the parser withdraws (malformed DSML) is announced and its
// text follows as ordinary content.
class ReplyPrinter {
 public:
  explicit ReplyPrinter(bool color, std::FILE* out = stdout) : ansi_(color), out_(out) {}
  void on_event(const DsmlEvent& e);
  // Closes an open thinking section or tool call and ends the last line.
  void finish();
  // True once anything was written.
  bool wrote() const { return wrote_; }

 private:
  enum class Section { NONE, REASONING, CONTENT, TOOL_CALL };
  void enter(Section s);
  void write(std::string_view s);

  Ansi ansi_;
  std::FILE* out_;
  Section section_ = Section::NONE;
  bool wrote_ = false;
  char last_ = '\n';  // last character written ('\n' at the start of a line)
};

// The prefill progress bar: drawn (on a terminal stderr) only for prompts that
// need more than one forward batch, i.e. from the second progress report on.
class PrefillProgress {
 public:
  void update(uint64_t done, uint64_t total);
  void finish();

 private:
  std::unique_ptr<Progress> bar_;
};

// "loading FILE (7.11 MiB) ... 2.4 s" on a terminal stderr, redrawn from a
// helper thread while Engine::load runs (it reports no progress of its own);
// shown only when loading takes longer than half a second, erased by stop().
class LoadIndicator {
 public:
  LoadIndicator(std::string label, bool enabled);
  ~LoadIndicator();
  void stop();

 private:
  std::string label_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// "[prompt 25 tokens (12 cached), prefill 310.2 t/s | generated 20 tokens, decode 48.7 t/s | finish length |
//   context 57/32768]"
std::string stats_line(const GenerateResult& r, size_t session_tokens, uint32_t ctx);
// After a reply, on stderr (dimmed on a terminal): the parser's warnings,
// "[interrupted]" for a reply stopped by Ctrl-C, a note when the context is
// full, then the statistics line.
void print_reply_report(const GenerateResult& r, size_t session_tokens, uint32_t ctx, bool color);

}  // namespace dsv4::tools
