// A rendered prompt as a sequence of pieces: text that came from users, tools
// or documents (tokenized as plain text, never as control tokens) and control
// markers inserted by the chat renderer (each must be exactly one special
// token). Keeping the two apart is what stops a prompt from forging
// `<｜Assistant｜>` or a DSML marker (formats.md §3.5).
#pragma once

#include <string>
#include <vector>

namespace dsv4 {

struct TextPiece {
  std::string text;
  bool control = false;  // true: a special-token string emitted by the renderer
};

using RenderedPrompt = std::vector<TextPiece>;

// The prompt as one string (what a KV-cache prefix key or `dsv4 render` shows).
inline std::string rendered_text(const RenderedPrompt& p) {
  std::string s;
  for (const auto& piece : p) s += piece.text;
  return s;
}

}  // namespace dsv4
