#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/assert.h"

namespace dsv4 {

Sampler::Sampler(SamplingParams params, uint32_t n_vocab)
    : params_(params), rng_(params.seed), work_(n_vocab), idx_(n_vocab), counts_(n_vocab, 0) {}

int32_t argmax(std::span<const float> logits) {
  DSV4_ASSERT(!logits.empty(), "argmax of nothing");
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[static_cast<size_t>(best)]) best = static_cast<int32_t>(i);
  return best;
}

void Sampler::apply_penalties(std::span<const int32_t> history) {
  const SamplingParams& p = params_;
  if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;
  size_t start = p.penalty_window > 0 && history.size() > static_cast<size_t>(p.penalty_window)
                     ? history.size() - static_cast<size_t>(p.penalty_window)
                     : 0;
  std::vector<int32_t> seen;
  for (size_t i = start; i < history.size(); ++i) {
    int32_t t = history[i];
    if (t < 0 || static_cast<size_t>(t) >= work_.size()) continue;
    if (counts_[static_cast<size_t>(t)]++ == 0) seen.push_back(t);
  }
  for (int32_t t : seen) {
    float& l = work_[static_cast<size_t>(t)];
    if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * static_cast<float>(counts_[static_cast<size_t>(t)]);
    counts_[static_cast<size_t>(t)] = 0;
  }
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history, bool force_greedy) {
  DSV4_ASSERT(logits.size() == work_.size(), "sampler built for %zu logits, got %zu", work_.size(), logits.size());
  std::copy(logits.begin(), logits.end(), work_.begin());
  apply_penalties(history);
  if (force_greedy || params_.greedy()) return argmax(work_);

  // Candidates sorted by logit (highest first, lowest id on ties).
  const float inv_t = 1.0f / params_.temperature;
  size_t n = work_.size();
  std::iota(idx_.begin(), idx_.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return work_[static_cast<size_t>(a)] > work_[static_cast<size_t>(b)] ||
           (work_[static_cast<size_t>(a)] == work_[static_cast<size_t>(b)] && a < b);
  };
  size_t keep = n;
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(idx_.begin(), idx_.begin() + static_cast<long>(keep), idx_.end(), better);
  } else {
    std::sort(idx_.begin(), idx_.end(), better);
  }
  // Softmax over the kept candidates at temperature T.
  const float mx = work_[static_cast<size_t>(idx_[0])];
  std::vector<double> prob(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += prob[i] = std::exp(static_cast<double>((work_[static_cast<size_t>(idx_[i])] - mx) * inv_t));
  for (auto& v : prob) v /= sum;
  // min-p: drop candidates below min_p * p_max.
  if (params_.min_p > 0.0f) {
    double floor_p = params_.min_p * prob[0];
    size_t k = 1;
    while (k < keep && prob[k] >= floor_p) ++k;
    keep = k;
  }
  // top-p: the smallest prefix whose mass reaches top_p.
  if (params_.top_p < 1.0f) {
    double acc = 0;
    size_t k = 0;
    while (k < keep) {
      acc += prob[k++];
      if (acc >= params_.top_p) break;
    }
    keep = std::max<size_t>(1, k);
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += prob[i];
  std::uniform_real_distribution<double> u(0.0, mass);
  double r = u(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r < 0) return idx_[i];
  }
  return idx_[keep - 1];
}

float token_logprob(std::span<const float> logits, int32_t token) {
  float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
  return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(token)] - mx) - std::log(sum));
}

std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, int k) {
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  size_t kk = std::min<size_t>(static_cast<size_t>(std::max(k, 0)), idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(kk), idx.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
           (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
  });
  float mx = logits[static_cast<size_t>(idx[0])];
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
  const double lse = std::log(sum);
  std::vector<std::pair<int32_t, float>> out;
  for (size_t i = 0; i < kk; ++i)
    out.emplace_back(idx[i], static_cast<float>(static_cast<double>(logits[static_cast<size_t>(idx[i])] - mx) - lse));
  return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  Result r;
  if (stopped_) {
    r.stopped = true;
    return r;
  }
  pending_.append(text);
  if (stops_.empty()) {
    r.emit.swap(pending_);
    return r;
  }
  // Earliest complete match wins.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    size_t at = pending_.find(s);
    if (at != std::string::npos && (best == std::string::npos || at < best)) {
      best = at;
      r.stop = s;
    }
  }
  if (best != std::string::npos) {
    r.emit = pending_.substr(0, best);
    r.stopped = stopped_ = true;
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_)
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
  r.emit = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsv4
