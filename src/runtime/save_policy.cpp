#include "runtime/save_policy.h"

#include <algorithm>

namespace dsv4::runtime {

size_t cold_store_length(std::span<const int32_t> prompt, const Tokenizer& tok, const SavePolicy& p) {
  const size_t T = prompt.size();
  if (T < p.min_tokens || T == 0) return 0;
  // 1. The anchor: the last <｜User｜> before the first <｜Assistant｜>.
  size_t first_assistant = T;
  for (size_t i = 0; i < T; ++i)
    if (prompt[i] == tok.assistant()) {
      first_assistant = i;
      break;
    }
  if (first_assistant < T) {
    for (size_t i = first_assistant; i-- > 0;)
      if (prompt[i] == tok.user()) {
        if (i >= p.min_tokens) return i;
        break;
      }
  }
  // 2. Aligned, `margin` tokens before the end of the last text piece.
  size_t text_end = T;
  while (text_end > 0 && tok.is_special(prompt[text_end - 1])) --text_end;
  if (p.align > 0 && text_end > p.margin) {
    const size_t s = (text_end - p.margin) / p.align * p.align;
    if (s >= p.min_tokens) return s;
  }
  // 3. Right after the last <｜Assistant｜>.
  for (size_t i = T; i-- > 0;)
    if (prompt[i] == tok.assistant()) {
      if (i + 1 >= p.min_tokens) return i + 1;
      break;
    }
  return 0;
}

bool frontier_due(size_t n_tokens, size_t last_stored, const SavePolicy& p) {
  return p.frontier > 0 && n_tokens > 0 && n_tokens % p.frontier == 0 && n_tokens >= p.min_tokens &&
         n_tokens > last_stored;
}

std::vector<size_t> prefill_save_points(size_t from, size_t to, size_t cold_length, size_t last_stored,
                                        const SavePolicy& p) {
  std::vector<size_t> out;
  if (to <= from) return out;
  if (cold_length > from && cold_length <= to && cold_length >= p.min_tokens) out.push_back(cold_length);
  if (p.frontier > 0) {
    const size_t start = std::max(from, last_stored);
    for (size_t f = (start / p.frontier + 1) * p.frontier; f <= to; f += p.frontier)
      if (frontier_due(f, last_stored, p)) out.push_back(f);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool worth_saving(size_t n_tokens, const SavePolicy& p) { return n_tokens >= p.min_tokens && n_tokens > 0; }

}  // namespace dsv4::runtime
