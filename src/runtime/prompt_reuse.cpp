#include "runtime/prompt_reuse.h"

#include <algorithm>

#include "runtime/session_cache.h"
#include "core/assert.h"

namespace dsv4::runtime {

RenderedPrompt rendered_suffix(const RenderedPrompt& p, size_t offset) {
  auto r = rendered_from(p, offset);  // runtime/session_cache.h
  DSV4_ASSERT(r.has_value(), "%s", r ? "" : r.error().message.c_str());
  return std::move(*r);
}

RenderedPrompt rendered_prefix(const RenderedPrompt& p, size_t offset) {
  RenderedPrompt out;
  size_t at = 0;
  for (const auto& piece : p) {
    if (at >= offset) break;
    const size_t end = at + piece.text.size();
    if (end <= offset) {
      out.push_back(piece);
    } else {
      DSV4_ASSERT(!piece.control, "cut inside a control piece");
      out.push_back(TextPiece{piece.text.substr(0, offset - at), false});
    }
    at = end;
  }
  return out;
}

bool starts_with_pieces(const RenderedPrompt& p, const RenderedPrompt& prefix) {
  if (prefix.size() > p.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    const TextPiece& a = prefix[i];
    const TextPiece& b = p[i];
    if (a.control != b.control) return false;
    const bool last_text = i + 1 == prefix.size() && !a.control;
    if (last_text ? b.text.compare(0, a.text.size(), a.text) != 0 || b.text.size() < a.text.size() : a.text != b.text)
      return false;
  }
  return true;
}

namespace {

// How many leading live tokens spell a prefix of the rendered prompt, with
// special tokens exactly on control pieces and ordinary tokens inside text
// pieces; also the byte offset reached. The walk starts after live[0, k0),
// which stand for the bytes [0, off0).
std::pair<size_t, size_t> text_match(const Tokenizer& tok, const std::vector<int32_t>& live, const RenderedPrompt& p,
                                     size_t k0, size_t off0) {
  size_t k = k0, off = off0;
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

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// The text walk from the anchor (or from the start), when there is something to walk.
std::optional<std::pair<size_t, size_t>> walk(const Tokenizer& tok, const std::vector<int32_t>& live,
                                              const RenderedPrompt& rendered, const TextAnchor* anchor) {
  if (rendered.empty() || live.empty()) return std::nullopt;
  if (anchor) {
    DSV4_ASSERT(anchor->tokens <= live.size(), "an anchor covers more tokens than the session holds");
    return text_match(tok, live, rendered, anchor->tokens, anchor->bytes);
  }
  return text_match(tok, live, rendered, 0, 0);
}

}  // namespace

size_t reusable_tokens(const Tokenizer& tok, const std::vector<int32_t>& live, const std::vector<int32_t>& canonical,
                       const RenderedPrompt& rendered, const TextAnchor* anchor) {
  const size_t lcp = common_prefix(live, canonical);
  const auto w = walk(tok, live, rendered, anchor);
  return w ? std::max(lcp, w->first) : lcp;
}

PromptChoice choose_prompt_tokens(const Tokenizer& tok, const std::vector<int32_t>& live,
                                  const std::vector<int32_t>& canonical, const RenderedPrompt& rendered,
                                  const TextAnchor* anchor) {
  PromptChoice c;
  const size_t lcp = common_prefix(live, canonical);
  c.tokens = canonical;
  c.reused = lcp;
  const auto w = walk(tok, live, rendered, anchor);
  if (!w) return c;
  const auto [k, off] = *w;
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

std::optional<RenderedPrompt> visible_transcript(const Tokenizer& tok, const RenderedPrompt& prompt,
                                                 const GenerateResult& reply) {
  if (prompt.empty() || !prompt.back().control || prompt.back().text != k_token_think_begin) return std::nullopt;
  if (std::find(reply.tokens.begin(), reply.tokens.end(), tok.think_end()) == reply.tokens.end()) return std::nullopt;
  if (!reply.message.raw_dsml.empty() || !reply.message.tool_calls.empty()) return std::nullopt;
  bool with_eos = false;
  switch (reply.finish) {
    case FinishReason::STOP:
      // Ended by the model (EOS), not by a client stop string the session holds but the client never saw.
      if (!reply.stop_string.empty() || reply.tokens.empty() || reply.tokens.back() != tok.eos()) return std::nullopt;
      with_eos = true;
      break;
    case FinishReason::LENGTH: break;  // the client sends the cut reply back, the renderer closes it with EOS
    case FinishReason::TOOL_CALLS:
    case FinishReason::CANCELLED: return std::nullopt;
  }
  RenderedPrompt v(prompt.begin(), prompt.end() - 1);
  v.push_back(TextPiece{std::string(k_token_think_end), true});
  if (!reply.message.content.empty()) v.push_back(TextPiece{reply.message.content, false});
  if (with_eos) v.push_back(TextPiece{std::string(k_token_eos), true});
  return v;
}

}  // namespace dsv4::runtime
