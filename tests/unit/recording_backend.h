// A Backend decorator for tests that records the ops issued between capture_begin and capture_end
// instead of running them and replays the recording on demand: what a CUDA graph does, on the CPU
// (test_step_replay, test_pipeline).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/ops.h"

namespace dsv4::test {

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
  DSV4_FORWARD_OP(act_quant, ActQuantOp)
  DSV4_FORWARD_OP(store_rows, StoreRowsOp)
  DSV4_FORWARD_OP(compress, CompressOp)
  DSV4_FORWARD_OP(indexer_scores, IndexerScoresOp)
  DSV4_FORWARD_OP(topk, TopKOp)
  DSV4_FORWARD_OP(attention, AttentionOp)
  DSV4_FORWARD_OP(moe_route, MoeRouteOp)
  DSV4_FORWARD_OP(swiglu, SwigluOp)
  DSV4_FORWARD_OP(add, AddOp)
  DSV4_FORWARD_OP(scale, ScaleOp)
#undef DSV4_FORWARD_OP
  void moe_experts(const MoeExpertsOp& op) override {
    moe_log_.push_back({false, op.gate_host.data, op.x.n_rows(), op.experts.ne[0]});
    run([=, this] { in_->moe_experts(op); });
  }
  // A hint, never part of a recording (backends ignore it while capturing): logged and passed on.
  void moe_prefetch(const MoePrefetchOp& op) override {
    moe_log_.push_back({true, op.gate_host.data, op.n, op.k});
    in_->moe_prefetch(op);
  }
  // moe_prefetch and moe_experts calls in order (the host stack they name, tokens, experts per token).
  struct MoeCall {
    bool prefetch;
    const void* host;
    int64_t n, k;
  };
  const std::vector<MoeCall>& moe_log() const { return moe_log_; }

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
  std::vector<MoeCall> moe_log_;
};

}  // namespace dsv4::test
