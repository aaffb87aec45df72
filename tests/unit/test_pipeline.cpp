// The layer pipeline (model/pipeline.h) on CPU backends: two and three stages, each its own backend,
// give one Model's logits bit for bit (prefill over several batches, every position; decode token by
// token with each stage's recorded step replayed); the planner splits layers by budget or names the
// shortfall; a stage refuses what only the whole model can do.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "kv/snapshot.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "model/pipeline.h"
#include "recording_backend.h"
#include "synth/synth.h"
#include "tiny_file.h"

using namespace dsv4;
using dsv4::test::RecordingBackend;

namespace {

constexpr size_t k_prompt = 150, k_decode = 24;

// Logits at every prompt position (prefill in batches of max_batch), then of k_decode tokens fed one by one.
template <class Forward>
std::vector<float> run(Forward&& forward, const std::vector<int32_t>& t, int64_t V) {
  std::vector<float> out((k_prompt + k_decode) * V);
  EXPECT_TRUE(forward(t.data(), k_prompt, 0, out.data(), true).has_value());
  for (size_t i = k_prompt; i < k_prompt + k_decode; ++i)
    EXPECT_TRUE(forward(t.data() + i, 1, static_cast<int64_t>(i), out.data() + i * V, false).has_value());
  return out;
}

}  // namespace

TEST(LayerPipeline, StagesGiveTheWholeModelsLogitsBitForBit) {
  test::TinyFile tiny("pipeline", 21);
  ASSERT_TRUE(tiny.mf);
  ModelOptions o;
  o.max_batch = 64;  // the prompt in 3 batches, the last partial
  const ModelSpec& S = tiny.mf->weights.spec;
  const int64_t V = S.n_vocab;
  const std::vector<int32_t> t = test::random_tokens(k_prompt + k_decode, S.n_vocab, 3);

  auto one_be = make_cpu_backend(2);
  auto whole = Model::create(*one_be, tiny.mf->weights, nullptr, o);
  ASSERT_TRUE(whole.has_value()) << whole.error().message;
  KvState ws = (*whole)->new_state(512);
  const std::vector<float> want = run([&](const int32_t* ids, int64_t n, int64_t p0, float* lg,
                                          bool all) { return (*whole)->forward(ws, ids, n, p0, lg, all); },
                                      t, V);
  (*whole)->free_state(ws);

  for (const std::vector<uint32_t>& first : {std::vector<uint32_t>{0, 3}, std::vector<uint32_t>{0, 1, 4}}) {
    // Each stage on its own backend; the recording decorator replays the stages' decode steps as a GPU would.
    std::vector<std::unique_ptr<RecordingBackend>> bes;
    std::vector<Backend*> ptrs;
    for (size_t k = 0; k < first.size(); ++k) {
      bes.push_back(std::make_unique<RecordingBackend>(make_cpu_backend(1)));
      ptrs.push_back(bes.back().get());
    }
    auto p = Model::create_pipeline(ptrs, tiny.mf->weights, first, o);
    ASSERT_TRUE(p.has_value()) << p.error().message;
    Model& pl = **p;
    size_t stages = 0;
    for (const Model* m = &pl; m; m = m->next_stage()) {
      EXPECT_EQ(m->layer_first(), first[stages]);
      EXPECT_EQ(m->has_head(), m->next_stage() == nullptr);
      ++stages;
    }
    ASSERT_EQ(stages, first.size());
    KvState st = pl.new_state(512);
    const std::vector<float> got = run([&](const int32_t* ids, int64_t n, int64_t p0, float* lg,
                                           bool all) { return pl.forward(st, ids, n, p0, lg, all); },
                                       t, V);
    ASSERT_EQ(got.size(), want.size());
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << first.size() << " stages";
    for (const auto& be : bes) {
      EXPECT_GE(be->captures(), 1) << "a stage did not record its decode step";
      EXPECT_GE(be->replays(), static_cast<int>(k_decode) - 2);
    }
    // A reset state starts over: the first position's logits again.
    pl.reset_state(st);
    std::vector<float> lg(static_cast<size_t>(V));
    ASSERT_TRUE(pl.forward(st, t.data(), 1, 0, lg.data(), false).has_value());
    EXPECT_EQ(0, std::memcmp(lg.data(), want.data(), lg.size() * sizeof(float)));
    pl.free_state(st);
  }
}

TEST(LayerPipeline, StagesHoldTheirShareOfWeightsStateAndScratch) {
  test::TinyFile tiny("pipeline", 21);
  ASSERT_TRUE(tiny.mf);
  const ModelWeights& w = tiny.mf->weights;
  const ModelSpec& S = w.spec;
  ModelOptions o;
  o.max_batch = 32;
  auto be = make_cpu_backend(1);
  auto whole = Model::create(*be, w, nullptr, o);
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ((*whole)->placement().scratch_bytes, model_scratch_bytes(S, o));
  uint64_t dense = 0, state = 0;
  for (uint32_t k = 0; k < 3; ++k) {
    ModelOptions so = o;
    so.layer_first = 2 * k;
    so.layer_end = 2 * k + 2;
    auto m = Model::create(*be, w, nullptr, so);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    EXPECT_EQ((*m)->placement().scratch_bytes, model_scratch_bytes(S, so)) << "stage " << k;
    EXPECT_EQ((*m)->has_head(), k == 2);
    dense += (*m)->placement().dense_bytes;
    state += (*m)->state_bytes(300);
  }
  EXPECT_EQ(dense, (*whole)->placement().dense_bytes);
  // Each stage's state holds its own copy of last_hidden.
  EXPECT_EQ(state, (*whole)->state_bytes(300) + 2ull * S.n_embd * S.hc_count * 4);
  // The planner's costs add up to the model's.
  const LayerSplitCosts c = layer_split_costs(w, o, 300, 1);
  uint64_t layers = 0;
  for (uint64_t b : c.layer) layers += b;
  EXPECT_EQ(layers + c.first_extra + c.last_extra - (model_scratch_bytes(S, o) - c.per_stage),
            w.n_bytes + (*whole)->state_bytes(300) - 4ull * S.n_embd * S.hc_count);
  // Without the routed experts (they may stay in host memory): the layers less exactly the experts' bytes.
  const LayerSplitCosts no_experts = layer_split_costs(w, o, 300, 1, /*routed_experts=*/false);
  uint64_t dense_layers = 0;
  for (uint64_t b : no_experts.layer) dense_layers += b;
  EXPECT_EQ(layers - dense_layers, (*whole)->placement().expert_bytes);
}

TEST(LayerPipeline, PlannerBalancesByBudgetOrNamesTheShortfall) {
  LayerSplitCosts c;
  c.layer.assign(8, 100);
  c.first_extra = 30;
  c.last_extra = 50;
  c.per_stage = 10;
  // Equal budgets: 4 + 4 layers would give 440 / 460; moving a layer to the first stage 540 / 360 is worse.
  auto two = plan_layer_split(c, {1000, 1000});
  ASSERT_TRUE(two.has_value()) << two.error().message;
  EXPECT_EQ(*two, (std::vector<uint32_t>{0, 4}));
  // A budget three times the other takes about three times the layers.
  auto skew = plan_layer_split(c, {300, 900});
  ASSERT_TRUE(skew.has_value()) << skew.error().message;
  EXPECT_EQ(*skew, (std::vector<uint32_t>{0, 2}));
  auto three = plan_layer_split(c, {400, 400, 400});
  ASSERT_TRUE(three.has_value()) << three.error().message;
  EXPECT_EQ(*three, (std::vector<uint32_t>{0, 3, 6}));
  EXPECT_EQ(*plan_layer_split(c, {5000}), (std::vector<uint32_t>{0}));
  // Does not fit: 890 bytes in all, 800 of budget.
  auto no = plan_layer_split(c, {400, 400});
  ASSERT_FALSE(no.has_value());
  EXPECT_NE(no.error().message.find("does not fit 2 GPUs"), std::string::npos) << no.error().message;
  // A GPU too small for even one layer, and more GPUs than layers.
  EXPECT_FALSE(plan_layer_split(c, {100, 5000}).has_value());
  EXPECT_FALSE(plan_layer_split(LayerSplitCosts{{100, 100}, 0, 0, 0}, {1000, 1000, 1000}).has_value());
}

TEST(LayerPipeline, StagesRefuseWhatNeedsTheWholeModel) {
  test::TinyFile tiny("pipeline", 21);
  ASSERT_TRUE(tiny.mf);
  const ModelWeights& w = tiny.mf->weights;
  auto be = make_cpu_backend(1);
  ModelOptions o;
  o.layer_first = 2;
  o.layer_end = 4;
  auto mid = Model::create(*be, w, nullptr, o);
  ASSERT_TRUE(mid.has_value()) << mid.error().message;
  KvState s = (*mid)->new_state(64);
  std::vector<float> lg(w.spec.n_vocab);
  const int32_t id = 5;
  auto r = (*mid)->forward(s, &id, 1, 0, lg.data(), false);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("no head"), std::string::npos) << r.error().message;
  EXPECT_TRUE((*mid)->forward(s, &id, 1, 0, nullptr, false).has_value());
  r = (*mid)->verify(s, &id, 1, 1, lg.data());
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("pipeline stage"), std::string::npos) << r.error().message;
  (*mid)->free_state(s);
  for (auto [a, b] : {std::pair<uint32_t, uint32_t>{3, 3}, {4, 2}, {0, 7}}) {
    ModelOptions bad;
    bad.layer_first = a;
    bad.layer_end = b;
    auto m = Model::create(*be, w, nullptr, bad);
    ASSERT_FALSE(m.has_value()) << a << ".." << b;
    EXPECT_NE(m.error().message.find("not a range"), std::string::npos) << m.error().message;
  }
  std::vector<Backend*> two = {be.get(), be.get()};
  EXPECT_FALSE(Model::create_pipeline(two, w, {0, 0}, ModelOptions{}).has_value());
  EXPECT_FALSE(Model::create_pipeline(two, w, {1, 3}, ModelOptions{}).has_value());
  EXPECT_FALSE(Model::create_pipeline(two, w, {0}, ModelOptions{}).has_value());
  // A pipeline takes no verify pass (speculation needs the whole model on one backend).
  auto pl = Model::create_pipeline(two, w, {0, 3}, ModelOptions{});
  ASSERT_TRUE(pl.has_value()) << pl.error().message;
  KvState ps = (*pl)->new_state(64);
  EXPECT_FALSE((*pl)->verify(ps, &id, 1, 0, lg.data()).has_value());
  (*pl)->free_state(ps);
}

// Model::step over a pipeline: several sequences' rows pass the stages together (decode steps, ordered
// by state uid on every stage, and a mixed step of a prompt chunk beside a decode token).
TEST(LayerPipeline, BatchedStepsGiveTheWholeModelsLogits) {
  test::TinyFile tiny("pipeline", 21);
  ASSERT_TRUE(tiny.mf);
  ModelOptions o;
  o.max_batch = 64;
  const ModelSpec& S = tiny.mf->weights.spec;
  const auto V = static_cast<size_t>(S.n_vocab);
  const std::vector<int32_t> t = test::random_tokens(200, S.n_vocab, 9);
  // Three sequences: prompts of 40, 25 and 30 tokens, then 8 steps: all three decode, except that in step 3
  // the third feeds a chunk of 5 more prompt tokens instead.
  auto drive = [&](Model& m) {
    std::vector<KvState> s;
    for (int i = 0; i < 3; ++i) s.push_back(m.new_state(256));
    std::vector<int64_t> pos = {40, 25, 30};
    std::vector<float> out;
    std::vector<float> lg(3 * V);
    for (int i = 0; i < 3; ++i)
      EXPECT_TRUE(
          m.forward(s[static_cast<size_t>(i)], t.data() + 50 * i, pos[static_cast<size_t>(i)], 0, lg.data(), false)
              .has_value());
    for (int step = 0; step < 8; ++step) {
      std::vector<StepItem> items;
      for (int i = 2; i >= 0; --i) {  // items in reverse creation order: the step sorts decode rows by uid
        const auto k = static_cast<size_t>(i);
        const int64_t n = step == 3 && i == 2 ? 5 : 1;
        items.push_back(StepItem{&s[k], t.data() + 50 * i + pos[k], n, pos[k], lg.data() + k * V});
        pos[k] += n;
      }
      EXPECT_TRUE(m.step(items).has_value()) << "step " << step;
      out.insert(out.end(), lg.begin(), lg.end());
    }
    for (auto& st : s) m.free_state(st);
    return out;
  };
  auto be = make_cpu_backend(2);
  auto whole = Model::create(*be, tiny.mf->weights, nullptr, o);
  ASSERT_TRUE(whole.has_value());
  const std::vector<float> want = drive(**whole);
  std::vector<std::unique_ptr<RecordingBackend>> bes;
  std::vector<Backend*> ptrs;
  for (int k = 0; k < 2; ++k) {
    bes.push_back(std::make_unique<RecordingBackend>(make_cpu_backend(1)));
    ptrs.push_back(bes.back().get());
  }
  auto pl = Model::create_pipeline(ptrs, tiny.mf->weights, {0, 2}, o);
  ASSERT_TRUE(pl.has_value()) << pl.error().message;
  const std::vector<float> got = drive(**pl);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  for (const auto& b : bes) EXPECT_GE(b->replays(), 1) << "no batched decode step was replayed";
}

// A pipeline's session snapshot has one model's bytes: saved from two stages it loads into one model and
// the other way round, and continuing gives the same logits.
TEST(LayerPipeline, SnapshotsMoveBetweenAPipelineAndOneModel) {
  test::TinyFile tiny("pipeline", 21);
  ASSERT_TRUE(tiny.mf);
  const ModelWeights& w = tiny.mf->weights;
  const auto V = static_cast<size_t>(w.spec.n_vocab);
  const std::string fp = model_fingerprint(w.spec, w);
  const std::vector<int32_t> t = test::random_tokens(80, w.spec.n_vocab, 4);
  auto be = make_cpu_backend(2), b0 = make_cpu_backend(1), b1 = make_cpu_backend(1);
  auto whole = Model::create(*be, w, nullptr, ModelOptions{});
  ASSERT_TRUE(whole.has_value());
  std::vector<Backend*> two = {b0.get(), b1.get()};
  auto pl = Model::create_pipeline(two, w, {0, 4}, ModelOptions{});
  ASSERT_TRUE(pl.has_value()) << pl.error().message;
  for (bool from_pipeline : {true, false}) {
    Model& src = from_pipeline ? **pl : **whole;
    Model& dst = from_pipeline ? **whole : **pl;
    KvState a = src.new_state(128), b = dst.new_state(128);
    std::vector<float> lg(V), want(V), got(V);
    ASSERT_TRUE(src.forward(a, t.data(), 60, 0, lg.data(), false).has_value());
    const std::vector<int32_t> fed(t.begin(), t.begin() + 60);
    const std::vector<uint8_t> snap = snapshot_save(src, a, fp, fed, lg, /*with_rows=*/true);
    std::vector<int32_t> toks;
    std::vector<float> logits;
    const Status st = snapshot_load(dst, b, fp, snap, toks, logits);
    ASSERT_TRUE(st.has_value()) << st.error().message;
    EXPECT_EQ(toks, fed);
    ASSERT_TRUE(src.forward(a, t.data() + 60, 1, 60, want.data(), false).has_value());
    ASSERT_TRUE(dst.forward(b, t.data() + 60, 1, 60, got.data(), false).has_value());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), V * sizeof(float))) << "from the pipeline: " << from_pipeline;
    src.free_state(a);
    dst.free_state(b);
  }
}

// The transports move the same bytes: DirectTransport copies CPU to CPU directly (Backend::copy_to) and falls
// back to host memory where a backend has no direct copy (the recording decorator); HostTransport always
// goes through host memory.
TEST(LayerPipeline, TransportsMoveTheSameBytes) {
  auto a = make_cpu_backend(1), b = make_cpu_backend(1);
  RecordingBackend ra(make_cpu_backend(1));
  std::vector<float> v(4 * 3 * 5);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
  for (Backend* from : {static_cast<Backend*>(a.get()), static_cast<Backend*>(&ra)}) {
    Tensor src = from->alloc(GgmlType::F32, 4, 3, 5);
    from->write(src, v.data(), v.size() * sizeof(float));
    Tensor scratch = from->alloc(GgmlType::F32, 4, 3, 5);
    EXPECT_EQ(from->copy_to(src, *b, scratch), from == a.get()) << "CPU to CPU copies directly";
    from->free(scratch);
    DirectTransport direct;
    HostTransport host;
    for (StageTransport* t : {static_cast<StageTransport*>(&direct), static_cast<StageTransport*>(&host)}) {
      Tensor dst = b->alloc(GgmlType::F32, 4, 3, 5);
      t->move(*from, src, *b, dst);
      std::vector<float> got(v.size());
      b->read(dst, got.data(), got.size() * sizeof(float));
      EXPECT_EQ(0, std::memcmp(got.data(), v.data(), v.size() * sizeof(float)));
      b->free(dst);
    }
    from->free(src);
  }
}

// Stages under memory budgets (StageMemory, what --gpus does when the GPUs cannot hold every routed expert):
// each stage keeps the experts beyond its budget in host memory, and the logits stay the whole model's.
TEST(LayerPipeline, StagesWithinBudgetsKeepExpertsInHostMemory) {
  test::TinyFile tiny("pipeline", 21);
  ASSERT_TRUE(tiny.mf);
  const ModelWeights& w = tiny.mf->weights;
  ModelOptions o;
  o.max_batch = 64;
  const std::vector<int32_t> t = test::random_tokens(k_prompt + k_decode, w.spec.n_vocab, 6);
  const int64_t V = w.spec.n_vocab;
  auto be = make_cpu_backend(2);
  auto whole = Model::create(*be, w, nullptr, o);
  ASSERT_TRUE(whole.has_value());
  KvState ws = (*whole)->new_state(512);
  const std::vector<float> want = run([&](const int32_t* ids, int64_t n, int64_t p0, float* lg,
                                          bool all) { return (*whole)->forward(ws, ids, n, p0, lg, all); },
                                      t, V);
  (*whole)->free_state(ws);
  // Each stage's budget: its dense part, buffers, reserve and gather stage, plus 2 experts of each of its layers.
  auto b0 = make_cpu_backend(1), b1 = make_cpu_backend(1);
  std::vector<Backend*> two = {b0.get(), b1.get()};
  const std::vector<uint32_t> first = {0, 3};
  auto roomy = Model::create_pipeline(two, w, first, o);
  ASSERT_TRUE(roomy.has_value());
  std::vector<StageMemory> memory;
  const uint32_t E = w.spec.n_expert;
  for (const Model* m = roomy->get(); m; m = m->next_stage()) {
    const WeightPlacement& p = m->placement();
    const uint64_t layers = m->layer_end() - m->layer_first(), one_layer = p.expert_bytes / E / layers;
    const uint64_t stage = one_layer * std::min<uint64_t>(E, uint64_t{64} * w.spec.n_expert_used);
    memory.push_back(StageMemory{p.dense_bytes + p.scratch_bytes + 1000 + stage + 2 * layers * one_layer, 1000});
  }
  roomy->reset();
  auto tight = Model::create_pipeline(two, w, first, o, memory);
  ASSERT_TRUE(tight.has_value()) << tight.error().message;
  for (const Model* m = tight->get(); m; m = m->next_stage()) {
    EXPECT_EQ(m->placement().min_resident, 2u);
    EXPECT_GT(m->placement().host_expert_bytes, 0u);
  }
  KvState st = (*tight)->new_state(512);
  const std::vector<float> got = run([&](const int32_t* ids, int64_t n, int64_t p0, float* lg,
                                         bool all) { return (*tight)->forward(st, ids, n, p0, lg, all); },
                                     t, V);
  (*tight)->free_state(st);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
  EXPECT_FALSE(Model::create_pipeline(two, w, first, o, std::vector<StageMemory>(1)).has_value());
}
