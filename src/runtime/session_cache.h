// Sessions <-> the on-disk KV cache (docs/kv-cache-format.md §6-§7): restore
// the longest cached prefix of a prompt into a Session, and save a Session as
// a cache file. The byte-level store is kv/disk_cache.h.
//
// Lookup rule. An entry is usable for a prompt when either
//   * TOKENS: its token ids are a prefix of the prompt's tokens; the prompt is
//     unchanged and only prompt[n:] is prefilled; or
//   * TEXT: its key text is a byte prefix of the rendered prompt and (for a
//     decoded key) its tokens spell that prefix piece by piece: every special
//     token exactly on a control piece of the same text, no other token
//     overlapping a control piece (so a client's text that spells a marker
//     never matches a cached control token, and vice versa); the prompt
//     becomes the entry's tokens + the tokenization of the rest of the
//     rendered prompt. This finds entries whose tokens were *sampled* (a
//     conversation saved with its completions), which the canonical
//     tokenization of the same text need not reproduce.
// The entry with the most tokens wins (ties: a TOKENS match). Entries must
// hold fewer tokens than the session's context. Candidates that fail (gone,
// corrupt: removed with a warning; misaligned) fall through to the next.
// The session is touched only by a fully validated file.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/cache_identity.h"
#include "core/error.h"
#include "core/text_piece.h"
#include "dsv4/engine.h"
#include "kv/disk_cache.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::runtime {

struct CacheQuery {
  std::span<const int32_t> tokens;           // the prompt's tokens (empty: no TOKENS matches)
  const RenderedPrompt* rendered = nullptr;  // the rendered prompt (null: no TEXT matches)
  size_t min_tokens = 1;                     // only entries holding at least this many tokens
};

struct CacheRestore {
  std::string file;  // the cache file's name
  SaveReason reason = SaveReason::OTHER;
  bool by_tokens = false;       // TOKENS match (else TEXT)
  bool decoded_key = true;      // the file's key is its decoded tokens (else a visible_key, CacheSave)
  size_t cached_tokens = 0;     // tokens now in the session, all reusable by the prompt
  size_t text_bytes = 0;        // bytes of the rendered prompt they cover
  std::vector<int32_t> prompt;  // the prompt to hand to generate(): starts with the restored tokens
  ToolDsmlMap tools;            // the file's tool-id -> DSML entries
};

// Finds the longest usable entry (rule above), loads it into `session` and
// records the hit. nullopt: a miss (recorded), the session is untouched.
std::optional<CacheRestore> cache_restore(DiskCache& cache, const Tokenizer& tok, Session& session,
                                          const CacheQuery& q);

struct CacheSave {
  SaveReason reason = SaveReason::OTHER;
  // Key text when it is not the decoded bytes of the session's tokens: a
  // client-visible transcript (e.g. without hidden reasoning) that a later
  // rendered prompt will start with. Unset: the decoded tokens.
  std::optional<std::string> visible_key;
  const ToolDsmlMap* tools = nullptr;  // tool-id -> raw DSML of calls in the key text
};

// Saves the whole session (it must hold >= 1 token). Failures degrade the
// cache (kv/disk_cache.h), never the session.
expected<StoreResult> cache_save(DiskCache& cache, const Tokenizer& tok, const Session& session, const CacheSave& s);

// The same save in two steps, so the engine thread does not wait for the
// disk: capture the session (a memory copy of its state, on the engine
// thread), then DiskCache::store(prepared.input()) on any thread while the
// engine runs on. `skipped` is set when there is nothing to write (the same
// file exists, or the store is read-only); the payload is then empty.
struct PreparedSave {
  std::string key;
  bool decoded_key = true;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;
  uint32_t ctx = 0;
  SaveReason reason = SaveReason::OTHER;
  ToolDsmlMap tools;
  std::optional<StoreResult> skipped;
  StoreInput input() const;  // views into this object
};
expected<PreparedSave> cache_prepare_save(DiskCache& cache, const Tokenizer& tok, const Session& session,
                                          const CacheSave& s);

// How many leading bytes of `p` the tokens spell under the TEXT rule, or
// nullopt when they do not spell a prefix of it.
std::optional<size_t> spelled_prefix_bytes(const Tokenizer& tok, std::span<const int32_t> tokens,
                                           const RenderedPrompt& p);

// The pieces of `p` from byte `offset` on (a text piece holding the offset is
// cut). Errors when the offset falls inside a control piece or past the end.
expected<RenderedPrompt> rendered_from(const RenderedPrompt& p, size_t offset);

}  // namespace dsv4::runtime
