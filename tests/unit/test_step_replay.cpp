// The recorded decode step (Model::run_batch + Backend::capture_begin/replay,
// CUDA graphs on the GPU) checked on the CPU, where CI runs: a Backend
// decorator records the ops issued during a capture instead of running them
// and replays the recording on demand, exactly what a CUDA graph does. If any
// op of a single-token step took a per-token value from the host (a position,
// a row count, a pointer into a growing buffer) instead of reading it from a
// device tensor, the replayed steps would differ from a prefill of the same
// tokens. Also: recordings go stale when memory is freed, sessions switch.
// With branches advertised (Backend::concurrent_branches, the CUDA default),
// the decode step issues the shared expert as a branch whose output is added
// after the join instead of accumulated by its down projection: the decoded
// logits must still equal the prefill's (which accumulates) bit for bit.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "recording_backend.h"
#include "synth/synth.h"
#include "tiny_file.h"

using namespace dsv4;
using dsv4::test::RecordingBackend;

namespace {

struct Tiny : test::TinyFile {
  Tiny() : TinyFile("replay", 11) {}
};

std::vector<int32_t> tokens(size_t n, uint32_t vocab, uint32_t seed) { return test::random_tokens(n, vocab, seed); }

// The tiny model on a recording backend (error: why it could not be made).
struct Replay {
  Tiny tiny;
  RecordingBackend be;
  std::unique_ptr<Model> model;
  std::string error = "no tiny model file";
  explicit Replay(bool branches = false) : be(make_cpu_backend(2), branches) {
    if (!tiny.mf) return;
    auto m = Model::create(be, tiny.mf->weights, nullptr, ModelOptions{});
    if (m.has_value())
      model = std::move(*m);
    else
      error = m.error().message;
  }
};

}  // namespace

TEST(StepReplay, ReplayedDecodeEqualsPrefillAndGoesStaleOnFreeAndSwitch) {
  Replay replay;
  ASSERT_TRUE(replay.model) << replay.error;
  RecordingBackend& be = replay.be;
  Model& m = *replay.model;
  const int64_t V = m.spec().n_vocab;
  const size_t N = 48, off = 200;
  const std::vector<int32_t> t = tokens(off + N, m.spec().n_vocab, 5);

  // References: each sequence prefilled whole, logits at every position.
  std::vector<float> want_a(N * V), want_b(N * V);
  {
    KvState r = m.new_state(512);
    ASSERT_TRUE(m.forward(r, t.data(), N, 0, want_a.data(), true).has_value());
    m.reset_state(r);
    ASSERT_TRUE(m.forward(r, t.data() + off, N, 0, want_b.data(), true).has_value());
    m.free_state(r);
  }

  // Two sessions decode in turns of 6 tokens (every switch re-records), with a
  // third state made, used and freed once (all recordings go stale).
  KvState a = m.new_state(512), b = m.new_state(512);
  std::vector<float> lg(V);
  size_t ia = 0, ib = 0;
  for (size_t step = 0; step < 2 * N; ++step) {
    if (step == 29) {
      KvState c = m.new_state(512);
      ASSERT_TRUE(m.forward(c, t.data(), 1, 0, lg.data(), false).has_value());
      m.free_state(c);
    }
    const bool on_a = (step / 6) % 2 == 0;
    size_t& i = on_a ? ia : ib;
    ASSERT_TRUE(m.forward(on_a ? a : b, t.data() + (on_a ? 0 : off) + i, 1, static_cast<int64_t>(i), lg.data(), false)
                    .has_value());
    const std::vector<float>& want = on_a ? want_a : want_b;
    ASSERT_EQ(0, std::memcmp(lg.data(), want.data() + i * V, V * sizeof(float)))
        << "step " << step << ", session " << (on_a ? 'a' : 'b') << ", position " << i;
    ++i;
  }
  // Each 6-token turn records once (its 2nd step) and replays 4 times; the
  // free at step 29 makes one turn record a second time.
  EXPECT_GE(be.captures(), 16);
  EXPECT_GE(be.replays(), 60);
  m.free_state(a);
  m.free_state(b);
}

TEST(StepReplay, DecodeWithBranchesEqualsPrefill) {
  Replay replay(/*branches=*/true);
  ASSERT_TRUE(replay.model) << replay.error;
  RecordingBackend& be = replay.be;
  Model& m = *replay.model;
  ASSERT_GT(m.spec().n_expert_shared, 0u) << "the tiny preset has a shared expert";
  const int64_t V = m.spec().n_vocab;
  const size_t N = 24;
  const std::vector<int32_t> t = tokens(N, m.spec().n_vocab, 9);
  std::vector<float> want(N * V), lg(V);
  KvState r = m.new_state(256);
  ASSERT_TRUE(m.forward(r, t.data(), N, 0, want.data(), true).has_value());  // batched: no branches
  EXPECT_EQ(be.branches_begun(), 0);
  m.reset_state(r);
  for (size_t i = 0; i < N; ++i) {
    ASSERT_TRUE(m.forward(r, t.data() + i, 1, static_cast<int64_t>(i), lg.data(), false).has_value());
    ASSERT_EQ(0, std::memcmp(lg.data(), want.data() + i * V, V * sizeof(float))) << "position " << i;
  }
  // Every layer's decode FFN branched whenever the step was issued (eagerly or recorded), and joined.
  EXPECT_GE(be.branches_begun(), static_cast<int>(m.spec().n_layer));
  EXPECT_EQ(be.branches_begun(), be.branches_joined());
  EXPECT_GE(be.replays(), 1);
  m.free_state(r);
}

// Batched decode steps (Model::step of single-token items) are recorded per set
// of sessions and replayed whatever order the items come in; a session leaving
// or joining changes the set (another recording), a prompt chunk in the step
// runs eagerly. Every item's logits equal its sequence's prefill bit for bit.
TEST(StepReplay, BatchedDecodeStepsReplayPerSessionSetInAnyItemOrder) {
  Replay replay;
  ASSERT_TRUE(replay.model) << replay.error;
  RecordingBackend& be = replay.be;
  Model& m = *replay.model;
  const int64_t V = m.spec().n_vocab;
  constexpr size_t S = 3, N = 40, P = 5;  // sessions; tokens each; session 2's prompt, fed as one chunk
  std::vector<std::vector<int32_t>> t(S);
  std::vector<std::vector<float>> want(S, std::vector<float>(N * V));
  {
    KvState r = m.new_state(256);
    for (size_t k = 0; k < S; ++k) {
      t[k] = tokens(N, m.spec().n_vocab, static_cast<uint32_t>(20 + k));
      m.reset_state(r);
      ASSERT_TRUE(m.forward(r, t[k].data(), N, 0, want[k].data(), true).has_value());
    }
    m.free_state(r);
  }
  std::vector<KvState> st;
  for (size_t k = 0; k < S; ++k) st.push_back(m.new_state(256));
  std::vector<size_t> at(S, 0);
  std::vector<std::vector<float>> lg(S, std::vector<float>(V));
  std::mt19937 rng(3);
  const int captures0 = be.captures(), replays0 = be.replays();
  for (size_t step = 0; step < 30; ++step) {
    // Sessions 0 and 1 decode throughout; session 2 joins at step 10 with its
    // prompt chunk, decodes until step 20, then leaves.
    std::vector<size_t> in = {0, 1};
    if (step >= 10 && step < 20) in.push_back(2);
    std::shuffle(in.begin(), in.end(), rng);
    std::vector<StepItem> items;
    for (size_t k : in) {
      const int64_t n = (k == 2 && step == 10) ? static_cast<int64_t>(P) : 1;
      items.push_back(StepItem{&st[k], t[k].data() + at[k], n, static_cast<int64_t>(at[k]), lg[k].data()});
    }
    ASSERT_TRUE(m.step(items).has_value()) << "step " << step;
    for (const StepItem& it : items) {
      const size_t k = static_cast<size_t>(&*it.state - st.data());
      at[k] += static_cast<size_t>(it.n);
      ASSERT_EQ(0, std::memcmp(lg[k].data(), want[k].data() + (at[k] - 1) * V, V * sizeof(float)))
          << "step " << step << ", session " << k << ", position " << at[k] - 1;
    }
  }
  // Set {0,1}: eager at step 0, recorded at step 1, replayed at 1-9 and again at 20-29 (kept while set
  // {0,1,2} ran); step 10 carries a prompt chunk (eager); set {0,1,2}: eager at 11, recorded and
  // replayed at 12, replayed at 13-19. 2 recordings, 9 + 8 + 10 replays.
  EXPECT_EQ(be.captures() - captures0, 2);
  EXPECT_EQ(be.replays() - replays0, 9 + 8 + 10);
  for (KvState& s : st) m.free_state(s);
}
