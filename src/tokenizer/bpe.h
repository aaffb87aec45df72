// Byte-level BPE (formats.md §3.4): the merge loop that turns one pre-token
// piece into token ids. Symbols are in the GPT-2 byte-to-unicode alphabet
// (formats.md §3.1, core/byte_unicode.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/byte_unicode.h"
#include "core/error.h"

namespace dsv4 {

// The byte-level form of a byte string: each byte becomes its code point in
// the GPT-2 alphabet (core/byte_unicode.h).
std::string bytes_to_byte_level(std::string_view bytes);

// Scratch space for BpeModel::encode_piece, reused across pieces so the merge
// loop does not allocate. Not shared between threads.
struct BpeWorkspace {
  struct Symbol {
    int32_t id;    // token id; -1 once merged into its left neighbour
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
  };
  struct Candidate {
    int32_t rank;  // merge rank (lower merges first)
    int32_t pos;   // index of the left symbol
    int32_t left;  // the pair this entry was queued for (stale if changed)
    int32_t right;
    int32_t result;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// The merge table and the byte → initial-token map.
class BpeModel {
 public:
  BpeModel() = default;

  // `lookup(text)` gives the id of the token whose text (byte-level form) is
  // `text`. `merges[r]` is "<left> <right>" with rank r. Every byte's
  // single-character token, both sides of every merge and every merge result
  // must be in the vocabulary; otherwise an Error names the offender.
  static expected<BpeModel> build(const std::function<std::optional<int32_t>(std::string_view)>& lookup,
                                  const std::vector<std::string>& merges);

  // BPE of one pre-token piece (raw bytes, not byte-level text): start from
  // one symbol per byte; repeatedly merge the adjacent pair with the lowest
  // rank, the leftmost one on a tie, until no adjacent pair has a merge.
  // Appends the ids to *out. O(n log n) in the piece length (a heap of
  // candidate pairs over a linked list of symbols).
  void encode_piece(std::string_view bytes, std::vector<int32_t>* out, BpeWorkspace* ws) const;

  int32_t byte_token(uint8_t b) const { return byte_ids_[b]; }
  size_t n_merges() const { return n_merges_; }

 private:
  struct Slot {
    uint64_t key;  // (left << 32) | right; k_empty for a free slot
    int32_t rank;
    int32_t result;
  };
  static constexpr uint64_t k_empty = ~0ull;  // never a key: ids are < 2^31

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  size_t slot_index(uint64_t key) const { return static_cast<size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_); }
  const Slot* find_pair(int32_t left, int32_t right) const;

  int32_t byte_ids_[256] = {};
  std::vector<Slot> slots_;  // open addressing, linear probing, power-of-two size
  int shift_ = 64;
  size_t n_merges_ = 0;
};

}  // namespace dsv4
