// Appends to a RenderedPrompt while keeping its invariants: control pieces are
// exactly one special-token string each; non-control text is merged with the
// non-control piece before it (so BPE sees it as the official encoder's one
// string does); empty text adds nothing.
#pragma once

#include <string_view>

#include "core/text_piece.h"

namespace dsv4 {

class PromptBuilder {
 public:
  // Text from clients, tools or documents: never control, whatever it contains.
  void text(std::string_view s);
  // One special-token string inserted by the renderer.
  void control(std::string_view marker);
  // Constant text written by the renderer (templates): every special-token
  // string inside it (chat_marker::*) becomes a control piece, as the official
  // tokenizer would split it out of the prompt.
  void template_text(std::string_view s);

  RenderedPrompt take() { return std::move(out_); }
  const RenderedPrompt& pieces() const { return out_; }

 private:
  RenderedPrompt out_;
};

}  // namespace dsv4
