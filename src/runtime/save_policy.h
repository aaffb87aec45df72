// When to write KV-cache files, as pure functions of token counts and ids
// (docs/kv-cache-format.md §7). The server calls them; nothing here does I/O.
//
// Retokenisation. A stored prefix is reusable as a TOKENS match only if
// tokenizing a later, longer prompt reproduces the stored tokens. Text pieces
// are tokenized separately from control pieces (Tokenizer::encode_prompt), so
// a boundary right before or right after a control token is always stable.
// Inside a text piece, only the text's last pre-token chunk can change when
// more text is appended to that piece; a margin of tokens before the end of
// the piece keeps the boundary out of it. (A TEXT match does not need either:
// it stitches the stored tokens to the tokenization of the rest.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsv4::runtime {

struct SavePolicy {
  size_t min_tokens = 512;  // shorter prefixes are cheaper to prefill than to keep
  size_t align = 2048;      // cold fallback lengths are multiples of this
  size_t margin = 32;       // ... and end at least this many tokens before the last text token
  size_t frontier = 10240;  // frontier saves at positive multiples of this (0: none)
};

// The store length for the first prompt of a conversation that missed every
// cache ("cold"); 0: do not store. In order:
//   1. the anchor: the position of the last <｜User｜> before the first
//      <｜Assistant｜> — the system prompt and tool schemas that every
//      conversation of the same agent shares — if it holds >= min_tokens;
//   2. else the last text token's end minus `margin`, rounded down to a
//      multiple of `align`, if >= min_tokens (a long single message: later
//      requests that append to it or ask again reuse most of it);
//   3. else the position right after the last <｜Assistant｜>, if >=
//      min_tokens (the whole first turn; stable in chat and thinking modes);
//   4. else 0.
size_t cold_store_length(std::span<const int32_t> prompt, const Tokenizer& tok, const SavePolicy& p);

// True when a session holding n_tokens should be saved as a frontier: n is a
// positive multiple of `frontier`, n >= min_tokens and n > last_stored (the
// longest prefix of this timeline already saved). Checked between prefill
// chunks and before each decoded token; the server skips it inside a DSML
// tool-call block, whose text the client re-renders.
bool frontier_due(size_t n_tokens, size_t last_stored, const SavePolicy& p);

// Where a prefill from `from` to `to` tokens should stop so the server can
// save: the cold length (if in (from, to]; 0 = none) and every frontier in
// (max(from, last_stored), to], ascending, without duplicates. A point equal
// to `to` means: save after the prefill, before generating.
std::vector<size_t> prefill_save_points(size_t from, size_t to, size_t cold_length, size_t last_stored,
                                        const SavePolicy& p);

// A live session about to be displaced (or saved at shutdown) is worth a file
// when it holds >= min_tokens.
bool worth_saving(size_t n_tokens, const SavePolicy& p);

}  // namespace dsv4::runtime
