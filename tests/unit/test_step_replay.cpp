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

#include "backend/cpu/cpu_backend.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "synth/synth.h"

using namespace dsv4;

namespace {

// Wraps a backend; between capture_begin and capture_end every op is stored
// (by value, with the tensors it names) rather than run.
// With `branches`, it also advertises concurrent branches (running them in
// order, as a CUDA stream pair may) and checks that they are well formed.
class RecordingBackend final : public Backend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner, bool branches = false)
      : in_(std::move(inner)), branches_(branches) {}
  BackendKind kind() const override { return in_->kind(); }
  std::string name() const override { return "recording(" + in_->name() + ")"; }
  Tensor alloc(GgmlType type, int64_t n0, int64_t n1, int64_t n2, int64_t n3) override {
    EXPECT_FALSE(recording_) << "alloc while recording";
    return in_->alloc(type, n0, n1, n2, n3);
  }
  void free(Tensor& t) override {
    EXPECT_FALSE(recording_) << "free while recording";
    ++frees_;
    in_->free(t);
  }
  expected<Tensor> upload_weight(const void* host, GgmlType type, const int64_t ne[4]) override {
    return in_->upload_weight(host, type, ne);
  }
  void write(const Tensor& dst, const void* host, size_t bytes, size_t offset) override {
    EXPECT_FALSE(recording_) << "write while recording";
    in_->write(dst, host, bytes, offset);
  }
  void read(const Tensor& src, void* host, size_t bytes, size_t offset) override {
    EXPECT_FALSE(recording_) << "read while recording";
    in_->read(src, host, bytes, offset);
  }
  void fill(const Tensor& dst, float value) override {
    run([=, this] { in_->fill(dst, value); });
  }
  void copy(const Tensor& dst, const Tensor& src) override {
    run([=, this] { in_->copy(dst, src); });
  }
  void synchronize() override { in_->synchronize(); }
  void set_profiling(bool on) override { in_->set_profiling(on); }
  std::vector<OpTiming> take_profile() override { return in_->take_profile(); }

  bool capture_begin() override {
    EXPECT_FALSE(recording_);
    recording_ = true;
    current_.clear();
    return true;
  }
  uint64_t capture_end() override {
    EXPECT_TRUE(recording_);
    EXPECT_FALSE(in_branch_ || branch_open_) << "capture ends inside a branch";
    recording_ = false;
    const uint64_t id = ++last_;
    recs_[id] = {std::move(current_), frees_};
    ++captures_;
    return id;
  }
  bool replay(uint64_t id) override {
    auto it = recs_.find(id);
    if (it == recs_.end() || it->second.frees != frees_) return false;
    for (auto& f : it->second.ops) f();
    ++replays_;
    return true;
  }
  void drop_replay(uint64_t id) override { recs_.erase(id); }

  bool concurrent_branches() const override { return branches_; }
  void branch_begin() override {
    EXPECT_FALSE(in_branch_ || branch_open_) << "nested branch";
    in_branch_ = true;
    ++branches_begun_;
  }
  void branch_end() override {
    EXPECT_TRUE(in_branch_) << "branch_end without branch_begin";
    in_branch_ = false;
    branch_open_ = true;
  }
  void branch_join() override {
    EXPECT_TRUE(branch_open_ && !in_branch_) << "branch_join without a finished branch";
    branch_open_ = false;
    ++branches_joined_;
  }

#define DSV4_FORWARD_OP(NAME, TYPE)    \
  void NAME(const TYPE& op) override { \
    run([=, this] { in_->NAME(op); }); \
  }
  DSV4_FORWARD_OP(embed, EmbedOp)
  DSV4_FORWARD_OP(hc_pre, HcPreOp)
  DSV4_FORWARD_OP(hc_post, HcPostOp)
  DSV4_FORWARD_OP(hc_head, HcHeadOp)
  DSV4_FORWARD_OP(rms_norm, RmsNormOp)
  DSV4_FORWARD_OP(matmul, MatmulOp)
  DSV4_FORWARD_OP(rope, RopeOp)
  DSV4_FORWARD_OP(quant_sim, QuantSimOp)
  DSV4_FORWARD_OP(store_rows, StoreRowsOp)
  DSV4_FORWARD_OP(compress, CompressOp)
  DSV4_FORWARD_OP(indexer_scores, IndexerScoresOp)
  DSV4_FORWARD_OP(topk, TopKOp)
  DSV4_FORWARD_OP(attention, AttentionOp)
  DSV4_FORWARD_OP(moe_route, MoeRouteOp)
  DSV4_FORWARD_OP(moe_experts, MoeExpertsOp)
  DSV4_FORWARD_OP(swiglu, SwigluOp)
  DSV4_FORWARD_OP(add, AddOp)
  DSV4_FORWARD_OP(scale, ScaleOp)
#undef DSV4_FORWARD_OP

  int captures() const { return captures_; }
  int replays() const { return replays_; }
  int branches_begun() const { return branches_begun_; }
  int branches_joined() const { return branches_joined_; }

 private:
  void run(std::function<void()> f) {
    if (recording_)
      current_.push_back(std::move(f));
    else
      f();
  }
  struct Rec {
    std::vector<std::function<void()>> ops;
    uint64_t frees = 0;
  };
  std::unique_ptr<Backend> in_;
  bool recording_ = false;
  std::vector<std::function<void()>> current_;
  std::map<uint64_t, Rec> recs_;
  uint64_t last_ = 0, frees_ = 0;
  int captures_ = 0, replays_ = 0;
  bool branches_ = false, in_branch_ = false, branch_open_ = false;
  int branches_begun_ = 0, branches_joined_ = 0;
};

struct Tiny {
  std::string path;
  std::unique_ptr<ModelFile> mf;
  Tiny() {
    path = (std::filesystem::temp_directory_path() / ("dsv4_test_replay_" + std::to_string(::getpid()) + ".gguf"))
               .string();
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 11), path, 2).has_value());
    auto m = open_model(path);
    EXPECT_TRUE(m.has_value());
    mf = std::move(*m);
  }
  ~Tiny() { std::filesystem::remove(path); }
};

std::vector<int32_t> tokens(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(n);
  for (auto& v : t) v = static_cast<int32_t>(3 + g() % (vocab - 3));
  return t;
}

}  // namespace

TEST(StepReplay, ReplayedDecodeEqualsPrefillAndGoesStaleOnFreeAndSwitch) {
  Tiny tiny;
  ASSERT_TRUE(tiny.mf);
  RecordingBackend be(make_cpu_backend(2));
  auto model = Model::create(be, tiny.mf->weights, nullptr, ModelOptions{});
  ASSERT_TRUE(model.has_value()) << model.error().message;
  Model& m = **model;
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
  Tiny tiny;
  ASSERT_TRUE(tiny.mf);
  RecordingBackend be(make_cpu_backend(2), /*branches=*/true);
  auto model = Model::create(be, tiny.mf->weights, nullptr, ModelOptions{});
  ASSERT_TRUE(model.has_value()) << model.error().message;
  Model& m = **model;
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
  Tiny tiny;
  ASSERT_TRUE(tiny.mf);
  RecordingBackend be(make_cpu_backend(2));
  auto model = Model::create(be, tiny.mf->weights, nullptr, ModelOptions{});
  ASSERT_TRUE(model.has_value()) << model.error().message;
  Model& m = **model;
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
