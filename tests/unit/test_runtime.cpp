// The serving runtime on its own (no HTTP): Runtime::run streams a job's
// events, progress and outcome; the client_gone() predicate and Job::cancel
// stop a running job; with_backend() waits for the running job; refused
// jobs come back as runtime errors; messages -> prompt checks the context.
// The backend is ScriptedBackend (scripted replies through the real
// tokenizer, parser and stop logic).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "runtime/chat_prompt.h"
#include "runtime/runtime.h"
#include "runtime/scripted_backend.h"
#include "synth/synth_vocab.h"

using namespace dsv4;
using namespace dsv4::runtime;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Tokenizer> tokenizer() {
  SynthVocab v = make_synth_vocab(1024);
  auto t = Tokenizer::from_vocab(v.tokens, v.merges, v.types);
  DSV4_ASSERT(t.has_value(), "synthetic vocabulary");
  return std::move(*t);
}

std::unique_ptr<ScriptedBackend> backend(std::string text, int token_delay_ms = 0, uint32_t ctx = 4096) {
  return std::make_unique<ScriptedBackend>(
      tokenizer(), ctx, std::vector<ScriptedReply>{ScriptedReply{"", std::move(text), token_delay_ms, 0}});
}

ChatMessage user(const std::string& text) {
  ChatMessage m;
  m.role = ChatRole::USER;
  m.content = ChatContent::from_text(text);
  return m;
}

RenderOptions chat_mode() {
  RenderOptions ro;
  ro.thinking_mode = ThinkingMode::CHAT;
  return ro;
}

std::shared_ptr<Job> chat_job(Runtime& rt, const std::string& text) {
  auto p = rt.prepare({user(text)}, chat_mode());
  EXPECT_TRUE(p.has_value());
  JobInput in;
  in.prompt = p->tokens;
  in.rendered = p->rendered;
  in.options.parse_chat = true;
  in.options.thinking = ThinkingMode::CHAT;
  return std::make_shared<Job>(std::move(in));
}

}  // namespace

TEST(Runtime, RunStreamsProgressAndEventsThenTheOutcome) {
  auto b = backend("one two three");
  std::atomic<int> done_jobs{0};
  Runtime rt(*b, 4, [&](const JobOutcome&) { ++done_jobs; });
  auto job = chat_job(rt, "hi");
  std::string text;
  uint64_t last_total = 0;
  const JobOutcome o = rt.run(
      job, [&](const DsmlEvent& e) { text += e.text; },
      [&](uint64_t done, uint64_t total) {
        EXPECT_LE(done, total);
        last_total = total;
      });
  ASSERT_FALSE(o.error.has_value()) << o.error->message;
  EXPECT_EQ(o.result.finish, FinishReason::STOP);
  EXPECT_EQ(text, "one two three");
  EXPECT_EQ(o.result.message.content, "one two three");
  EXPECT_EQ(last_total, job->input().prompt.size());  // the whole prompt was new
  EXPECT_EQ(done_jobs.load(), 1);

  // The next turn extends the session: its prompt is reused.
  auto next = chat_job(rt, "hi");
  const JobOutcome o2 = rt.run(next, {});
  EXPECT_EQ(o2.result.cached_tokens, next->input().prompt.size());
}

TEST(Runtime, ClientGonePredicateStopsTheRunningJob) {
  auto b = backend("a b c d e f g h i j k l m n o p", /*token_delay_ms=*/20);
  Runtime rt(*b, 4);
  auto job = chat_job(rt, "hi");
  std::atomic<bool> gone{false};
  job->set_client_check([&] { return gone.load(); });
  int events = 0;
  const JobOutcome o = rt.run(job, [&](const DsmlEvent&) {
    if (++events == 2) gone = true;  // the client hangs up after two tokens
  });
  job->clear_client_check();
  EXPECT_EQ(o.result.finish, FinishReason::CANCELLED);
  EXPECT_TRUE(job->cancel.load());
  EXPECT_LT(o.result.tokens.size(), 8u);
}

TEST(Runtime, WithBackendWaitsForTheRunningJob) {
  auto b = backend("a b c d e f g h", /*token_delay_ms=*/15);
  Runtime rt(*b, 4);
  auto job = chat_job(rt, "hi");
  ASSERT_EQ(rt.submit(job), Runtime::Admit::OK);
  for (int i = 0; i < 200 && !rt.busy(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(rt.busy());
  size_t seen = 0;
  rt.with_backend([&](Backend& be) { seen = be.session_tokens().size(); });
  // The job had generated its whole reply (and the end-of-sentence token) before `fn` ran.
  std::vector<DsmlEvent> ev;
  while (!job->wait(ev, 10ms)) {
  }
  EXPECT_EQ(seen, job->input().prompt.size() + job->outcome().result.tokens.size());
}

TEST(Runtime, RefusedJobsAreRuntimeErrors) {
  auto b = backend("x");
  Runtime rt(*b, 1);
  rt.shutdown(/*save_sessions=*/false);
  const JobOutcome o = rt.run(chat_job(rt, "hi"), {});
  ASSERT_TRUE(o.error.has_value());
  EXPECT_EQ(o.error->kind, RuntimeErrorKind::INTERNAL);
  EXPECT_NE(o.error->message.find("shutting down"), std::string::npos);
}

TEST(Runtime, APromptLongerThanTheContextIsAContextError) {
  auto b = backend("x", 0, /*ctx=*/64);
  Runtime rt(*b, 1);
  std::string long_text;
  for (int i = 0; i < 200; ++i) long_text += "word ";
  auto p = rt.prepare({user(long_text)}, chat_mode());
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().kind, RuntimeErrorKind::CONTEXT_LENGTH);
  EXPECT_EQ(p.error().param, "messages");
  EXPECT_NE(p.error().message.find("maximum context length is 64 tokens"), std::string::npos) << p.error().message;
  // Counting only: no limit.
  auto counted = rt.prepare({user(long_text)}, chat_mode(), /*check_context=*/false);
  ASSERT_TRUE(counted.has_value());
  EXPECT_GT(counted->tokens.size(), 64u);
  // The job runner refuses it too, when asked to run it anyway.
  JobInput in;
  in.prompt = counted->tokens;
  in.rendered = counted->rendered;
  const JobOutcome o = rt.run(std::make_shared<Job>(std::move(in)), {});
  ASSERT_TRUE(o.error.has_value());
  EXPECT_EQ(o.error->kind, RuntimeErrorKind::CONTEXT_LENGTH);
}
