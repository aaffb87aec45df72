#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "sampling/sampler.h"

using namespace dsv4;

TEST(Sampler, GreedyAndTies) {
  std::vector<float> l = {0.1f, 2.0f, 2.0f, -1.0f};
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 4);
  EXPECT_EQ(s.sample(l, {}), 1);  // lowest id among equal maxima
  p.temperature = 1.0f;
  Sampler s2(p, 4);
  EXPECT_EQ(s2.sample(l, {}, /*force_greedy=*/true), 1);
}

TEST(Sampler, SeedIsDeterministic) {
  std::vector<float> l(100);
  for (size_t i = 0; i < l.size(); ++i) l[i] = std::sin(static_cast<float>(i)) * 3;
  SamplingParams p;
  p.seed = 42;
  Sampler a(p, 100), b(p, 100);
  p.seed = 43;
  Sampler c(p, 100);
  std::vector<int32_t> ra, rb, rc;
  for (int i = 0; i < 50; ++i) {
    ra.push_back(a.sample(l, {}));
    rb.push_back(b.sample(l, {}));
    rc.push_back(c.sample(l, {}));
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
}

TEST(Sampler, MatchesSoftmaxDistribution) {
  std::vector<float> l = {1.0f, 0.0f, -1.0f, 2.0f};
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 7;
  Sampler s(p, 4);
  std::map<int32_t, int> counts;
  const int N = 40000;
  for (int i = 0; i < N; ++i) counts[s.sample(l, {})]++;
  double z = 0;
  for (float v : l) z += std::exp(v / 0.5);
  for (int t = 0; t < 4; ++t)
    EXPECT_NEAR(counts[t] / double(N), std::exp(l[static_cast<size_t>(t)] / 0.5) / z, 0.01) << t;
}

TEST(Sampler, TopKTopPMinP) {
  std::vector<float> l = {3.0f, 2.9f, 0.0f, -5.0f, 2.8f};
  SamplingParams p;
  p.seed = 1;
  p.top_k = 1;
  Sampler k1(p, 5);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(k1.sample(l, {}), 0);
  p.top_k = 0;
  p.top_p = 0.01f;  // only the top token carries enough mass
  Sampler tp(p, 5);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(tp.sample(l, {}), 0);
  p.top_p = 1.0f;
  p.min_p = 0.5f;  // drops 0.0 and -5.0 (far below half of p_max)
  Sampler mp(p, 5);
  for (int i = 0; i < 200; ++i) {
    int32_t t = mp.sample(l, {});
    EXPECT_TRUE(t == 0 || t == 1 || t == 4) << t;
  }
}

TEST(Sampler, PenaltiesDiscourageRepeats) {
  std::vector<float> l = {2.0f, 1.9f};
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 1.5f;  // 2.0 / 1.5 = 1.33 < 1.9
  Sampler rp(p, 2);
  std::vector<int32_t> hist = {0};
  EXPECT_EQ(rp.sample(l, hist), 1);
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 0.2f;
  Sampler pp(p, 2);
  EXPECT_EQ(pp.sample(l, hist), 1);
  p.presence_penalty = 0.0f;
  p.frequency_penalty =
      0.04f;  // 2 occurrences: 2.0 - 0.08 < 1.9 + ... 1.92 > 1.9 -> still 0; 3 occurrences: 1.88 < 1.9
  Sampler fp(p, 2);
  std::vector<int32_t> two = {0, 0}, three = {0, 0, 0};
  EXPECT_EQ(fp.sample(l, two), 0);
  EXPECT_EQ(fp.sample(l, three), 1);
  p.frequency_penalty = 1.0f;
  p.penalty_window = 1;  // only the last token counts
  Sampler wp(p, 2);
  std::vector<int32_t> old = {0, 1};
  EXPECT_EQ(wp.sample(l, old), 0);
}

TEST(Logprobs, TopAndToken) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f};
  auto top = top_logprobs(l, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 2);
  EXPECT_EQ(top[1].first, 1);
  double z = std::log(std::exp(0.0) + std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(top[0].second, 2.0 - z, 1e-6);
  EXPECT_NEAR(token_logprob(l, 0), -z, 1e-6);
}

TEST(StopMatcher, AcrossTokenBoundariesAndNotLeaked) {
  StopMatcher m({"</end>", "STOP"});
  std::string out;
  bool stopped = false;
  for (std::string_view piece : {"Hello </", "en", "d> more"}) {
    auto r = m.push(piece);
    out += r.emit;
    if (r.stopped) {
      stopped = true;
      EXPECT_EQ(r.stop, "</end>");
      break;
    }
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(out, "Hello ");
  // A held-back prefix that turns out not to be a stop is released.
  StopMatcher m2({"STOP"});
  std::string o2 = m2.push("abc ST").emit;
  EXPECT_EQ(o2, "abc ");
  o2 += m2.push("ART").emit;
  EXPECT_EQ(o2, "abc START");
  o2 += m2.push("S").emit;
  o2 += m2.flush();
  EXPECT_EQ(o2, "abc STARTS");
  // Earliest match wins when several complete at once.
  StopMatcher m3({"bc", "ab"});
  auto r3 = m3.push("xabcd");
  EXPECT_TRUE(r3.stopped);
  EXPECT_EQ(r3.emit, "x");
  EXPECT_EQ(r3.stop, "ab");
  // No stops: everything passes straight through.
  StopMatcher none({});
  EXPECT_EQ(none.push("abc").emit, "abc");
}
