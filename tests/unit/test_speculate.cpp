// Speculative decoding on the synthetic tiny model (CPU backend, bitwise):
//   - Session::verify keeps any prefix of the verified rows exactly: the logits of every row, the
//     session's logits after the kept prefix, and everything decoded afterwards equal plain
//     prefill/decode, whatever the dropped rows held and wherever the rows fall relative to the
//     compression windows (ratio 4 with overlap, ratio 128) and the 128-token window;
//   - generate() with proposals (MTP, DSpark, or a replay of a known continuation) gives the tokens
//     plain decoding gives, greedy and sampled, and a drafter that is always right gets k + 1 tokens
//     a pass;
//   - the DSpark drafter: deterministic, its target features follow verify/commit exactly, and
//     support files with bad metadata or of the wrong kind are clear load errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "dsv4/engine.h"
#include "generate/generate.h"
#include "synth/synth.h"
#include "../common/token_walk.h"

using namespace dsv4;
using dsv4::test::bitwise_equal;
using dsv4::test::tiny_tokens;

namespace {

constexpr size_t V = 512;

struct Fixture {
  std::string dir, model, mtp, dspark;
  std::unique_ptr<Engine> engine, dspark_engine;  // the second drafts with DSpark (confidence 0: whole blocks)
  Fixture() {
    dir = (std::filesystem::temp_directory_path() / ("dsv4_spec_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    model = dir + "/tiny.gguf";
    mtp = dir + "/tiny-mtp.gguf";
    const Preset p = *find_preset("tiny");
    EXPECT_TRUE(synth_write(synth_plan(p, 31), model, 2).has_value());
    EXPECT_TRUE(synth_write(synth_mtp_plan(p, 32), mtp, 2).has_value());
    dspark = dir + "/tiny-dspark.gguf";
    EXPECT_TRUE(synth_write(synth_dspark_plan(p, 33), dspark, 2).has_value());
    EngineOptions o;
    o.model_path = model;
    o.mtp_path = mtp;
    o.backend = BackendChoice::CPU;
    o.ctx = 2048;
    o.prefill_batch = 64;
    o.show_progress = false;
    auto e = Engine::load(o);
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    engine = std::move(*e);
    o.mtp_path.clear();
    o.dspark_path = dspark;
    o.dspark_confidence = 0;
    auto d = Engine::load(o);
    EXPECT_TRUE(d.has_value()) << (d ? "" : d.error().message);
    dspark_engine = std::move(*d);
  }
  ~Fixture() { std::filesystem::remove_all(dir); }
};

Fixture& fx() {
  static Fixture f;
  return f;
}

std::vector<float> row(const std::vector<float>& all, size_t i) {
  return {all.begin() + static_cast<long>(i * V), all.begin() + static_cast<long>((i + 1) * V)};
}

}  // namespace

TEST(Speculate, VerifyKeepsAnyPrefixExactly) {
  Engine& e = *fx().engine;
  const auto t = tiny_tokens(700, 17);
  auto ref = e.new_session();
  auto want = (*ref)->prefill_all_logits(t);  // want[i]: the logits after t[0..i]
  ASSERT_TRUE(want.has_value()) << want.error().message;

  auto s = e.new_session();
  ASSERT_TRUE((*s)->prefill(std::span<const int32_t>(t.data(), 5)).has_value());
  std::mt19937 rng(7);
  size_t at = 5, passes = 0, partial = 0;
  while (at < 600) {
    const size_t n = std::min<size_t>(1 + rng() % Session::max_verify(), 600 - at);
    const size_t keep = rng() % (n + 1);
    // Rows past the kept ones hold other tokens: what they leave behind must not matter.
    std::vector<int32_t> rows(t.begin() + static_cast<long>(at), t.begin() + static_cast<long>(at + keep));
    for (size_t j = keep; j < n; ++j) rows.push_back(static_cast<int32_t>(3 + rng() % 509));
    bool rows_ok = true;
    auto kept = (*s)->verify(rows, [&](std::span<const float> all) {
      for (size_t j = 0; j < keep; ++j)
        rows_ok = rows_ok && std::memcmp(all.data() + j * V, want->data() + (at + j) * V, V * sizeof(float)) == 0;
      return keep;
    });
    ASSERT_TRUE(kept.has_value()) << kept.error().message;
    ASSERT_EQ(*kept, keep);
    ASSERT_TRUE(rows_ok) << "verified rows at " << at;
    at += keep;
    ASSERT_EQ((*s)->n_tokens(), at);
    ASSERT_TRUE(bitwise_equal((*s)->logits(), row(*want, at - 1))) << "after keeping " << keep << " of " << n;
    ++passes;
    partial += keep < n;
  }
  EXPECT_GT(partial, 20u);
  // Plain decoding from here on (past more ratio-4 and ratio-128 windows) sees exactly the plain state.
  for (; at < t.size(); ++at) {
    ASSERT_TRUE((*s)->decode(t[at]).has_value());
    ASSERT_TRUE(bitwise_equal((*s)->logits(), row(*want, at))) << "decode at " << at << " after " << passes;
  }
}

TEST(Speculate, VerifyErrorsLeaveTheSessionAsItWas) {
  Engine& e = *fx().engine;
  auto s = e.new_session();
  const auto t = tiny_tokens(40, 3);
  ASSERT_TRUE((*s)->prefill(t).has_value());
  const auto before = (*s)->logits();
  std::vector<int32_t> too_many(Session::max_verify() + 1, 5);
  EXPECT_FALSE((*s)->verify(too_many, nullptr).has_value());
  std::vector<int32_t> bad{5, 100000};
  EXPECT_FALSE((*s)->verify(bad, nullptr).has_value());
  EXPECT_EQ((*s)->n_tokens(), 40u);
  EXPECT_TRUE(bitwise_equal((*s)->logits(), before));
  // keep() asking for more than it was given: everything is kept, and the call says so.
  std::vector<int32_t> two{5, 6};
  auto r = (*s)->verify(two, [](std::span<const float>) { return size_t{3}; });
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ((*s)->n_tokens(), 42u);
  // The session goes on normally.
  ASSERT_TRUE((*s)->decode(7).has_value());
}

TEST(Speculate, MtpDraftsAreChainedAndLeaveTheSession) {
  Engine& e = *fx().engine;
  auto s = e.new_session();
  ASSERT_TRUE((*s)->prefill(tiny_tokens(30, 4)).has_value());
  const auto before = (*s)->logits();
  auto d = (*s)->mtp_draft(9, 4);
  ASSERT_TRUE(d.has_value()) << d.error().message;
  ASSERT_EQ(d->size(), 4u);
  for (int32_t x : *d) EXPECT_TRUE(x >= 0 && x < static_cast<int32_t>(V));
  // The first proposal is MTP's argmax for (last state, 9); the same call again gives the same chain.
  auto lg = (*s)->mtp_logits(9);
  ASSERT_TRUE(lg.has_value());
  EXPECT_EQ((*d)[0], static_cast<int32_t>(std::max_element(lg->begin(), lg->end()) - lg->begin()));
  auto d2 = (*s)->mtp_draft(9, 4);
  ASSERT_TRUE(d2.has_value());
  EXPECT_EQ(*d, *d2);
  EXPECT_EQ((*s)->n_tokens(), 30u);
  EXPECT_TRUE(bitwise_equal((*s)->logits(), before));
}

TEST(Speculate, PrefillAndKeptRowsFillTheMtpWindowAsDecodingWould) {
  // A: decode token by token, running MTP after each position with the token that follows (what
  // the window should hold). B: one verify pass keeping every row. Their next MTP logits agree
  // bitwise, so the window rows B's pass wrote are A's. (Both prefilled N tokens first, which
  // filled their windows alike.)
  Engine& e = *fx().engine;
  const auto t = tiny_tokens(60, 12);
  const size_t N = 40, a = 9;
  auto A = e.new_session();
  auto B = e.new_session();
  ASSERT_TRUE((*A)->prefill(std::span<const int32_t>(t.data(), N)).has_value());
  ASSERT_TRUE((*B)->prefill(std::span<const int32_t>(t.data(), N)).has_value());
  for (size_t p = N; p < N + a; ++p) {
    ASSERT_TRUE((*A)->decode(t[p]).has_value());
    if (p + 1 < N + a) {
      ASSERT_TRUE((*A)->mtp_logits(t[p + 1]).has_value());
    }
  }
  auto kept = (*B)->verify(std::span<const int32_t>(t.data() + N, a), [](std::span<const float>) { return a; });
  ASSERT_TRUE(kept.has_value()) << kept.error().message;
  auto la = (*A)->mtp_logits(t[N + a]);
  auto lb = (*B)->mtp_logits(t[N + a]);
  ASSERT_TRUE(la.has_value() && lb.has_value());
  EXPECT_TRUE(bitwise_equal(*la, *lb));
  // A prefill fills the window the same way (here in chunks: the fixture's batch of 64 holds 16
  // rows of 4 streams), and so does a prefill after a verify pass.
  auto C = e.new_session();
  ASSERT_TRUE((*C)->prefill(std::span<const int32_t>(t.data(), N + a)).has_value());
  auto lc = (*C)->mtp_logits(t[N + a]);
  ASSERT_TRUE(lc.has_value());
  auto D = e.new_session();  // token by token from the start, MTP after each
  for (size_t p = 0; p < N + a; ++p) {
    ASSERT_TRUE((*D)->decode(t[p]).has_value());
    if (p + 1 < N + a) {
      ASSERT_TRUE((*D)->mtp_logits(t[p + 1]).has_value());
    }
  }
  auto ld = (*D)->mtp_logits(t[N + a]);
  ASSERT_TRUE(ld.has_value());
  EXPECT_TRUE(bitwise_equal(*lc, *ld));
  // A never wrote the row of position N - 1 (no draft followed its prompt, and a prefill leaves the
  // last position's row to the next draft): one row missing changes the logits, so the rows matter.
  EXPECT_FALSE(bitwise_equal(*la, *ld));
}

namespace {

GenerateResult gen(int draft, float temperature, int max_tokens, const GenerateOptions* base = nullptr) {
  Engine& e = *fx().engine;
  auto s = e.new_session();
  GenerateOptions o = base ? *base : GenerateOptions{};
  o.sampling.temperature = temperature;
  o.sampling.seed = 1234;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  o.parse_chat = false;
  o.draft = draft;
  const auto p = tiny_tokens(150, 8);
  auto r = generate(**s, e.tokenizer(), p, o);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  EXPECT_EQ((*s)->n_tokens(), p.size() + r->tokens.size());
  return *r;
}

}  // namespace

TEST(Speculate, GenerateWithMtpGivesThePlainTokens) {
  for (float temp : {0.0f, 0.9f}) {
    const GenerateResult plain = gen(0, temp, 64);
    EXPECT_EQ(plain.spec.passes, 0u);
    for (int draft : {1, 5}) {
      const GenerateResult spec = gen(draft, temp, 64);
      EXPECT_EQ(spec.tokens, plain.tokens) << "draft " << draft << " temperature " << temp;
      EXPECT_GT(spec.spec.passes, 0u);
      EXPECT_LE(spec.spec.accepted, spec.spec.proposed);
    }
  }
}

TEST(Speculate, AlwaysRightProposalsGiveKPlusOneTokensAPass) {
  // Record the greedy continuation, then propose exactly it: every proposal is accepted, so
  // each pass yields k + 1 tokens (the last pass may be cut by max_tokens).
  const GenerateResult plain = gen(0, 0.0f, 121);
  for (int k : {1, 2, 5}) {
    GenerateOptions o;
    o.drafter = [&](Session&, std::span<const int32_t> generated, int32_t, int n) -> expected<std::vector<int32_t>> {
      std::vector<int32_t> out;
      for (size_t i = generated.size(); i < plain.tokens.size() && out.size() < static_cast<size_t>(n); ++i)
        out.push_back(plain.tokens[i]);
      return out;
    };
    const GenerateResult spec = gen(k, 0.0f, 121, &o);
    EXPECT_EQ(spec.tokens, plain.tokens);
    EXPECT_EQ(spec.spec.accepted, spec.spec.proposed) << "k " << k;
    // 121 tokens: the first from the prompt's logits, then 120 over passes of k + 1.
    EXPECT_EQ(spec.spec.passes, static_cast<uint64_t>((120 + k) / (k + 1))) << "k " << k;
  }
  // Proposals that are always wrong cost nothing in output: the same tokens, none accepted.
  GenerateOptions o;
  o.drafter = [&](Session&, std::span<const int32_t> generated, int32_t, int n) -> expected<std::vector<int32_t>> {
    std::vector<int32_t> out;
    for (size_t i = generated.size(); i < plain.tokens.size() && out.size() < static_cast<size_t>(n); ++i)
      out.push_back(plain.tokens[i] == 3 ? 4 : 3);
    return out;
  };
  const GenerateResult wrong = gen(3, 0.0f, 121, &o);
  EXPECT_EQ(wrong.tokens, plain.tokens);
  EXPECT_EQ(wrong.spec.accepted, 0u);
}

TEST(Speculate, DSparkBlocksAreDeterministicAndLeaveTheSession) {
  Engine& e = *fx().dspark_engine;
  ASSERT_TRUE(e.info().has_dspark);
  EXPECT_EQ(e.info().dspark_block, 5u);
  auto s = e.new_session();
  ASSERT_TRUE((*s)->prefill(tiny_tokens(50, 6)).has_value());
  const auto before = (*s)->logits();
  auto a = (*s)->dspark_block();
  ASSERT_TRUE(a.has_value()) << a.error().message;
  EXPECT_EQ(a->size(), 5u);  // confidence 0: the whole block
  for (int32_t x : *a) EXPECT_TRUE(x >= 0 && x < static_cast<int32_t>(V));
  auto b = (*s)->dspark_block();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(*a, *b);
  EXPECT_EQ((*s)->n_tokens(), 50u);
  EXPECT_TRUE(bitwise_equal((*s)->logits(), before));
  // draft(): the block's first proposal stands for the next token; the rest only follow an agreeing one.
  auto agree = (*s)->draft((*a)[0], 3);
  ASSERT_TRUE(agree.has_value());
  EXPECT_EQ(*agree, std::vector<int32_t>(a->begin() + 1, a->begin() + 4));
  auto disagree = (*s)->draft((*a)[0] == 7 ? 8 : 7, 3);
  ASSERT_TRUE(disagree.has_value());
  EXPECT_TRUE(disagree->empty());
}

TEST(Speculate, DSparkTargetFeaturesFollowVerifyAndCommit) {
  // The drafter reads the target layers' states of the last token: after a verify pass keeping a of
  // n rows they are those of plain decoding to the same token (a block depends on them bitwise).
  Engine& e = *fx().dspark_engine;
  const auto t = tiny_tokens(80, 14);
  const size_t N = 30;
  for (const auto& [n, k] : std::vector<std::pair<size_t, size_t>>{{6, 6}, {6, 2}, {5, 0}, {9, 1}}) {
    const size_t keep = k;  // (a structured binding cannot be captured before C++20 compilers caught up)
    auto plain = e.new_session();
    ASSERT_TRUE((*plain)->prefill(std::span<const int32_t>(t.data(), N + keep)).has_value());
    auto spec = e.new_session();
    ASSERT_TRUE((*spec)->prefill(std::span<const int32_t>(t.data(), N)).has_value());
    std::vector<int32_t> rows(t.begin() + static_cast<long>(N), t.begin() + static_cast<long>(N + keep));
    while (rows.size() < n) rows.push_back(300);
    auto kept = (*spec)->verify(rows, [&](std::span<const float>) { return keep; });
    ASSERT_TRUE(kept.has_value()) << kept.error().message;
    auto want = (*plain)->dspark_block();
    auto got = (*spec)->dspark_block();
    ASSERT_TRUE(want.has_value() && got.has_value());
    EXPECT_EQ(*got, *want) << "kept " << keep << " of " << n;
  }
}

TEST(Speculate, GenerateWithDSparkGivesThePlainTokens) {
  Engine& e = *fx().dspark_engine;
  const auto p = tiny_tokens(150, 8);
  for (float temp : {0.0f, 0.9f}) {
    GenerateOptions o;
    o.sampling.temperature = temp;
    o.sampling.seed = 1234;
    o.max_tokens = 80;
    o.ignore_eos = true;
    o.parse_chat = false;
    auto s1 = e.new_session();
    auto plain = generate(**s1, e.tokenizer(), p, o);
    o.draft = 4;  // Session::draft: DSpark on this engine
    auto s2 = e.new_session();
    auto spec = generate(**s2, e.tokenizer(), p, o);
    ASSERT_TRUE(plain.has_value() && spec.has_value());
    EXPECT_EQ(spec->tokens, plain->tokens) << "temperature " << temp;
  }
}

TEST(Speculate, BadDSparkFilesAreClearLoadErrors) {
  const Preset p = *find_preset("tiny");
  auto load = [&](const std::string& dspark, const std::string& mtp = "") {
    EngineOptions o;
    o.model_path = fx().model;
    o.dspark_path = dspark;
    o.mtp_path = mtp;
    o.backend = BackendChoice::CPU;
    o.ctx = 256;
    o.show_progress = false;
    auto e = Engine::load(o);
    return e ? std::string() : e.error().message;
  };
  EXPECT_NE(load(fx().mtp).find("not a DSpark support file"), std::string::npos) << load(fx().mtp);
  EXPECT_NE(load("", fx().dspark).find("load it with --dspark"), std::string::npos) << load("", fx().dspark);
  const std::string bad = fx().dir + "/bad-dspark.gguf";
  auto with_meta = [&](auto change) {
    SynthPlan plan = synth_dspark_plan(p, 5);
    change(plan.dspark_meta);
    EXPECT_TRUE(synth_write(plan, bad, 1).has_value());
    return load(bad);
  };
  std::string m = with_meta([](DSparkMeta& d) { d.target_layers = {4, 3, 5}; });
  EXPECT_NE(m.find("strictly increasing"), std::string::npos) << m;
  m = with_meta([](DSparkMeta& d) { d.target_layers = {3, 4, 9}; });
  EXPECT_NE(m.find("not a layer of the model"), std::string::npos) << m;
  m = with_meta([](DSparkMeta& d) { d.noise_token_id = 100000; });
  EXPECT_NE(m.find("outside the vocabulary"), std::string::npos) << m;
  m = with_meta([](DSparkMeta& d) { d.block_size = 0; });
  EXPECT_NE(m.find("block_size"), std::string::npos) << m;
  EXPECT_EQ(load(fx().dspark), "");
}

TEST(Speculate, VerifyItemsOfABatchedStepEqualVerifyAlone) {
  // Engine::step with verify items beside a decode row and a prompt chunk: every session ends as it
  // would alone (Session::verify / decode / prefill), bitwise, whatever each verify keeps.
  Engine& e = *fx().engine;
  const auto t = tiny_tokens(120, 21);
  std::vector<std::unique_ptr<Session>> batched, alone;
  for (int i = 0; i < 4; ++i) {
    batched.push_back(std::move(*e.new_session()));
    alone.push_back(std::move(*e.new_session()));
    const std::span<const int32_t> pre(t.data() + 7 * i, 20 + 9 * i);
    ASSERT_TRUE(batched.back()->prefill(pre).has_value());
    ASSERT_TRUE(alone.back()->prefill(pre).has_value());
  }
  const std::vector<int32_t> v0{11, 12, 13, 14, 15}, v1{21, 22, 23}, dec{31}, chunk{41, 42, 43, 44, 45, 46, 47};
  // keep() that records the logits it was given and keeps `n`.
  auto recorder = [](std::vector<float>& seen, size_t n) -> Session::KeepFn {
    return [&seen, n](std::span<const float> all) {
      seen.assign(all.begin(), all.end());
      return n;
    };
  };
  std::vector<float> seen0, seen1, all0, all1;
  const Session::KeepFn r0 = recorder(seen0, 2), r1 = recorder(seen1, 1);
  size_t kept0 = 0, kept1 = 0;
  std::vector<SessionStep> items{{batched[0].get(), v0, &r0, &kept0},
                                 {batched[1].get(), v1, &r1, &kept1},
                                 {batched[2].get(), dec, nullptr, nullptr},
                                 {batched[3].get(), chunk, nullptr, nullptr}};
  ASSERT_TRUE(e.step(items).has_value());
  EXPECT_EQ(kept0, 2u);
  EXPECT_EQ(kept1, 1u);
  ASSERT_TRUE(alone[0]->verify(v0, recorder(all0, 2)).has_value());
  ASSERT_TRUE(alone[1]->verify(v1, recorder(all1, 1)).has_value());
  ASSERT_TRUE(alone[2]->decode(dec[0]).has_value());
  ASSERT_TRUE(alone[3]->prefill(chunk).has_value());
  EXPECT_TRUE(bitwise_equal(seen0, all0));
  EXPECT_TRUE(bitwise_equal(seen1, all1));
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(batched[i]->tokens(), alone[i]->tokens()) << i;
    EXPECT_TRUE(bitwise_equal(batched[i]->logits(), alone[i]->logits())) << i;
    // And what follows (past the next ratio-4 windows, which pool the frontiers the commits rebuilt).
    for (int32_t x = 50; x < 58; ++x) {
      ASSERT_TRUE(batched[i]->decode(x).has_value());
      ASSERT_TRUE(alone[i]->decode(x).has_value());
      EXPECT_TRUE(bitwise_equal(batched[i]->logits(), alone[i]->logits())) << i << " " << x;
    }
  }
}
