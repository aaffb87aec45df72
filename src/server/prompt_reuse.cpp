#include "server/prompt_reuse.h"

#include "core/assert.h"

namespace dsv4::server {

RenderedPrompt rendered_suffix(const RenderedPrompt& p, size_t offset) {
  RenderedPrompt out;
  size_t at = 0;
  for (const auto& piece : p) {
    const size_t end = at + piece.text.size();
    if (end <= offset) {
      at = end;
      continue;
    }
    if (at >= offset) {
      out.push_back(piece);
    } else {
      DSV4_ASSERT(!piece.control, "cut inside a control piece");
      out.push_back(TextPiece{piece.text.substr(offset - at), false});
    }
    at = end;
  }
  return out;
}

namespace {

// How many leading live tokens spell a prefix of the rendered prompt, with
// special tokens exactly on control pieces and ordinary tokens inside text
// pieces; also the byte offset reached.
std::pair<size_t, size_t> text_match(const Tokenizer& tok, const std::vector<int32_t>& live, const RenderedPrompt& p) {
  size_t k = 0, off = 0;
  size_t piece = 0, piece_start = 0;  // the piece containing byte `off`
  auto advance_piece = [&] {
    while (piece < p.size() && off >= piece_start + p[piece].text.size()) {
      piece_start += p[piece].text.size();
      ++piece;
    }
  };
  advance_piece();
  while (k < live.size() && piece < p.size()) {
    const std::string_view bytes = tok.token_bytes(live[k]);
    if (bytes.empty()) break;
    const TextPiece& cur = p[piece];
    if (tok.is_special(live[k])) {
      // Must be exactly this control piece.
      if (!cur.control || off != piece_start || cur.text != bytes) break;
    } else {
      // Must lie inside this text piece.
      if (cur.control || off + bytes.size() > piece_start + cur.text.size()) break;
      if (std::string_view(cur.text).substr(off - piece_start, bytes.size()) != bytes) break;
    }
    off += bytes.size();
    ++k;
    advance_piece();
  }
  return {k, off};
}

}  // namespace

PromptChoice choose_prompt_tokens(const Tokenizer& tok, const std::vector<int32_t>& live,
                                  const std::vector<int32_t>& canonical, const RenderedPrompt& rendered) {
  PromptChoice c;
  size_t lcp = 0;
  while (lcp < live.size() && lcp < canonical.size() && live[lcp] == canonical[lcp]) ++lcp;
  c.tokens = canonical;
  c.reused = lcp;
  if (rendered.empty() || live.empty()) return c;
  const auto [k, off] = text_match(tok, live, rendered);
  if (k <= lcp) return c;
  auto suffix = tok.encode_prompt(rendered_suffix(rendered, off));
  if (!suffix) return c;  // the canonical encoding succeeded, so this cannot fail; keep it safe anyway
  std::vector<int32_t> stitched(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(k));
  stitched.insert(stitched.end(), suffix->begin(), suffix->end());
  c.tokens = std::move(stitched);
  c.reused = k;
  c.stitched = true;
  return c;
}

}  // namespace dsv4::server
