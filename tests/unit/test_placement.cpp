// Weight placement under a memory budget (ModelOptions::memory_budget): the
// dense weights, activation buffers and (when experts stay behind) the stage
// they are gathered into first, then as many routed experts as the budget
// leaves — spread evenly over the layers, or the most-used first
// (ModelOptions::expert_priority); the others stay in host memory
// (Backend::map_host_weight, MoeExpertsOp::slots). On the CPU backend both
// kinds of memory are host memory, so this checks the placement arithmetic and
// that every budget gives the all-resident logits bit for bit (the CUDA op
// harness checks the device kernels the same way).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "model/forward.h"
#include "gguf/gguf.h"
#include "model/model_file.h"
#include "model/shape_fit.h"
#include "model/tensor_table.h"
#include "quant/quant.h"
#include "synth/synth.h"
#include "recording_backend.h"
#include "tiny_file.h"

using namespace dsv4;

namespace {

struct Tiny : test::TinyFile {
  Tiny() : TinyFile("placement", 5) {}
};

// Logits of a 150-token prefill (every position) then 64 decode steps (fixed tokens: equal logits at every
// step also mean an equal greedy continuation).
constexpr int64_t k_prompt = 150, k_total = 214;
std::vector<float> run(Model& m) {
  const int64_t V = m.spec().n_vocab;
  std::mt19937 g(3);
  std::vector<int32_t> t(k_total);
  for (auto& v : t) v = static_cast<int32_t>(3 + g() % (V - 3));
  KvState s = m.new_state(512);
  std::vector<float> out(k_total * V);
  EXPECT_TRUE(m.forward(s, t.data(), k_prompt, 0, out.data(), true).has_value());
  for (int64_t p = k_prompt; p < k_total; ++p) EXPECT_TRUE(m.forward(s, t.data() + p, 1, p, out.data() + p * V, false));
  m.free_state(s);
  return out;
}

}  // namespace

TEST(Placement, EveryBudgetGivesTheAllResidentLogits) {
  Tiny tiny;
  ASSERT_TRUE(tiny.mf);
  auto be = make_cpu_backend(2);
  ModelOptions all;
  all.max_batch = 64;
  auto full = Model::create(*be, tiny.mf->weights, nullptr, all);
  ASSERT_TRUE(full.has_value()) << full.error().message;
  const WeightPlacement p0 = (*full)->placement();
  const uint32_t E = p0.n_expert;
  ASSERT_GT(E, 2u);
  EXPECT_EQ(p0.host_expert_bytes, 0u);
  EXPECT_EQ(p0.min_resident, E);
  EXPECT_GT(p0.dense_bytes, 0u);
  EXPECT_GT(p0.scratch_bytes, 0u);
  const std::vector<float> want = run(**full);
  const uint64_t per_expert = p0.expert_bytes / E;  // one expert of every layer
  const uint64_t n_layer = tiny.mf->weights.layers.size();
  const uint64_t one_layer = per_expert / n_layer;  // one expert of one layer (the tiny layers are alike)
  EXPECT_EQ(p0.stage_bytes, 0u);                    // nothing to gather when every expert fits
  // Offloading reserves the stage a batch gathers its host experts into: min(E, batch x k) of the largest layer's.
  const uint64_t stage = one_layer * std::min<uint64_t>(E, uint64_t{64} * tiny.mf->spec().n_expert_used);
  const uint64_t base = p0.dense_bytes + p0.scratch_bytes + 1000 + stage;
  struct Case {
    uint64_t budget;
    uint32_t min_resident, max_resident;
  };
  for (const Case& c : {Case{base, 0, 0}, Case{base + 2 * per_expert, 2, 2},
                        Case{base + 2 * per_expert + one_layer, 2, 3}, Case{base + 100 * per_expert, E, E}}) {
    ModelOptions o = all;
    o.memory_budget = c.budget;
    o.reserve_bytes = 1000;
    auto m = Model::create(*be, tiny.mf->weights, nullptr, o);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    const WeightPlacement& p = (*m)->placement();
    EXPECT_EQ(p.min_resident, c.min_resident) << "budget " << c.budget;
    EXPECT_EQ(p.max_resident, c.max_resident) << "budget " << c.budget;
    EXPECT_EQ(p.expert_bytes + p.host_expert_bytes, p0.expert_bytes);
    EXPECT_EQ(p.stage_bytes, c.min_resident == E ? 0 : stage);
    EXPECT_FALSE(p.by_usage);
    EXPECT_LE(p.dense_bytes + p.scratch_bytes + p.expert_bytes + o.reserve_bytes + p.stage_bytes, c.budget);
    const std::vector<float> got = run(**m);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
        << c.min_resident << "-" << c.max_resident << " of " << E << " experts resident per layer";
  }
}

// Layers with experts in host memory announce their expert op before the attention (Backend::moe_prefetch, for
// a backend that copies them in meanwhile), with the batch's tokens and k; layers without host experts do not.
TEST(Placement, LayersWithHostExpertsAnnounceTheirExpertOp) {
  Tiny tiny;
  ASSERT_TRUE(tiny.mf);
  const ModelSpec& S = tiny.mf->spec();
  ModelOptions all;
  all.max_batch = 64;
  for (const bool offload : {false, true}) {
    test::RecordingBackend be(make_cpu_backend(1));
    ModelOptions o = all;
    if (offload) {
      auto probe = Model::create(be, tiny.mf->weights, nullptr, all);
      ASSERT_TRUE(probe.has_value());
      const WeightPlacement p0 = (*probe)->placement();
      const uint64_t one_layer = p0.expert_bytes / p0.n_expert / tiny.mf->weights.layers.size();
      o.reserve_bytes = 1000;
      o.memory_budget = p0.dense_bytes + p0.scratch_bytes + o.reserve_bytes +
                        one_layer * std::min<uint64_t>(p0.n_expert, uint64_t{64} * S.n_expert_used) +
                        tiny.mf->weights.layers.size() * one_layer;  // one expert a layer resident
    }
    auto m = Model::create(be, tiny.mf->weights, nullptr, o);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    const size_t before = be.moe_log().size();
    KvState st = (*m)->new_state(128);
    std::vector<int32_t> ids(20, 7);
    std::vector<float> lg(static_cast<size_t>(S.n_vocab));
    ASSERT_TRUE((*m)->forward(st, ids.data(), 20, 0, lg.data(), false).has_value());
    (*m)->free_state(st);
    const std::vector<test::RecordingBackend::MoeCall> log(be.moe_log().begin() + static_cast<ptrdiff_t>(before),
                                                           be.moe_log().end());
    size_t experts = 0, prefetches = 0;
    for (size_t i = 0; i < log.size(); ++i) {
      if (!log[i].prefetch) {
        ++experts;
        continue;
      }
      ++prefetches;
      EXPECT_EQ(log[i].n, 20);
      EXPECT_EQ(log[i].k, static_cast<int64_t>(S.n_expert_used));
      // The next expert op is that layer's (the same host stacks).
      auto next = std::find_if(log.begin() + static_cast<ptrdiff_t>(i) + 1, log.end(),
                               [](const auto& c) { return !c.prefetch; });
      ASSERT_NE(next, log.end());
      EXPECT_EQ(next->host, log[i].host);
      EXPECT_EQ(next->n, 20);
    }
    EXPECT_EQ(experts, tiny.mf->weights.layers.size());
    EXPECT_EQ(prefetches, offload ? experts : 0u) << (offload ? "offloaded" : "all resident");
  }
}

TEST(Placement, ABudgetBelowTheDensePartIsAClearError) {
  Tiny tiny;
  ASSERT_TRUE(tiny.mf);
  auto be = make_cpu_backend(2);
  ModelOptions o;
  o.max_batch = 64;
  o.memory_budget = 1 << 20;
  o.reserve_bytes = 1 << 20;
  auto m = Model::create(*be, tiny.mf->weights, nullptr, o);
  ASSERT_FALSE(m.has_value());
  const std::string& e = m.error().message;
  EXPECT_NE(e.find("too small"), std::string::npos) << e;
  EXPECT_NE(e.find("need at least"), std::string::npos) << e;
  EXPECT_NE(e.find("dense weights"), std::string::npos) << e;
}

TEST(Placement, MostUsedExpertsFirstWithRoutingStatistics) {
  // Statistics that favour one expert per layer (a different one in each) and make layer 0 the busiest: with
  // room for n_layer + E - 1 experts, each layer keeps its favourite and layer 0 all of its experts. The
  // logits stay the all-resident ones bit for bit, and counting the routing changes nothing either.
  Tiny tiny;
  ASSERT_TRUE(tiny.mf);
  auto be = make_cpu_backend(2);
  ModelOptions all;
  all.max_batch = 64;
  all.count_routing = true;
  auto full = Model::create(*be, tiny.mf->weights, nullptr, all);
  ASSERT_TRUE(full.has_value()) << full.error().message;
  const std::vector<float> want = run(**full);
  const WeightPlacement p0 = (*full)->placement();
  const uint32_t E = p0.n_expert, L = static_cast<uint32_t>(tiny.mf->weights.layers.size());
  const ExpertStats& counted = (*full)->routing_counts();
  ASSERT_EQ(counted.n_layer, L);
  ASSERT_EQ(counted.n_expert, E);
  // Every token of the prefill and the decode steps, k experts in every layer.
  EXPECT_EQ(counted.total(), uint64_t{k_total} * tiny.mf->spec().n_expert_used * L);

  ExpertStats pri = ExpertStats::zeros(L, E);
  for (uint32_t il = 0; il < L; ++il) pri.at(il, (il * 3 + 1) % E) = 100;
  for (uint32_t e = 0; e < E; ++e) pri.at(0, e) += 10;
  const uint64_t per_expert = p0.expert_bytes / E, one_layer = per_expert / L;
  const uint64_t stage = one_layer * std::min<uint64_t>(E, uint64_t{64} * tiny.mf->spec().n_expert_used);
  ModelOptions o = all;
  o.reserve_bytes = 1000;
  o.memory_budget = p0.dense_bytes + p0.scratch_bytes + o.reserve_bytes + stage + (L + E - 1) * one_layer;
  o.expert_priority = pri;
  auto m = Model::create(*be, tiny.mf->weights, nullptr, o);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  const WeightPlacement& p = (*m)->placement();
  EXPECT_TRUE(p.by_usage);
  EXPECT_EQ(p.min_resident, 1u);
  EXPECT_EQ(p.max_resident, E);
  EXPECT_EQ(p.expert_bytes, (L + E - 1) * one_layer);
  const std::vector<float> got = run(**m);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)));
  // The same routing, whatever the placement.
  EXPECT_EQ((*m)->routing_counts().counts, counted.counts);

  // Statistics of another model's shape are refused, naming both shapes.
  o.expert_priority = ExpertStats::zeros(L + 1, E);
  auto bad = Model::create(*be, tiny.mf->weights, nullptr, o);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("do not fit this model"), std::string::npos) << bad.error().message;
}

// A model and its F32 twin (the tensors of `decoded` classes stored as the F32 values they decode to; every
// KV and every other tensor copied) give the same logits bit for bit on the CPU, which dequantises a row
// and dots it in the same order for every type. Returns the number of tensors decoded.
namespace {

int expect_dequantised_twin(const SynthPlan& plan, const std::vector<TypeClass>& decoded, const std::string& tag) {
  const std::string base =
      (std::filesystem::temp_directory_path() / ("dsv4_test_" + tag + "_" + std::to_string(::getpid()))).string();
  const std::string quantised = base + "_q.gguf", f32 = base + "_f32.gguf";
  EXPECT_TRUE(synth_write(plan, quantised, 2).has_value());
  auto src = GgufFile::open(quantised);
  EXPECT_TRUE(src.has_value()) << src.error().message;
  if (!src) return 0;
  const GgufFile& g = **src;
  GgufWriter w;
  for (const GgufKV& kv : g.kvs()) w.copy_kv(g, kv);
  std::map<std::string, TypeClass> cls;
  for (const TensorSpec& t : main_tensor_table(plan.preset.spec)) cls[t.name] = t.cls;
  int n_decoded = 0;
  for (const GgufTensorInfo& t : g.tensors()) {
    const std::vector<uint64_t> ne(t.ne, t.ne + t.n_dims);
    const uint8_t* data = g.tensor_data(t);
    const size_t rb = ggml_row_bytes(t.type, t.ne[0]);
    const bool decode = t.type != GgmlType::F32 && t.type != GgmlType::F16 && t.type != GgmlType::I32 &&
                        std::find(decoded.begin(), decoded.end(), cls[std::string(t.name)]) != decoded.end();
    if (decode) {
      ++n_decoded;
      const GgmlType from = t.type;
      const uint64_t cols = t.ne[0];
      w.add_tensor(std::string(t.name), GgmlType::F32, ne, [=](uint64_t r0, uint64_t nr, uint8_t* dst) -> Status {
        for (uint64_t r = 0; r < nr; ++r)
          quant::dequantize_row(from, data + (r0 + r) * rb, reinterpret_cast<float*>(dst) + r * cols,
                                static_cast<int64_t>(cols));
        return {};
      });
    } else {
      w.add_tensor(std::string(t.name), t.type, ne, [=](uint64_t r0, uint64_t nr, uint8_t* dst) -> Status {
        std::memcpy(dst, data + r0 * rb, nr * rb);
        return {};
      });
    }
  }
  EXPECT_TRUE(w.write(f32).has_value());
  auto be = make_cpu_backend(2);
  ModelOptions o;
  o.max_batch = 64;
  std::vector<float> logits[2];
  for (int i = 0; i < 2; ++i) {
    auto mf = open_model(i == 0 ? quantised : f32);
    EXPECT_TRUE(mf.has_value()) << mf.error().message;
    if (!mf) return 0;
    auto m = Model::create(*be, (*mf)->weights, nullptr, o);
    EXPECT_TRUE(m.has_value()) << m.error().message;
    if (!m) return 0;
    logits[i] = run(**m);
  }
  EXPECT_EQ(logits[0].size(), logits[1].size());
  EXPECT_EQ(0, std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)));
  double mag = 0;
  for (float v : logits[0]) mag += std::fabs(v);
  EXPECT_GT(mag, 0.0);
  std::filesystem::remove(quantised);
  std::filesystem::remove(f32);
  return n_decoded;
}

}  // namespace

// Dense matrices may be any type the backends' matmuls compute with: the tiny model with its DENSE_MAT tensors
// in Q4_K (those with rows of whole 256-value blocks; the others stay Q8_0) gives its F32 twin's logits.
TEST(WeightTypes, DenseMatricesInQ4KGiveTheirDequantisedLogits) {
  SynthPlan plan = synth_plan(*find_preset("tiny"), 5);
  plan.tensor_bytes = 0;
  for (auto& t : plan.tensors) {
    if (t.spec.cls == TypeClass::DENSE_MAT && t.spec.ne[0] % 256 == 0) {  // rows of whole Q4_K blocks
      t.type = GgmlType::Q4_K;
      t.n_bytes = ggml_type_bytes(t.type, t.spec.n_elements());
    }
    plan.tensor_bytes += t.n_bytes;
  }
  EXPECT_GT(expect_dequantised_twin(plan, {TypeClass::DENSE_MAT}, "dense"), 10);
}

// MXFP4 routed experts (the published mxfp4 layout, preset tiny-mxfp4) run on the CPU: the F32 twin of
// every routed expert gives the same logits, and the CUDA backend takes the file (its decoders:
// test_cuda_decode; its kernels: test_backend_ops).
TEST(WeightTypes, Mxfp4ExpertsGiveTheirDequantisedLogits) {
  const SynthPlan plan = synth_plan(*find_preset("tiny-mxfp4"), 6);
  int mx = 0;
  for (const auto& t : plan.tensors) mx += t.type == GgmlType::MXFP4;
  EXPECT_EQ(mx, 18);  // gate, up, down of 6 layers
  EXPECT_EQ(expect_dequantised_twin(plan, {TypeClass::EXPERT_GATE_UP, TypeClass::EXPERT_DOWN}, "mxfp4"), 18);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dsv4_test_mx_" + std::to_string(::getpid()))).string();
  ASSERT_TRUE(synth_write(plan, path, 2).has_value());
  auto mf = open_model(path);
  ASSERT_TRUE(mf.has_value()) << mf.error().message;
  EXPECT_NE((*mf)->weights.mix.describe().find("mxfp4"), std::string::npos) << (*mf)->weights.mix.describe();
  const Status cuda = check_cuda_fit((*mf)->weights, nullptr, Numerics::REFERENCE);
  EXPECT_TRUE(cuda.has_value()) << cuda.error().message;
  std::filesystem::remove(path);
  // The published size (ds4-variants-mtp-dspark.md §1.2: 155,971,123,548 tensor bytes).
  EXPECT_EQ(synth_plan(*find_preset("flash-mxfp4"), 1).tensor_bytes, 155971123548ull);
}
