#include "server/tool_memory.h"

#include <algorithm>

#include "server/json_util.h"

namespace dsv4::server {

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
    auto old = it->second;
    for (const auto& oc : (*old)->calls) by_id_.erase(oc.id);
    bytes_ -= (*old)->bytes();
    lru_.erase(old);
  }
  lru_.push_front(rec);
  bytes_ += rec->bytes();
  for (const auto& c : rec->calls) by_id_[c.id] = lru_.begin();
  evict_locked();
}

void ToolMemory::evict_locked() {
  while (!lru_.empty() && (by_id_.size() > max_ids_ || bytes_ > max_bytes_)) {
    const auto& victim = lru_.back();
    for (const auto& c : victim->calls) by_id_.erase(c.id);
    bytes_ -= victim->bytes();
    lru_.pop_back();
  }
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

}  // namespace dsv4::server
