#include "runtime/session_cache.h"

#include <algorithm>

#include "core/log.h"

namespace dsv4::runtime {

std::optional<size_t> spelled_prefix_bytes(const Tokenizer& tok, std::span<const int32_t> tokens,
                                           const RenderedPrompt& p) {
  size_t piece = 0, off = 0, bytes = 0;  // cursor: p[piece].text[off]
  auto skip_done = [&] {
    while (piece < p.size() && off == p[piece].text.size()) {
      ++piece;
      off = 0;
    }
  };
  for (int32_t t : tokens) {
    skip_done();
    if (piece == p.size()) return std::nullopt;
    std::string_view b = tok.token_bytes(t);
    if (b.empty()) return std::nullopt;
    if (tok.is_special(t)) {
      // A special token is exactly one whole control piece.
      if (!p[piece].control || off != 0 || p[piece].text != b) return std::nullopt;
      off = p[piece].text.size();
      bytes += b.size();
      continue;
    }
    // Any other token lies in text pieces only (it may span adjacent ones).
    for (size_t i = 0; i < b.size();) {
      skip_done();
      if (piece == p.size() || p[piece].control) return std::nullopt;
      const size_t k = std::min(b.size() - i, p[piece].text.size() - off);
      if (p[piece].text.compare(off, k, b.substr(i, k)) != 0) return std::nullopt;
      i += k;
      off += k;
    }
    bytes += b.size();
  }
  return bytes;
}

expected<RenderedPrompt> rendered_from(const RenderedPrompt& p, size_t offset) {
  RenderedPrompt out;
  size_t at = 0;
  for (const TextPiece& piece : p) {
    const size_t end = at + piece.text.size();
    if (end <= offset) {
      at = end;
      continue;
    }
    if (at >= offset) {
      out.push_back(piece);
    } else {
      if (piece.control) return make_error("byte %zu falls inside the control piece at byte %zu", offset, at);
      out.push_back(TextPiece{piece.text.substr(offset - at), false});
    }
    at = end;
  }
  if (offset > at) return make_error("byte %zu is past the end of the rendered prompt (%zu bytes)", offset, at);
  return out;
}

std::optional<CacheRestore> cache_restore(DiskCache& cache, const Tokenizer& tok, Session& session,
                                          const CacheQuery& q) {
  const std::string text = q.rendered ? rendered_text(*q.rendered) : std::string();
  if (session.ctx() < 2) {
    cache.record_miss();
    return std::nullopt;
  }
  const uint64_t max_tokens = session.ctx() - 1;  // leave room for at least one more token
  const auto candidates = cache.find(text, q.tokens, std::max<size_t>(q.min_tokens, 1), max_tokens);
  for (const CacheCandidate& c : candidates) {
    auto rec = cache.read(c.entry);
    if (!rec) {
      log_debug("KV disk cache: %s", rec.error().message.c_str());
      continue;
    }
    const KvFileView& v = rec->view;
    const size_t n = v.tokens.size();
    CacheRestore r;
    if (c.tokens_match && n <= q.tokens.size() && std::equal(v.tokens.begin(), v.tokens.end(), q.tokens.begin())) {
      r.by_tokens = true;
      r.prompt.assign(q.tokens.begin(), q.tokens.end());
      if (c.text_match && q.rendered && text.compare(0, v.text.size(), v.text) == 0) r.text_bytes = v.text.size();
    } else if (c.text_match && q.rendered && text.compare(0, v.text.size(), v.text) == 0) {
      if (v.header.decoded_key()) {
        std::optional<size_t> spelled = spelled_prefix_bytes(tok, v.tokens, *q.rendered);
        if (!spelled || *spelled != v.text.size()) {
          log_debug("KV disk cache: %s matches the text but not the control pieces of the prompt",
                    c.entry.name.c_str());
          continue;
        }
      }
      auto rest = rendered_from(*q.rendered, v.text.size());
      if (!rest) continue;
      auto suffix = tok.encode_prompt(*rest);
      if (!suffix) continue;
      r.text_bytes = v.text.size();
      r.prompt = v.tokens;
      r.prompt.insert(r.prompt.end(), suffix->begin(), suffix->end());
    } else {
      continue;
    }
    // Session::load validates the payload completely before it changes the session.
    if (Status st = session.load(v.payload); !st) {
      cache.discard(rec->entry, "the engine rejected its payload: " + st.error().message);
      continue;
    }
    if (session.tokens() != v.tokens) {  // only a faulty writer can get here: both copies are checksummed
      session.reset();
      cache.discard(rec->entry, "its token section and its payload disagree");
      continue;
    }
    cache.record_hit(rec->entry);
    r.file = rec->entry.name;
    r.reason = v.header.reason;
    r.decoded_key = v.header.decoded_key();
    r.cached_tokens = n;
    r.tools = v.tools;
    return r;
  }
  cache.record_miss();
  return std::nullopt;
}

StoreInput PreparedSave::input() const {
  StoreInput in;
  in.key_text = key;
  in.decoded_key = decoded_key;
  in.tokens = tokens;
  in.payload = payload;
  in.ctx = ctx;
  in.reason = reason;
  in.tools = &tools;
  return in;
}

expected<PreparedSave> cache_prepare_save(DiskCache& cache, const Tokenizer& tok, const Session& session,
                                          const CacheSave& s) {
  if (session.tokens().empty()) return make_error("the session holds no tokens");
  PreparedSave p;
  p.tokens = session.tokens();
  p.key = s.visible_key ? *s.visible_key : tok.decode(p.tokens);
  p.decoded_key = !s.visible_key.has_value();
  p.ctx = session.ctx();
  p.reason = s.reason;
  if (s.tools) p.tools = *s.tools;
  // Cheap exits before the session is serialised.
  StoreResult skip;
  skip.name = kv_file_name(sha256_digest(p.key.data(), p.key.size()));
  if (!cache.stats().writable) {
    skip.outcome = StoreOutcome::READ_ONLY;
    p.skipped = skip;
  } else if (p.tools.empty() && cache.has(p.key, p.tokens)) {
    skip.outcome = StoreOutcome::ALREADY_PRESENT;
    p.skipped = skip;
  } else {
    p.payload = session.save();
  }
  return p;
}

expected<StoreResult> cache_save(DiskCache& cache, const Tokenizer& tok, const Session& session, const CacheSave& s) {
  DSV4_TRY_ASSIGN(PreparedSave p, cache_prepare_save(cache, tok, session, s));
  if (p.skipped) return *p.skipped;
  return cache.store(p.input());
}

}  // namespace dsv4::runtime
