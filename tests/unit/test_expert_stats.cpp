// Routing statistics (model/expert_stats.h): the --expert-stats file format
// (round trip, strict parsing of damaged files, atomic save), the merge and
// the skew summary; and the synthetic router skew (SynthPlan::router_skew)
// that the offload benchmarks use to give some experts most of the traffic.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "model/expert_stats.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "synth/synth.h"

using namespace dsv4;

namespace {

ExpertStats sample() {
  ExpertStats s = ExpertStats::zeros(3, 4);
  for (uint32_t l = 0; l < 3; ++l)
    for (uint32_t e = 0; e < 4; ++e) s.at(l, e) = (l + 1) * 1000000007ull * (e + 1);
  return s;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string();
}

}  // namespace

TEST(ExpertStats, RoundTripAndFormat) {
  const ExpertStats s = sample();
  const std::string text = expert_stats_encode(s);
  EXPECT_EQ(text.substr(0, text.find('\n')), "dsv4-expert-stats 1");
  EXPECT_NE(text.find("\nlayers 3 experts 4\n0 1000000007 2000000014 "), std::string::npos) << text;
  auto back = expert_stats_decode(text);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(back->n_layer, 3u);
  EXPECT_EQ(back->n_expert, 4u);
  EXPECT_EQ(back->counts, s.counts);
  // Windows line ends and a trailing blank line are accepted.
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  EXPECT_TRUE(expert_stats_decode(crlf + "\n").has_value());
}

TEST(ExpertStats, DamagedFilesAreClearErrors) {
  const std::string good = expert_stats_encode(sample());
  const std::pair<std::string, const char*> cases[] = {
      {"", "not a dsv4 routing statistics file"},
      {"dsv4-expert-stats 2\n", "not a dsv4 routing statistics file"},
      {"dsv4-expert-stats 1\nlayers 3\n", "line 2: expected \"layers N experts E\""},
      {"dsv4-expert-stats 1\nlayers 0 experts 4\n", "line 2: 0 layers x 4 experts is out of range"},
      {"dsv4-expert-stats 1\nlayers 3 experts 4\n0 1 2 3 4\n", "the file is too short to hold their counts"},
      {"dsv4-expert-stats 1\nlayers 3 experts 4\n0 1 2 3 4\n1 1 2 3 4\n                  \n",
       "line 5: expected layer 2 first"},
      {"dsv4-expert-stats 1\nlayers 3 experts 4\n0 1 2 3 4\n1 1 2 3 4\n", "line 5: the file ends before layer 2"},
      {"dsv4-expert-stats 1\nlayers 4096 experts 65536\n0 1\n", "the file is too short to hold their counts"},
      {"dsv4-expert-stats 1\nlayers 1 experts 4\n1 1 2 3 4\n", "line 3: expected layer 0 first"},
      {"dsv4-expert-stats 1\nlayers 1 experts 4\n0 1 2 3\n", "line 3: expected 4 counts, found 3"},
      {"dsv4-expert-stats 1\nlayers 1 experts 4\n0 1 2 x 4\n", "line 3: expected 4 counts, found 2"},
      {"dsv4-expert-stats 1\nlayers 1 experts 4\n0 1 2 -3 4\n", "line 3: expected 4 counts, found 2"},
      {"dsv4-expert-stats 1\nlayers 1 experts 4\n0 1 2 3 4 5\n", "line 3: more than 4 counts"},
      {"dsv4-expert-stats 1\nlayers 1 experts 4\n0 1 2 3 99999999999999999999\n", "line 3: expected 4 counts"},
      {good + "3 1 2 3 4\n", "text after the last layer's line"},
  };
  for (const auto& [text, message] : cases) {
    auto r = expert_stats_decode(text);
    ASSERT_FALSE(r.has_value()) << text;
    EXPECT_NE(r.error().message.find(message), std::string::npos) << r.error().message << "\nwant: " << message;
  }
}

TEST(ExpertStats, SaveLoadMergeAndShare) {
  const std::string path = temp_path("dsv4_expert_stats");
  ExpertStats s = sample();
  ASSERT_TRUE(expert_stats_save(path, s).has_value());
  auto back = expert_stats_load(path);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  ASSERT_TRUE(back->merge(s).has_value());
  for (size_t i = 0; i < s.counts.size(); ++i) EXPECT_EQ(back->counts[i], 2 * s.counts[i]);
  EXPECT_EQ(back->total(), 2 * s.total());
  auto wrong = ExpertStats::zeros(3, 5);
  const Status st = back->merge(wrong);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("3 layers x 5 experts cannot be merged with 3 x 4"), std::string::npos);
  std::filesystem::remove(path);
  auto missing = expert_stats_load(path);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("cannot open"), std::string::npos);
  // A file in a directory that does not exist: an error, and no temporary file left behind.
  EXPECT_FALSE(expert_stats_save("/nonexistent-dir/stats", s).has_value());

  // top_share: uniform counts give the fraction itself; one expert taking everything gives 1.
  ExpertStats u = ExpertStats::zeros(2, 8);
  for (auto& c : u.counts) c = 5;
  EXPECT_DOUBLE_EQ(u.top_share(0.25), 0.25);
  ExpertStats one = ExpertStats::zeros(2, 8);
  one.at(0, 3) = 7;
  one.at(1, 6) = 9;
  EXPECT_DOUBLE_EQ(one.top_share(0.25), 1.0);
  EXPECT_DOUBLE_EQ(ExpertStats::zeros(2, 8).top_share(0.25), 0.0);
}

TEST(SynthRouterSkew, BiasFollowsTheRankAndSkewsTheRouting) {
  // exp_probs_b of a skewed plan = the uniform plan's + -0.05 skew ln(1 + rank), rank a permutation per layer;
  // a tiny model run with it concentrates its routing on fewer experts than the uniform one.
  const Preset tiny = *find_preset("tiny");
  SynthPlan flat = synth_plan(tiny, 9), skewed = synth_plan(tiny, 9);
  skewed.router_skew = 20;  // strong: the tiny router's own scores already favour some experts
  int checked = 0;
  for (const SynthTensor& t : flat.tensors) {
    if (t.spec.scope != TensorScope::LAYER || t.spec.slot != static_cast<int>(LayerTensor::EXP_PROBS_B)) continue;
    const size_t E = t.spec.ne[0];
    std::vector<float> a(E), b(E);
    synth_fill_rows(flat, t, 0, 1, reinterpret_cast<uint8_t*>(a.data()));
    synth_fill_rows(skewed, t, 0, 1, reinterpret_cast<uint8_t*>(b.data()));
    std::vector<bool> seen(E, false);
    for (size_t e = 0; e < E; ++e) {
      const double r = std::expm1((a[e] - b[e]) / (0.05 * 20));  // the rank, from the difference
      const long rank = std::lround(r);
      ASSERT_NEAR(r, static_cast<double>(rank), 1e-3) << t.spec.name << " expert " << e;
      ASSERT_TRUE(rank >= 0 && rank < static_cast<long>(E) && !seen[static_cast<size_t>(rank)]);
      seen[static_cast<size_t>(rank)] = true;
    }
    ++checked;
  }
  EXPECT_GT(checked, 0);

  auto share = [&](const SynthPlan& plan) {
    const std::string path = temp_path("dsv4_test_skew") + ".gguf";
    EXPECT_TRUE(synth_write(plan, path, 2).has_value());
    auto mf = open_model(path);
    EXPECT_TRUE(mf.has_value());
    auto be = make_cpu_backend(2);
    ModelOptions o;
    o.max_batch = 256;
    o.count_routing = true;
    auto m = Model::create(*be, (*mf)->weights, nullptr, o);
    EXPECT_TRUE(m.has_value());
    std::mt19937 g(1);
    std::vector<int32_t> ids(256);
    for (auto& v : ids) v = static_cast<int32_t>(3 + g() % ((*m)->spec().n_vocab - 3));
    KvState s = (*m)->new_state(512);
    EXPECT_TRUE((*m)->forward(s, ids.data(), 256, 0, nullptr, false).has_value());
    (*m)->free_state(s);
    // The top-k layers only (the first ones route by token id, without a bias).
    const ExpertStats& all = (*m)->routing_counts();
    ExpertStats topk = ExpertStats::zeros(0, all.n_expert);
    for (uint32_t l = 0; l < all.n_layer; ++l) {
      if ((*m)->spec().is_hash_layer(l)) continue;
      ++topk.n_layer;
      for (uint32_t e = 0; e < all.n_expert; ++e) topk.counts.push_back(all.at(l, e));
    }
    const double top = topk.top_share(0.25);
    std::filesystem::remove(path);
    return top;
  };
  const double flat_share = share(flat), skew_share = share(skewed);
  EXPECT_GT(skew_share, flat_share + 0.15) << "uniform " << flat_share << ", skewed " << skew_share;
}
