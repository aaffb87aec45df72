// The per-sequence ops of several sequences in one launch (Backend::*_seqs:
// a batched decode step, one token per sequence).
//
// Each kernel that takes them reads its sequence's state from a table passed
// by value (a kernel parameter, so a recorded graph keeps it): one entry per
// token of the launch, at most k_seq_tokens. The tokens' own tensors (q, out,
// pos, kv, ...) are consecutive rows of one batch, so only the state
// pointers differ from token to token; the arithmetic per token is the
// single-sequence kernel's, and the results are bitwise the same as one
// launch per sequence.
#pragma once

#include <cstddef>
#include <span>

namespace dsv4::cuda {

inline constexpr int k_seq_tokens = 32;

template <class T>
struct SeqTable {
  T at[k_seq_tokens];
};

// Splits ops into runs launched together: maximal runs of consecutive ops,
// at most k_seq_tokens long, in which fits(op, first, k) holds for the k-th
// op of the run (k = 0: the first itself; it checks that the op is a single
// token, shares the first's shapes and follows it by k rows). batch(run) runs
// a run of >= 2 ops, one(op) every other op.
template <class Op, class Fits, class Batch, class One>
void seq_runs(std::span<const Op> ops, Fits fits, Batch batch, One one) {
  size_t i = 0;
  while (i < ops.size()) {
    size_t j = i;
    while (j < ops.size() && j - i < static_cast<size_t>(k_seq_tokens) && fits(ops[j], ops[i], j - i)) ++j;
    if (j - i >= 2) {
      batch(ops.subspan(i, j - i));
      i = j;
    } else {
      one(ops[i]);
      ++i;
    }
  }
}

// Whether tensor b's data starts k rows of `row_bytes` after a's.
template <class T>
bool rows_follow(const T& a, const T& b, size_t k, size_t row_bytes) {
  return static_cast<const char*>(b.data) == static_cast<const char*>(a.data) + k * row_bytes;
}

}  // namespace dsv4::cuda
