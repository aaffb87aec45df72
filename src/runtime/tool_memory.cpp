#include "runtime/tool_memory.h"

#include <algorithm>
#include <set>

#include "chat/dsml_parser.h"
#include "chat/json_limits.h"
#include "core/random.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::runtime {

namespace {

// "<｜DSML｜tool_calls>" and "</｜DSML｜tool_calls>" (formats.md §4.4).
const std::string& block_open() {
  static const std::string s = "<" + std::string(k_token_dsml) + "tool_calls>";
  return s;
}
const std::string& block_close() {
  static const std::string s = "</" + std::string(k_token_dsml) + "tool_calls>";
  return s;
}

// raw_dsml from its opening tag on (it starts with the whitespace before the tag).
std::string_view block_of(const std::string& raw_dsml) {
  const size_t p = raw_dsml.find(block_open());
  return p == std::string::npos ? std::string_view() : std::string_view(raw_dsml).substr(p);
}

}  // namespace

size_t ToolCallRecord::bytes() const {
  size_t n = sizeof(*this) + raw_dsml.size() + reasoning.size();
  for (const auto& c : calls) n += sizeof(c) + c.id.size() + c.name.size() + c.arguments.size();
  return n;
}

ToolMemory::ToolMemory(size_t max_ids, size_t max_bytes) : max_ids_(max_ids), max_bytes_(max_bytes) {}

std::string ToolMemory::new_id(std::string_view prefix) const {
  for (;;) {
    std::string id = std::string(prefix) + random_hex(16);
    std::lock_guard<std::mutex> lock(mu_);
    if (!by_id_.count(id)) return id;
  }
}

void ToolMemory::remember(ToolCallRecord record) {
  if (record.calls.empty()) return;
  auto rec = std::make_shared<const ToolCallRecord>(std::move(record));
  std::lock_guard<std::mutex> lock(mu_);
  // An id already remembered (only possible for client-chosen ids) moves to the new record.
  for (const auto& c : rec->calls) {
    auto it = by_id_.find(c.id);
    if (it == by_id_.end()) continue;
    forget_locked(it->second);
  }
  lru_.push_front(rec);
  bytes_ += rec->bytes();
  for (const auto& c : rec->calls) by_id_[c.id] = lru_.begin();
  if (std::string_view b = block_of(rec->raw_dsml); !b.empty()) by_block_.emplace(b, lru_.begin());
  evict_locked();
}

void ToolMemory::forget_locked(Lru::iterator it) {
  const ToolCallRecord& rec = **it;
  for (const auto& c : rec.calls) {
    auto id = by_id_.find(c.id);
    if (id != by_id_.end() && id->second == it) by_id_.erase(id);
  }
  if (std::string_view b = block_of(rec.raw_dsml); !b.empty()) {
    auto [lo, hi] = by_block_.equal_range(b);
    for (auto e = lo; e != hi; ++e)
      if (e->second == it) {
        by_block_.erase(e);
        break;
      }
  }
  bytes_ -= rec.bytes();
  lru_.erase(it);
}

void ToolMemory::evict_locked() {
  while (!lru_.empty() && (by_id_.size() > max_ids_ || bytes_ > max_bytes_)) forget_locked(std::prev(lru_.end()));
}

bool ToolMemory::knows(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.count(id) > 0;
}

ToolDsmlMap ToolMemory::calls_in(std::string_view text) const {
  ToolDsmlMap out;
  std::lock_guard<std::mutex> lock(mu_);
  if (by_block_.empty()) return out;
  for (size_t at = text.find(block_open()); at != std::string_view::npos; at = text.find(block_open(), at + 1)) {
    const size_t close = text.find(block_close(), at);
    if (close == std::string_view::npos) break;
    const size_t end = close + block_close().size();
    auto [lo, hi] = by_block_.equal_range(text.substr(at, end - at));
    for (auto e = lo; e != hi; ++e) {
      const ToolCallRecord& rec = **e->second;
      // The leading whitespace must be there too: the file keeps only DSML that occurs in its key.
      const size_t lead = rec.raw_dsml.size() - (end - at);
      if (lead > at || text.compare(at - lead, lead, rec.raw_dsml, 0, lead) != 0) continue;
      for (const auto& c : rec.calls)
        if (kv_tool_entry_valid(c.id, rec.raw_dsml)) out.emplace(c.id, rec.raw_dsml);
    }
  }
  return out;
}

std::shared_ptr<const ToolCallRecord> ToolMemory::lookup(const std::vector<std::string>& ids) {
  if (ids.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  auto first = by_id_.find(ids.front());
  if (first == by_id_.end()) return nullptr;
  const Lru::iterator rec_it = first->second;
  const ToolCallRecord& rec = **rec_it;
  if (rec.calls.size() != ids.size()) return nullptr;
  std::vector<std::string> want = ids, have;
  for (const auto& c : rec.calls) have.push_back(c.id);
  std::sort(want.begin(), want.end());
  std::sort(have.begin(), have.end());
  if (want != have) return nullptr;
  lru_.splice(lru_.begin(), lru_, rec_it);
  return *rec_it;
}

size_t ToolMemory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_id_.size();
}

size_t ToolMemory::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t recover_tool_calls(const std::vector<ChatMessage>& messages, ToolMemory& memory, const ToolCallFinder& find) {
  if (!find) return 0;
  std::vector<const ChatMessage*> unresolved;
  std::set<std::string> wanted;
  for (const auto& m : messages) {
    if (m.role != ChatRole::ASSISTANT || m.tool_calls.empty() || m.raw_dsml) continue;
    bool known = true;
    for (const auto& c : m.tool_calls) known = known && memory.knows(c.id);
    if (known) continue;
    unresolved.push_back(&m);
    for (const auto& c : m.tool_calls) wanted.insert(c.id);
  }
  if (unresolved.empty()) return 0;
  const ToolDsmlMap found = find(std::vector<std::string>(wanted.begin(), wanted.end()));
  size_t recovered = 0;
  for (const ChatMessage* m : unresolved) {
    auto first = found.find(m->tool_calls.front().id);
    if (first == found.end()) continue;
    const std::string& dsml = first->second;
    bool same_block = true;
    for (const auto& c : m->tool_calls) {
      auto f = found.find(c.id);
      same_block = same_block && f != found.end() && f->second == dsml;
    }
    if (!same_block) continue;
    // The block's calls, as the model wrote them.
    DsmlParser parser(ThinkingMode::CHAT);
    std::vector<DsmlEvent> events;
    parser.feed(dsml, events);
    parser.finish(events);
    const ParsedMessage& parsed = parser.message();
    if (parsed.raw_dsml != dsml || parsed.tool_calls.size() != m->tool_calls.size()) continue;
    ToolCallRecord rec;
    rec.raw_dsml = dsml;
    for (size_t i = 0; i < parsed.tool_calls.size(); ++i)
      rec.calls.push_back(ChatToolCall{m->tool_calls[i].id, parsed.tool_calls[i].name, parsed.tool_calls[i].arguments});
    memory.remember(std::move(rec));
    ++recovered;
  }
  return recovered;
}

size_t apply_exact_replay(std::vector<ChatMessage>& messages, ToolMemory& memory) {
  size_t replayed = 0;
  for (auto& m : messages) {
    if (m.role != ChatRole::ASSISTANT || m.tool_calls.empty() || m.raw_dsml) continue;
    std::vector<std::string> ids;
    for (const auto& c : m.tool_calls) ids.push_back(c.id);
    auto rec = memory.lookup(ids);
    if (!rec) continue;
    // Each call must be the one generated under its id, in the generated order
    // (tool results are sorted by the message's call order when rendered).
    bool same = true;
    for (size_t i = 0; i < m.tool_calls.size() && same; ++i) {
      const ChatToolCall& c = m.tool_calls[i];
      const ChatToolCall& r = rec->calls[i];
      same = r.id == c.id && r.name == c.name &&
             (r.arguments == c.arguments || json_text_equivalent(r.arguments, c.arguments));
    }
    if (!same) continue;
    m.raw_dsml = rec->raw_dsml;
    if ((!m.reasoning_content || m.reasoning_content->empty()) && !rec->reasoning.empty())
      m.reasoning_content = rec->reasoning;
    ++replayed;
  }
  return replayed;
}

}  // namespace dsv4::runtime
