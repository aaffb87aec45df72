// Choosing the prompt tokens of a chat request so a live session is reused
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
//
// Anchors. In thinking mode without tools a client sends the conversation
// back without the earlier reasoning (the official renderer drops it), so the
// session's tokens, which hold that reasoning, no longer spell the rendered
// text. The server then remembers, per session, the client-visible
// transcript of its tokens (visible_transcript below): an anchor says "the
// first `tokens` live tokens stand for the first `bytes` rendered bytes", and
// the text walk starts there instead of at 0.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/text_piece.h"
#include "generate/generate.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::runtime {

struct PromptChoice {
  std::vector<int32_t> tokens;  // what to hand to generate()
  size_t reused = 0;            // leading tokens shared with the live session
  bool stitched = false;        // true: live prefix + suffix tokenization
};

// live[0, tokens) stand for the rendered prompt's bytes [0, bytes); the
// caller has checked that the rendered prompt starts with that transcript.
struct TextAnchor {
  size_t tokens = 0;
  size_t bytes = 0;
};

PromptChoice choose_prompt_tokens(const Tokenizer& tok, const std::vector<int32_t>& live,
                                  const std::vector<int32_t>& canonical, const RenderedPrompt& rendered,
                                  const TextAnchor* anchor = nullptr);

// choose_prompt_tokens(...).reused without tokenizing anything (cheap enough
// to ask of every resident session).
size_t reusable_tokens(const Tokenizer& tok, const std::vector<int32_t>& live, const std::vector<int32_t>& canonical,
                       const RenderedPrompt& rendered, const TextAnchor* anchor = nullptr);

// The pieces of `p` from byte offset `offset` of its text on (a text piece
// containing the offset is cut; the offset must not fall inside a control piece).
RenderedPrompt rendered_suffix(const RenderedPrompt& p, size_t offset);
// The pieces of `p` before byte `offset` (a text piece holding it is cut).
RenderedPrompt rendered_prefix(const RenderedPrompt& p, size_t offset);

// True when `p` starts with `prefix` piece by piece: every piece equal
// (text and kind), except that a last text piece of `prefix` may be a prefix
// of the corresponding text piece of `p`. A text boundary of `prefix` that
// `p` spells with a control piece (or the reverse) is no match, so client
// text can never stand in for a marker.
bool starts_with_pieces(const RenderedPrompt& p, const RenderedPrompt& prefix);

// The client-visible transcript of a finished turn in thinking mode without
// tools, which is what the client's next request renders for it:
//
//   prompt without its final <think>, </think>, the reply's content, and
//   <｜end▁of▁sentence｜> when the model ended with it
//
// (formats.md §4.2: reasoning before the last user turn is dropped, and so is
// the </think> ... <think> pairing of that turn). nullopt when the turn does
// not end that way: no </think> among the completion tokens, a client stop
// string, a cancelled or failed turn, a DSML block, or a prompt that does not
// end with <think>. The reasoning stays in the session's state; later turns
// see what the model actually thought.
std::optional<RenderedPrompt> visible_transcript(const Tokenizer& tok, const RenderedPrompt& prompt,
                                                 const GenerateResult& reply);

}  // namespace dsv4::runtime
