// Tool-call memory for exact replay (formats.md §4.6): tool-call id -> the
// exact DSML block the model sampled for the turn that made the call, so that
// when a client sends the conversation back, the assistant turn renders to
// the bytes the model produced (the live session then matches the new prompt
// and only the new suffix is prefilled).
//
// Rules:
//   * ids are the dialect's prefix ("call_" or "toolu_") + 32 lowercase hex
//     characters from 16 random bytes (OpenSSL RAND_bytes); an id is never
//     handed out while it is still remembered;
//   * one record per generated turn: its raw block, its reasoning, and its
//     calls (id, name, arguments JSON text);
//   * an assistant message is replayed only when its tool-call ids are
//     exactly the ids of one record, in the generated order, and each call's
//     name and arguments are the ones generated (arguments compared as JSON,
//     so re-serialisation by the client does not matter); anything else
//     renders canonically;
//   * a replayed message without reasoning gets the record's reasoning back
//     (clients often drop reasoning_content; the model saw it);
//   * bounded: at most `max_ids` ids and `max_bytes` bytes of records, least
//     recently used records are evicted first. Thread-safe.
//
// With the on-disk KV cache (docs/kv-cache-format.md §2.4), a saved file
// carries id -> DSML for the blocks its key text holds (calls_in), and after
// a restart the ids a client sends back are recovered from those files
// (recover_tool_calls), so exact replay, and with it the cached prefix,
// survives the restart.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/chat_message.h"
#include "kv/kv_file.h"

namespace dsv4::runtime {

struct ToolCallRecord {
  std::string raw_dsml;             // ParsedMessage::raw_dsml
  std::string reasoning;            // the turn's reasoning ("" if none)
  std::vector<ChatToolCall> calls;  // ids, names, arguments as generated
  size_t bytes() const;
};

class ToolMemory {
 public:
  explicit ToolMemory(size_t max_ids = 100000, size_t max_bytes = size_t{256} << 20);

  // prefix + 32 hex characters, not currently remembered.
  std::string new_id(std::string_view prefix) const;
  // Remembers a turn's record under each of its call ids.
  void remember(ToolCallRecord record);
  // The record whose ids are exactly `ids`, if there is one (marks it recently used).
  std::shared_ptr<const ToolCallRecord> lookup(const std::vector<std::string>& ids);
  // Whether an id is remembered.
  bool knows(const std::string& id) const;
  // Id -> raw DSML of every remembered call whose block occurs in `text`
  // (found by the blocks' tool_calls tags, not by scanning every record).
  ToolDsmlMap calls_in(std::string_view text) const;

  size_t size() const;   // ids remembered
  size_t bytes() const;  // bytes of records remembered

 private:
  using Lru = std::list<std::shared_ptr<const ToolCallRecord>>;  // most recently used first
  void evict_locked();
  void forget_locked(Lru::iterator it);

  size_t max_ids_, max_bytes_;
  mutable std::mutex mu_;
  Lru lru_;
  std::unordered_map<std::string, Lru::iterator> by_id_;
  // Block text from its opening tag on (raw_dsml without the leading
  // whitespace; views into the records) -> the records with that block.
  std::unordered_multimap<std::string_view, Lru::iterator> by_block_;
  size_t bytes_ = 0;
};

// Before rendering: for assistant messages whose tool-call ids the memory
// does not know, asks `find` (the disk cache's id -> DSML maps) and
// remembers a record for each message whose ids all map to one block that
// parses to exactly its calls (ids in the message's order; no reasoning).
// apply_exact_replay then checks names and arguments as usual. Returns how
// many records were recovered.
using ToolCallFinder = std::function<ToolDsmlMap(const std::vector<std::string>& ids)>;
size_t recover_tool_calls(const std::vector<ChatMessage>& messages, ToolMemory& memory, const ToolCallFinder& find);

// Sets raw_dsml (and, when missing, reasoning_content) on every assistant
// message of `messages` that the memory can replay exactly (rules above).
// Returns how many messages were replayed.
size_t apply_exact_replay(std::vector<ChatMessage>& messages, ToolMemory& memory);

}  // namespace dsv4::runtime
