// The step batcher (continuous batching in the serving runtime): jobs on
// their own threads generate through one StepBatcher, and each produces
// exactly what it produces alone — tokens and logits bitwise on the CPU
// backend — whether it decodes beside others, prefills a long prompt in
// chunks between their decode rows, is cancelled, or fails.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../common/token_walk.h"
#include "dsv4/engine.h"
#include "generate/generate.h"
#include "runtime/step_batcher.h"
#include "tokenizer/tokenizer.h"

using namespace dsv4;
using dsv4::runtime::StepBatcher;
using dsv4::runtime::StepBatcherOptions;
using dsv4::runtime::StepRecord;
using dsv4::runtime::StepReport;
using dsv4::test::tiny_tokens;

namespace {

Engine& engine() {
  static std::unique_ptr<Engine> e = [] {
    EngineOptions o;
    o.synthetic = "tiny";
    o.backend = BackendChoice::CPU;
    o.ctx = 512;
    o.prefill_batch = 64;
    o.show_progress = false;
    auto r = Engine::load(o);
    if (!r) ADD_FAILURE() << r.error().message;
    return std::move(*r);
  }();
  return *e;
}

// One request: a prompt and how to sample it.
struct Request {
  std::vector<int32_t> prompt;
  GenerateOptions options;
};

Request request(size_t prompt_len, uint64_t seed, int max_tokens, float temperature) {
  Request r;
  r.prompt = tiny_tokens(prompt_len, seed);
  r.options.max_tokens = max_tokens;
  r.options.parse_chat = false;
  r.options.ignore_eos = true;
  r.options.sampling.temperature = temperature;
  r.options.sampling.seed = seed;
  return r;
}

struct Outcome {
  GenerateResult result;
  std::vector<float> logits;  // the session's last logits
  std::string error;
};

Outcome alone(const Request& q) {
  auto s = engine().new_session();
  EXPECT_TRUE(s.has_value());
  Outcome o;
  auto r = generate(**s, engine().tokenizer(), q.prompt, q.options);
  if (!r) {
    o.error = r.error().message;
    return o;
  }
  o.result = std::move(*r);
  o.logits = (*s)->logits();
  return o;
}

// Every request on its own thread, all through one batcher.
std::vector<Outcome> together(const std::vector<Request>& qs, StepBatcher& b,
                              const std::vector<std::function<bool()>>& cancel = {}) {
  std::vector<std::unique_ptr<Session>> sessions;
  for (size_t i = 0; i < qs.size(); ++i) {
    auto s = engine().new_session();
    EXPECT_TRUE(s.has_value());
    sessions.push_back(std::move(*s));
  }
  std::vector<Outcome> out(qs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < qs.size(); ++i)
    threads.emplace_back([&, i] {
      StepBatcher::Member member(b);
      GenerateCallbacks cb;
      if (i < cancel.size()) cb.cancelled = cancel[i];
      auto r = generate(*sessions[i], engine().tokenizer(), qs[i].prompt, qs[i].options, cb, b);
      if (!r) {
        out[i].error = r.error().message;
        return;
      }
      out[i].result = std::move(*r);
      out[i].logits = sessions[i]->logits();
    });
  for (auto& t : threads) t.join();
  return out;
}

void expect_same(const Outcome& batched, const Outcome& single, size_t i) {
  ASSERT_EQ(batched.error, single.error) << "request " << i;
  EXPECT_EQ(batched.result.tokens, single.result.tokens) << "request " << i;
  EXPECT_EQ(batched.result.finish, single.result.finish) << "request " << i;
  EXPECT_TRUE(dsv4::test::bitwise_equal(batched.logits, single.logits)) << "request " << i;
}

}  // namespace

TEST(StepBatcher, ParallelRequestsEqualEachAlone) {
  // Different prompt lengths (so different positions and compressor phases),
  // greedy and seeded sampling, different lengths of generation.
  std::vector<Request> qs = {request(5, 1, 24, 0),    request(37, 2, 30, 0.8f), request(70, 3, 12, 0),
                             request(1, 4, 40, 1.0f), request(19, 5, 33, 0.6f), request(90, 6, 20, 0)};
  StepBatcherOptions o;
  o.step_tokens = 64;
  StepBatcher b(engine(), o);
  const std::vector<Outcome> batched = together(qs, b);
  for (size_t i = 0; i < qs.size(); ++i) expect_same(batched[i], alone(qs[i]), i);
  const StepReport r = b.report();
  uint64_t multi = 0;
  for (size_t k = 1; k < r.steps_by_rows.size(); ++k) multi += r.steps_by_rows[k];
  EXPECT_GT(multi, 0u) << "no step ran more than one session";
  EXPECT_EQ(r.members, 0u);
  EXPECT_EQ(r.waiting, 0u);
  // Every prompt token and every fed sampled token went through a step.
  uint64_t fed = 0;
  for (size_t i = 0; i < qs.size(); ++i) fed += qs[i].prompt.size() + batched[i].result.tokens.size();
  EXPECT_EQ(r.decode_tokens + r.prefill_tokens, fed);
}

TEST(StepBatcher, LongPromptIsFedInChunksBetweenDecodeRows) {
  // A step budget of 8 tokens, 3 for prompt chunks beside decode rows: the
  // 150-token prompt takes many steps, and the decoding requests keep getting
  // a row in each of them.
  std::vector<Request> qs = {request(150, 7, 6, 0), request(3, 8, 40, 0), request(4, 9, 40, 0.7f)};
  StepBatcherOptions o;
  o.step_tokens = 8;
  o.shared_prefill_tokens = 3;
  StepBatcher b(engine(), o);
  const std::vector<Outcome> batched = together(qs, b);
  for (size_t i = 0; i < qs.size(); ++i) expect_same(batched[i], alone(qs[i]), i);
  const StepReport r = b.report();
  EXPECT_GE(r.steps, 150u / 8);
  EXPECT_GT(r.prefill_tokens, 0u);
}

TEST(StepBatcher, PromptChunksAreCappedWhileOtherJobsAreActive) {
  // A long prompt and two decoding jobs, all active (arrive() .. depart()): no step that decodes
  // takes more than the shared budget of prompt tokens, and the replies are those alone.
  std::vector<Request> qs = {request(200, 31, 4, 0), request(3, 32, 30, 0), request(5, 33, 30, 0)};
  std::mutex mu;
  std::vector<StepRecord> steps;
  StepBatcherOptions o;
  o.step_tokens = 16;
  o.shared_prefill_tokens = 4;
  o.on_step = [&](const StepRecord& r) {
    std::lock_guard<std::mutex> lk(mu);
    steps.push_back(r);
  };
  StepBatcher b(engine(), o);
  for (size_t i = 0; i < qs.size(); ++i) b.arrive();
  const std::vector<Outcome> batched = together(qs, b);
  for (size_t i = 0; i < qs.size(); ++i) b.depart();
  for (size_t i = 0; i < qs.size(); ++i) expect_same(batched[i], alone(qs[i]), i);
  size_t shared = 0;
  for (const StepRecord& r : steps) {
    EXPECT_LE(r.prefill_tokens, 4u) << "a step with other jobs active took a whole batch of prompt tokens";
    if (r.decode_rows > 0 && r.prefill_tokens > 0) ++shared;
  }
  EXPECT_GT(shared, 0u) << "the prompt never shared a step with the decoding jobs";
}

TEST(StepBatcher, ACancelledRequestLeavesNoTraceInTheOthers) {
  std::vector<Request> qs = {request(20, 11, 30, 0), request(25, 12, 200, 0), request(30, 13, 30, 0.9f)};
  StepBatcher b(engine(), StepBatcherOptions{});
  std::atomic<int> polls{0};
  std::vector<std::function<bool()>> cancel(3);
  cancel[1] = [&] { return ++polls > 10; };  // cancelled after a few tokens
  const std::vector<Outcome> batched = together(qs, b, cancel);
  EXPECT_EQ(batched[1].result.finish, FinishReason::CANCELLED);
  EXPECT_LT(batched[1].result.tokens.size(), 200u);
  expect_same(batched[0], alone(qs[0]), 0);
  expect_same(batched[2], alone(qs[2]), 2);
}

TEST(StepBatcher, ABadRequestFailsAloneAndTheOthersGoOn) {
  // While two requests generate, a third member keeps asking for an invalid
  // token id: the steps it shares fail, are retried item by item, and only
  // its own requests fail.
  std::vector<Request> qs = {request(10, 22, 25, 0), request(12, 23, 25, 0)};
  StepBatcher b(engine(), StepBatcherOptions{});
  auto bad = engine().new_session();
  ASSERT_TRUE(bad.has_value());
  std::atomic<bool> done{false};
  int failures = 0;
  std::thread spoiler([&] {
    StepBatcher::Member member(b);
    while (!done) {
      if (!b.prefill(**bad, std::vector<int32_t>{1, 2, -5}, {}).has_value()) ++failures;
      EXPECT_EQ((*bad)->n_tokens(), 0u);
    }
  });
  const std::vector<Outcome> batched = together(qs, b);
  done = true;
  spoiler.join();
  EXPECT_GT(failures, 0);
  for (size_t i = 0; i < qs.size(); ++i) expect_same(batched[i], alone(qs[i]), i);
  // A prompt longer than the context fails before it reaches a step.
  const std::vector<Outcome> over = together({request(600, 21, 5, 0)}, b);
  EXPECT_NE(over[0].error.find("context"), std::string::npos) << over[0].error;
}
