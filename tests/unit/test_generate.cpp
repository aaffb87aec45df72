// The generation loop on the synthetic tiny model: determinism, session reuse,
// stop strings, limits, logprobs, cancellation.
#include <gtest/gtest.h>

#include <filesystem>

#include "generate/generate.h"
#include "synth/synth.h"

using namespace dsv4;

namespace {

struct Fixture {
  std::string dir, model;
  std::unique_ptr<Engine> engine;
  Fixture() {
    dir = (std::filesystem::temp_directory_path() / ("dsv4_gen_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    model = dir + "/tiny.gguf";
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 21), model, 2).has_value());
    EngineOptions o;
    o.model_path = model;
    o.backend = BackendChoice::CPU;
    o.ctx = 2048;
    o.show_progress = false;
    auto e = Engine::load(o);
    EXPECT_TRUE(e.has_value());
    engine = std::move(*e);
  }
  ~Fixture() { std::filesystem::remove_all(dir); }
};

Fixture& fx() {
  static Fixture f;
  return f;
}

std::vector<int32_t> prompt(const char* text) { return fx().engine->tokenizer().encode(text); }

}  // namespace

TEST(Generate, GreedyIsDeterministicAndCountsTokens) {
  auto s1 = fx().engine->new_session();
  auto s2 = fx().engine->new_session();
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 12;
  o.ignore_eos = true;
  o.parse_chat = false;
  auto p = prompt("hello world, this is a test");
  auto a = generate(**s1, fx().engine->tokenizer(), p, o);
  auto b = generate(**s2, fx().engine->tokenizer(), p, o);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->tokens, b->tokens);
  EXPECT_EQ(a->tokens.size(), 12u);
  EXPECT_EQ(a->finish, FinishReason::LENGTH);
  EXPECT_EQ(a->prompt_tokens, p.size());
  EXPECT_EQ(a->cached_tokens, 0u);
  // The session ends exactly at prompt + completion.
  EXPECT_EQ((*s1)->n_tokens(), p.size() + 12);
  EXPECT_EQ(a->message.content, a->text);
}

TEST(Generate, ReusesTheSessionPrefix) {
  auto s = fx().engine->new_session();
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 5;
  o.ignore_eos = true;
  o.parse_chat = false;
  auto p = prompt("the model is a tool");
  auto a = generate(**s, fx().engine->tokenizer(), p, o);
  ASSERT_TRUE(a.has_value());
  // Next turn: previous prompt + completion + more text.
  std::vector<int32_t> p2 = p;
  p2.insert(p2.end(), a->tokens.begin(), a->tokens.end());
  auto more = prompt(" and then");
  p2.insert(p2.end(), more.begin(), more.end());
  auto b = generate(**s, fx().engine->tokenizer(), p2, o);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->cached_tokens, p.size() + a->tokens.size());
  // A diverging prompt rewinds and matches a fresh session.
  auto p3 = prompt("the model is a cat");
  auto c = generate(**s, fx().engine->tokenizer(), p3, o);
  auto fresh = fx().engine->new_session();
  auto d = generate(**fresh, fx().engine->tokenizer(), p3, o);
  ASSERT_TRUE(c.has_value() && d.has_value());
  EXPECT_EQ(c->tokens, d->tokens);
  EXPECT_GT(c->cached_tokens, 0u);
}

TEST(Generate, StopStringsAreNotLeaked) {
  auto s = fx().engine->new_session();
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 40;
  o.ignore_eos = true;
  o.parse_chat = false;
  auto p = prompt("print the code");
  auto full = generate(**s, fx().engine->tokenizer(), p, o);
  ASSERT_TRUE(full.has_value());
  ASSERT_GE(full->text.size(), 6u);
  // Stop on a substring of what greedy decoding produces.
  std::string stop = full->text.substr(full->text.size() / 2, 3);
  o.stop = {stop};
  auto s2 = fx().engine->new_session();
  auto cut = generate(**s2, fx().engine->tokenizer(), p, o);
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->finish, FinishReason::STOP);
  EXPECT_EQ(cut->stop_string, stop);
  EXPECT_EQ(cut->message.content, full->text.substr(0, full->text.find(stop)));
  EXPECT_EQ(cut->message.content.find(stop), std::string::npos);
}

TEST(Generate, LogprobsCancelAndContextLimit) {
  auto s = fx().engine->new_session();
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 4;
  o.ignore_eos = true;
  o.parse_chat = false;
  o.logprobs = 3;
  auto p = prompt("a b c");
  auto r = generate(**s, fx().engine->tokenizer(), p, o);
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->logprobs.size(), 4u);
  for (const auto& lp : r->logprobs) {
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.token);  // greedy picks the most likely token
    EXPECT_LE(lp.logprob, 0.0f);
  }
  int polls = 0;
  GenerateCallbacks cb;
  cb.cancelled = [&] { return ++polls > 3; };
  o.max_tokens = 100;
  auto s2 = fx().engine->new_session();
  auto c = generate(**s2, fx().engine->tokenizer(), p, o, cb);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->finish, FinishReason::CANCELLED);
  EXPECT_LT(c->tokens.size(), 100u);
  // A prompt that fills the context is refused with a clear message.
  auto small = fx().engine->new_session(8);
  std::vector<int32_t> big(8, 5);
  auto e = generate(**small, fx().engine->tokenizer(), big, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("context"), std::string::npos);
  // Generation stops at the context end with "length".
  auto s3 = fx().engine->new_session(16);
  std::vector<int32_t> p16(10, 7);
  o.max_tokens = 0;
  auto l = generate(**s3, fx().engine->tokenizer(), p16, o);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->finish, FinishReason::LENGTH);
  EXPECT_EQ((*s3)->n_tokens(), 16u);
}
