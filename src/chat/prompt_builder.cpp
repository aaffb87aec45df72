#include "chat/prompt_builder.h"

#include <array>

#include "chat/markers.h"
#include "core/assert.h"

namespace dsv4 {

void PromptBuilder::text(std::string_view s) {
  if (s.empty()) return;
  if (!out_.empty() && !out_.back().control)
    out_.back().text += s;
  else
    out_.push_back(TextPiece{std::string(s), false});
}

void PromptBuilder::control(std::string_view marker) {
  DSV4_ASSERT(!marker.empty(), "empty control piece");
  out_.push_back(TextPiece{std::string(marker), true});
}

void PromptBuilder::template_text(std::string_view s) {
  static constexpr std::array<std::string_view, 8> SPECIALS = {
      chat_marker::BOS,         chat_marker::EOS,       chat_marker::USER, chat_marker::ASSISTANT,
      chat_marker::THINK_START, chat_marker::THINK_END, chat_marker::DSML, chat_marker::LATEST_REMINDER};
  while (!s.empty()) {
    size_t best = std::string_view::npos;
    std::string_view best_marker;
    for (std::string_view m : SPECIALS) {
      size_t p = s.find(m);
      if (p < best) {
        best = p;
        best_marker = m;
      }
    }
    if (best == std::string_view::npos) {
      text(s);
      return;
    }
    text(s.substr(0, best));
    control(best_marker);
    s.remove_prefix(best + best_marker.size());
  }
}

}  // namespace dsv4
