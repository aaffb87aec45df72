#include "run_output.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace dsv4::tools {

Colors colors_for_terminal(bool no_color_flag) {
  const char* no_color = std::getenv("NO_COLOR");
  const bool allowed = !no_color_flag && (no_color == nullptr || no_color[0] == '\0');
  return Colors{allowed && ::isatty(1) != 0, allowed && ::isatty(2) != 0};
}

void ReplyPrinter::write(std::string_view s) {
  if (s.empty()) return;
  std::fwrite(s.data(), 1, s.size(), out_);
  last_ = s.back();
  wrote_ = true;
}

void ReplyPrinter::enter(Section s) {
  if (s == section_) return;
  // Leave the current section.
  switch (section_) {
    case Section::NONE: break;
    case Section::REASONING:
      if (last_ != '\n') write("\n");
      write("[/thinking]");
      write(ansi_.reset());
      write("\n\n");
      break;
    case Section::CONTENT: break;
    case Section::TOOL_CALL:
      write(ansi_.reset());
      write("\n");
      break;
  }
  section_ = s;
  switch (s) {
    case Section::NONE: break;
    case Section::REASONING:
      if (last_ != '\n') write("\n");
      write(ansi_.dim());
      write("[thinking]\n");
      break;
    case Section::CONTENT: break;
    case Section::TOOL_CALL:
      if (last_ != '\n') write("\n");
      break;
  }
}

void ReplyPrinter::on_event(const DsmlEvent& e) {
  switch (e.kind) {
    case DsmlEventKind::REASONING:
      enter(Section::REASONING);
      write(e.text);
      break;
    case DsmlEventKind::CONTENT:
      enter(Section::CONTENT);
      write(e.text);
      break;
    case DsmlEventKind::TOOL_CALL_START:
      enter(Section::NONE);
      enter(Section::TOOL_CALL);
      write(ansi_.cyan());
      write("[tool call] ");
      write(ansi_.bold());
      write(e.text);
      write(ansi_.reset());
      write(ansi_.cyan());
      write(" ");
      break;
    case DsmlEventKind::TOOL_CALL_ARGS:
      enter(Section::TOOL_CALL);
      write(e.text);
      break;
    case DsmlEventKind::TOOL_CALL_END: enter(Section::NONE); break;
    case DsmlEventKind::TOOL_CALLS_ABORTED:
      enter(Section::NONE);
      if (last_ != '\n') write("\n");
      write(ansi_.dim());
      write("[the tool-call block above was malformed; its text follows as plain output]");
      write(ansi_.reset());
      write("\n");
      break;
  }
  std::fflush(out_);
}

void ReplyPrinter::finish() {
  enter(Section::NONE);
  if (wrote_ && last_ != '\n') write("\n");
  std::fflush(out_);
}

void PrefillProgress::update(uint64_t done, uint64_t total) {
  if (done >= total && !bar_) return;  // the whole prompt fitted in one batch: no bar
  if (!bar_) bar_ = std::make_unique<Progress>("prefill", total, "tok");
  bar_->update(done);
}

void PrefillProgress::finish() {
  if (bar_) bar_->finish();
  bar_.reset();
}

LoadIndicator::LoadIndicator(std::string label, bool enabled) : label_(std::move(label)) {
  if (!enabled) return;
  thread_ = std::thread([this] {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    bool drawn = false;
    while (!stop_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const double s = std::chrono::duration<double>(clock::now() - start).count();
      if (s < 0.5 || stop_.load()) continue;
      std::fprintf(stderr, "\r%s ... %.1f s ", label_.c_str(), s);
      std::fflush(stderr);
      drawn = true;
    }
    if (drawn) {
      std::fputs("\r\x1b[2K", stderr);  // erase the line
      std::fflush(stderr);
    }
  });
}

LoadIndicator::~LoadIndicator() { stop(); }

void LoadIndicator::stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::string stats_line(const GenerateResult& r, size_t session_tokens, uint32_t ctx) {
  const size_t prefilled = r.prompt_tokens - r.cached_tokens;
  std::string prefill = prefilled > 0 && r.prefill_seconds > 0
                            ? strfmt("prefill %.1f t/s", static_cast<double>(prefilled) / r.prefill_seconds)
                            : std::string("prefill - t/s");
  std::string decode = !r.tokens.empty() && r.decode_seconds > 0
                           ? strfmt("decode %.1f t/s", static_cast<double>(r.tokens.size()) / r.decode_seconds)
                           : std::string("decode - t/s");
  // Speculation: accepted/proposed, and tokens per forward pass (each pass gives one more than it accepts).
  std::string spec;
  if (r.spec.passes > 0)
    spec = strfmt(" | accepted %llu/%llu proposed, %.2f tokens/pass", static_cast<unsigned long long>(r.spec.accepted),
                  static_cast<unsigned long long>(r.spec.proposed),
                  static_cast<double>(r.spec.passes + r.spec.accepted) / static_cast<double>(r.spec.passes));
  return strfmt("[prompt %zu tokens (%zu cached), %s | generated %zu tokens, %s | finish %s | context %zu/%u%s]",
                r.prompt_tokens, r.cached_tokens, prefill.c_str(), r.tokens.size(), decode.c_str(),
                finish_reason_name(r.finish), session_tokens, ctx, spec.c_str());
}

void print_reply_report(const GenerateResult& r, size_t session_tokens, uint32_t ctx, bool color) {
  Ansi a(color);
  for (const auto& w : r.message.warnings) std::fprintf(stderr, "%snote: %s%s\n", a.dim(), w.c_str(), a.reset());
  if (r.finish == FinishReason::CANCELLED)
    std::fprintf(stderr, "%s[interrupted]%s\n", a.dim(), a.reset());
  else if (r.finish == FinishReason::LENGTH && session_tokens >= ctx)
    std::fprintf(stderr, "%s[the context of %u tokens is full]%s\n", a.dim(), ctx, a.reset());
  std::fprintf(stderr, "%s%s%s\n", a.dim(), stats_line(r, session_tokens, ctx).c_str(), a.reset());
  std::fflush(stderr);
}

}  // namespace dsv4::tools
