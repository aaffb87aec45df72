// Engine::step (continuous batching): several sessions advance in one forward
// pass, and each ends exactly where prefill()/decode() alone would have taken
// it — bitwise on the CPU backend, in every numerics, across compressor and
// indexer boundaries, with sessions joining and leaving between steps.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dsv4/engine.h"
#include "synth/synth.h"
#include "../common/token_walk.h"

using namespace dsv4;
using dsv4::test::bitwise_equal;
using dsv4::test::tiny_tokens;

namespace {

std::string g_model;

class EngineStepTest : public ::testing::TestWithParam<Numerics> {
 public:
  static void SetUpTestSuite() {
    auto dir = std::filesystem::temp_directory_path() / ("dsv4_engine_step_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    g_model = (dir / "tiny.gguf").string();
    ASSERT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 5), g_model, 2).has_value());
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(std::filesystem::path(g_model).parent_path()); }

  static std::unique_ptr<Engine> load(Numerics numerics, int batch) {
    EngineOptions o;
    o.model_path = g_model;
    o.backend = BackendChoice::CPU;
    o.ctx = 1024;
    o.numerics = numerics;
    o.prefill_batch = batch;
    o.show_progress = false;
    auto e = Engine::load(o);
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }
};

// A session in the batch and its twin that runs alone.
struct Pair {
  std::unique_ptr<Session> batched, alone;
  std::vector<int32_t> script;  // every token this sequence will be fed, in order
  size_t fed = 0;
};

}  // namespace

TEST_P(EngineStepTest, BatchedStepsEqualEachSessionAlone) {
  auto engine = load(GetParam(), 64);
  ASSERT_NE(engine, nullptr);
  // Four sequences at different positions (300 tokens crosses ratio-4 and ratio-128 compressor rows and the
  // indexer's top-k), one joining later; prefill chunks ride along with decoding rows.
  const size_t starts[] = {300, 37, 0, 150, 0};
  std::vector<Pair> seqs(5);
  for (size_t k = 0; k < seqs.size(); ++k) {
    Pair& p = seqs[k];
    p.batched = *engine->new_session();
    p.alone = *engine->new_session();
    p.script = tiny_tokens(starts[k] + 80, static_cast<uint32_t>(k + 1));
    if (starts[k] > 0) {
      const std::span<const int32_t> head(p.script.data(), starts[k]);
      ASSERT_TRUE(p.batched->prefill(head).has_value());
      ASSERT_TRUE(p.alone->prefill(head).has_value());
      p.fed = starts[k];
    }
  }
  for (int step = 0; step < 14; ++step) {
    // Who takes part: sequence 3 leaves after step 6, sequence 4 joins at step 4; sequence 2 prefills
    // 20-token chunks for its first three steps, sequence 4 a 13-token chunk when it joins.
    std::vector<size_t> members;
    std::vector<size_t> counts;
    for (size_t k = 0; k < seqs.size(); ++k) {
      if (k == 3 && step > 6) continue;
      if (k == 4 && step < 4) continue;
      size_t n = 1;
      if (k == 2 && step < 3) n = 20;
      if (k == 4 && step == 4) n = 13;
      members.push_back(k);
      counts.push_back(n);
    }
    std::vector<SessionStep> items;
    for (size_t j = 0; j < members.size(); ++j) {
      Pair& p = seqs[members[j]];
      items.push_back(SessionStep{p.batched.get(), std::span<const int32_t>(p.script.data() + p.fed, counts[j])});
    }
    ASSERT_TRUE(engine->step(items).has_value()) << "step " << step;
    for (size_t j = 0; j < members.size(); ++j) {
      Pair& p = seqs[members[j]];
      const std::span<const int32_t> t(p.script.data() + p.fed, counts[j]);
      ASSERT_TRUE((counts[j] == 1 ? p.alone->decode(t[0]) : p.alone->prefill(t)).has_value());
      p.fed += counts[j];
      EXPECT_EQ(p.batched->tokens(), p.alone->tokens()) << "step " << step << " sequence " << members[j];
      EXPECT_TRUE(bitwise_equal(p.batched->logits(), p.alone->logits()))
          << "step " << step << " sequence " << members[j] << " at " << p.fed << " tokens";
    }
  }
  // A sequence that left is untouched by the steps after: it continues like its twin.
  Pair& left = seqs[3];
  ASSERT_TRUE(left.batched->decode(left.script[left.fed]).has_value());
  ASSERT_TRUE(left.alone->decode(left.script[left.fed]).has_value());
  EXPECT_TRUE(bitwise_equal(left.batched->logits(), left.alone->logits()));
}

TEST_P(EngineStepTest, BadStepsAreRefusedAndChangeNothing) {
  auto engine = load(GetParam(), 16);
  auto other = load(GetParam(), 16);
  ASSERT_NE(engine, nullptr);
  ASSERT_NE(other, nullptr);
  auto a = *engine->new_session(), b = *engine->new_session(), c = *other->new_session();
  const std::vector<int32_t> t = tiny_tokens(20, 9);
  ASSERT_TRUE(a->prefill(std::span<const int32_t>(t.data(), 5)).has_value());
  const std::vector<float> a_logits = a->logits();
  auto refused = [&](std::vector<SessionStep> items, const std::string& why) {
    auto st = engine->step(items);
    ASSERT_FALSE(st.has_value()) << why;
    EXPECT_NE(st.error().message.find(why), std::string::npos) << st.error().message;
    EXPECT_EQ(a->n_tokens(), 5u);
    EXPECT_TRUE(bitwise_equal(a->logits(), a_logits));
    EXPECT_EQ(b->n_tokens(), 0u);
    EXPECT_TRUE(b->logits().empty());
  };
  const std::span<const int32_t> one(t.data() + 5, 1), many(t.data(), 12);
  refused({{a.get(), one}, {a.get(), one}}, "same sequence");
  refused({{a.get(), many}, {b.get(), many}}, "exceed the batch of 16");
  refused({{a.get(), one}, {c.get(), one}}, "not a session of this engine");
  refused({{a.get(), one}, {b.get(), {}}}, "has no tokens");
  const int32_t bad = 1 << 20;
  refused({{a.get(), one}, {b.get(), std::span<const int32_t>(&bad, 1)}}, "outside the vocabulary");
  // An empty step is nothing to do; a step of one session is that session's prefill.
  EXPECT_TRUE(engine->step({}).has_value());
  ASSERT_TRUE(engine->step(std::vector<SessionStep>{{b.get(), many}}).has_value());
  EXPECT_EQ(b->n_tokens(), 12u);
}

INSTANTIATE_TEST_SUITE_P(Numerics, EngineStepTest,
                         ::testing::Values(Numerics::REFERENCE, Numerics::PLAIN, Numerics::FAST),
                         [](const auto& p) { return std::string(numerics_name(p.param)); });
