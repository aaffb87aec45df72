// Choosing the prompt tokens of a chat request so the live session is reused
// as far as possible.
//
// The canonical tokens of a rendered prompt (Tokenizer::encode_prompt) can
// differ from the tokens the live session holds even where the text is the
// same: the session's completion part holds what the model *sampled*, and BPE
// of the same text may split it differently. So besides the longest common
// token prefix, the live session is matched against the rendered *text*:
//
//   walk the live tokens while their bytes equal the rendered text, with each
//   special token exactly on a control piece of the same text and no other
//   token overlapping a control piece; after k tokens at byte offset b the
//   prompt becomes  live[0, k) + encode_prompt(rendered cut at b).
//
// The choice with more reused tokens wins (ties: the canonical tokens). When
// the new prompt extends the session's text (a conversation sent back with
// the reply the model generated), everything the session holds is reused and
// only the new suffix is prefilled.
#pragma once

#include <cstdint>
#include <vector>

#include "core/text_piece.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server {

struct PromptChoice {
  std::vector<int32_t> tokens;  // what to hand to generate()
  size_t reused = 0;            // leading tokens shared with the live session
  bool stitched = false;        // true: live prefix + suffix tokenization
};

PromptChoice choose_prompt_tokens(const Tokenizer& tok, const std::vector<int32_t>& live,
                                  const std::vector<int32_t>& canonical, const RenderedPrompt& rendered);

// The pieces of `p` from byte offset `offset` of its text on (a text piece
// containing the offset is cut; the offset must not fall inside a control piece).
RenderedPrompt rendered_suffix(const RenderedPrompt& p, size_t offset);

}  // namespace dsv4::server
