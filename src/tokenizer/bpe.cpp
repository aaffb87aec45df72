#include "tokenizer/bpe.h"

#include <algorithm>

#include "core/utf8.h"

namespace dsv4 {
namespace {

// Min-heap order on (rank, pos): the top is the lowest rank, leftmost on ties.
bool heap_after(const BpeWorkspace::Candidate& a, const BpeWorkspace::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) utf8_append(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

expected<BpeModel> BpeModel::build(const std::function<std::optional<int32_t>(std::string_view)>& lookup,
                                   const std::vector<std::string>& merges) {
  BpeModel m;
  for (uint32_t b = 0; b < 256; ++b) {
    std::string text;
    utf8_append(text, byte_to_unicode(static_cast<uint8_t>(b)));
    std::optional<int32_t> id = lookup(text);
    if (!id)
      return make_error(
          "vocabulary has no token for byte 0x%02x (byte-level text \"%s\"); a byte-level BPE vocabulary "
          "must contain all 256 byte tokens",
          b, text.c_str());
    m.byte_ids_[b] = *id;
  }

  // Table size: a power of two at least twice the number of merges.
  size_t cap = 16;
  int shift = 60;
  while (cap < merges.size() * 2) {
    cap *= 2;
    --shift;
  }
  m.slots_.assign(cap, Slot{k_empty, 0, 0});
  m.shift_ = shift;

  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    std::string_view line = merges[r];
    // Symbols are in byte-level form, which has no U+0020, so the one space
    // separates them. Searching from index 1 keeps a (malformed) leading
    // space inside the left symbol, where the lookup below rejects it.
    const size_t sp = line.size() > 1 ? line.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos || sp + 1 >= line.size())
      return make_error("merge %zu (\"%.*s\") is not of the form \"<left> <right>\"", r, static_cast<int>(line.size()),
                        line.data());
    const std::string_view left = line.substr(0, sp);
    const std::string_view right = line.substr(sp + 1);
    const std::optional<int32_t> lid = lookup(left);
    const std::optional<int32_t> rid = lookup(right);
    if (!lid || !rid)
      return make_error("merge %zu (\"%.*s\") references \"%.*s\", which is not in the vocabulary", r,
                        static_cast<int>(line.size()), line.data(), static_cast<int>((lid ? right : left).size()),
                        (lid ? right : left).data());
    joined.assign(left);
    joined.append(right);
    const std::optional<int32_t> res = lookup(joined);
    if (!res)
      return make_error("merge %zu (\"%.*s\") produces \"%s\", which is not in the vocabulary", r,
                        static_cast<int>(line.size()), line.data(), joined.c_str());
    const uint64_t key = pair_key(*lid, *rid);
    size_t i = m.slot_index(key);
    while (m.slots_[i].key != k_empty && m.slots_[i].key != key) i = (i + 1) & (cap - 1);
    // A repeated pair keeps its first (lowest) rank.
    if (m.slots_[i].key == k_empty) m.slots_[i] = Slot{key, static_cast<int32_t>(r), *res};
  }
  m.n_merges_ = merges.size();
  return m;
}

const BpeModel::Slot* BpeModel::find_pair(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  const size_t mask = slots_.size() - 1;
  for (size_t i = slot_index(key);; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key == key) return &s;
    if (s.key == k_empty) return nullptr;
  }
}

void BpeModel::encode_piece(std::string_view bytes, std::vector<int32_t>* out, BpeWorkspace* ws) const {
  // Symbol indices are int32, so a piece longer than 1 GiB (one unbroken run
  // of letters, say) is merged in 1 GiB chunks; no real text comes near this.
  constexpr size_t k_max_piece = size_t{1} << 30;
  while (bytes.size() > k_max_piece) {
    encode_piece(bytes.substr(0, k_max_piece), out, ws);
    bytes.remove_prefix(k_max_piece);
  }
  const size_t n = bytes.size();
  if (n == 0) return;
  if (n == 1) {
    out->push_back(byte_ids_[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  auto& sym = ws->symbols;
  auto& heap = ws->heap;
  sym.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    sym[i] = {byte_ids_[static_cast<uint8_t>(bytes[i])], static_cast<int32_t>(i) - 1,
              i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  auto push = [&](int32_t pos, int32_t left, int32_t right) {
    if (const Slot* s = find_pair(left, right)) {
      heap.push_back({s->rank, pos, left, right, s->result});
      std::push_heap(heap.begin(), heap.end(), heap_after);
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i), sym[i].id, sym[i + 1].id);

  // Invariant: the heap holds an entry for every live adjacent pair that has
  // a merge (plus stale entries for pairs that no longer exist), so its top
  // valid entry is the lowest-rank, leftmost pair.
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), heap_after);
    const BpeWorkspace::Candidate c = heap.back();
    heap.pop_back();
    BpeWorkspace::Symbol& s = sym[c.pos];
    if (s.id != c.left || s.next < 0 || sym[s.next].id != c.right) continue;  // stale
    BpeWorkspace::Symbol& r = sym[s.next];
    s.id = c.result;
    r.id = -1;
    s.next = r.next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    if (s.prev >= 0) push(s.prev, sym[s.prev].id, s.id);
    if (s.next >= 0) push(c.pos, s.id, sym[s.next].id);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

}  // namespace dsv4
