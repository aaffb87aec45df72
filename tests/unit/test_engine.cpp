// Engine/Session invariants on the synthetic tiny model (CPU backend):
// chunked prefill == whole prefill, decode == prefill, save/load == live,
// rewind, errors, MTP — all bitwise on the CPU; the content identity is
// computed on demand, once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>

#include "backend/options/cuda_options.h"
#include "dsv4/engine.h"
#include "synth/synth.h"
#include "../common/odd_spec.h"
#include "../common/token_walk.h"

using namespace dsv4;
using dsv4::test::bitwise_equal;
using dsv4::test::tiny_tokens;

namespace {

std::string g_model, g_mtp;

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = std::filesystem::temp_directory_path() / ("dsv4_engine_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    g_model = (dir / "tiny.gguf").string();
    g_mtp = (dir / "tiny-mtp.gguf").string();
    Preset p = *find_preset("tiny");
    ASSERT_TRUE(synth_write(synth_plan(p, 11), g_model, 2).has_value());
    ASSERT_TRUE(synth_write(synth_mtp_plan(p, 12), g_mtp, 2).has_value());
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(std::filesystem::path(g_model).parent_path()); }

  static EngineOptions options(int batch = 512, const std::string& numerics = "reference", bool mtp = false) {
    EngineOptions o;
    o.model_path = g_model;
    o.backend = BackendChoice::CPU;
    o.ctx = 4096;
    o.numerics = *numerics_from_name(numerics);
    o.prefill_batch = batch;
    o.show_progress = false;
    if (mtp) o.mtp_path = g_mtp;
    return o;
  }
  static std::unique_ptr<Engine> load(int batch = 512, const std::string& numerics = "reference", bool mtp = false) {
    auto e = Engine::load(options(batch, numerics, mtp));
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }
};

}  // namespace

TEST_F(EngineTest, LogitsAreFiniteAndInfoIsFilled) {
  auto e = load();
  ASSERT_TRUE(e);
  EXPECT_EQ(e->info().n_vocab, 512u);
  EXPECT_NE(e->info().backend.find("cpu"), std::string::npos);
  auto s = e->new_session();
  ASSERT_TRUE(s.has_value());
  auto t = tiny_tokens(300);
  ASSERT_TRUE((*s)->prefill(t).has_value());
  const auto& lg = (*s)->logits();
  ASSERT_EQ(lg.size(), 512u);
  double sq = 0;
  for (float v : lg) {
    ASSERT_TRUE(std::isfinite(v));
    sq += double(v) * v;
  }
  EXPECT_GT(sq, 0.0);
}

TEST_F(EngineTest, ChunkedPrefillEqualsWholePrefill) {
  // 700 tokens: past the 128 window, past several ratio-128 rows, past the indexer top-k (16).
  auto t = tiny_tokens(700, 3);
  auto whole = load(1024);
  auto sw = whole->new_session();
  auto all = (*sw)->prefill_all_logits(t);
  ASSERT_TRUE(all.has_value()) << all.error().message;
  for (int batch : {1, 7, 64, 300}) {
    auto e = load(batch);
    auto s = e->new_session();
    auto got = (*s)->prefill_all_logits(t);
    ASSERT_TRUE(got.has_value());
    EXPECT_TRUE(bitwise_equal(*got, *all)) << "batch " << batch;
  }
  // Several prefill calls with ragged sizes (splitting compression windows).
  auto e = load(512);
  auto s = e->new_session();
  std::vector<float> pieces;
  size_t at = 0;
  for (size_t len : {3u, 1u, 126u, 2u, 129u, 255u, 184u}) {
    auto got = (*s)->prefill_all_logits(std::span<const int32_t>(t.data() + at, len));
    ASSERT_TRUE(got.has_value());
    pieces.insert(pieces.end(), got->begin(), got->end());
    at += len;
  }
  ASSERT_EQ(at, t.size());
  EXPECT_TRUE(bitwise_equal(pieces, *all));
}

TEST_F(EngineTest, ThreadsSizeTheBackendAndChangeNoBit) {
  // --threads gives the CPU backend its own pool of that many threads (the engine's info names it); the
  // logits do not depend on it (every output element is one thread's, in a fixed order).
  auto t = tiny_tokens(200, 4);
  std::vector<float> want;
  for (int threads : {1, 3, 2}) {
    EngineOptions o = options(64);
    o.threads = threads;
    auto e = Engine::load(o);
    ASSERT_TRUE(e.has_value()) << e.error().message;
    EXPECT_NE((*e)->info().backend.find("cpu (" + std::to_string(threads) + " threads)"), std::string::npos)
        << (*e)->info().backend;
    auto s = (*e)->new_session();
    auto got = (*s)->prefill_all_logits(t);
    ASSERT_TRUE(got.has_value());
    if (want.empty())
      want = *got;
    else
      EXPECT_TRUE(bitwise_equal(*got, want)) << threads << " threads";
  }
}

TEST_F(EngineTest, DecodeEqualsPrefill) {
  auto t = tiny_tokens(320, 5);
  auto e = load(64);
  auto s1 = e->new_session();
  auto all = (*s1)->prefill_all_logits(t);
  ASSERT_TRUE(all.has_value());
  auto s2 = e->new_session();
  const size_t V = 512;
  for (size_t i = 0; i < t.size(); ++i) {
    ASSERT_TRUE((*s2)->decode(t[i]).has_value());
    std::vector<float> want(all->begin() + static_cast<long>(i * V), all->begin() + static_cast<long>((i + 1) * V));
    ASSERT_TRUE(bitwise_equal((*s2)->logits(), want)) << "position " << i;
  }
}

TEST_F(EngineTest, SaveLoadContinueEqualsContinue) {
  auto t = tiny_tokens(400, 9);
  auto e = load(100);
  auto live = e->new_session();
  ASSERT_TRUE((*live)->prefill(std::span<const int32_t>(t.data(), 257)).has_value());
  std::vector<uint8_t> snap = (*live)->save();
  auto restored = e->new_session();
  ASSERT_TRUE((*restored)->load(snap).has_value());
  EXPECT_EQ((*restored)->tokens(), (*live)->tokens());
  EXPECT_TRUE(bitwise_equal((*restored)->logits(), (*live)->logits()));
  auto rest = std::span<const int32_t>(t.data() + 257, t.size() - 257);
  auto a = (*live)->prefill_all_logits(rest);
  auto b = (*restored)->prefill_all_logits(rest);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_TRUE(bitwise_equal(*a, *b));

  // Corrupt snapshots are rejected and leave the session usable.
  auto s3 = e->new_session();
  std::vector<uint8_t> bad = snap;
  bad[bad.size() / 2] ^= 1;
  auto st = (*s3)->load(bad);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("checksum"), std::string::npos);
  st = (*s3)->load(std::span<const uint8_t>(snap.data(), snap.size() / 3));
  ASSERT_FALSE(st.has_value());
  EXPECT_FALSE((*s3)->load(std::vector<uint8_t>{1, 2, 3}).has_value());
  EXPECT_EQ((*s3)->n_tokens(), 0u);
  // A snapshot from other numerics is refused, and one made in fast numerics loads and continues there.
  for (const char* other : {"plain", "fast"}) {
    auto o = load(100, other);
    auto s4 = o->new_session();
    st = (*s4)->load(snap);
    ASSERT_FALSE(st.has_value()) << other;
    EXPECT_NE(
        st.error().message.find("snapshot was made with reference numerics, the engine runs " + std::string(other)),
        std::string::npos)
        << st.error().message;
  }
  auto fast = load(100, "fast");
  auto f1 = fast->new_session(), f2 = fast->new_session();
  ASSERT_TRUE((*f1)->prefill(std::span<const int32_t>(t.data(), 257)).has_value());
  ASSERT_TRUE((*f2)->load((*f1)->save()).has_value());
  auto fa = (*f1)->prefill_all_logits(rest);
  auto fb = (*f2)->prefill_all_logits(rest);
  ASSERT_TRUE(fa.has_value() && fb.has_value());
  EXPECT_TRUE(bitwise_equal(*fa, *fb));
  EXPECT_FALSE(bitwise_equal(*fa, *a));  // fast is not reference
}

TEST_F(EngineTest, RewindIsExact) {
  auto t = tiny_tokens(360, 13);
  auto e = load(64);
  auto ref = e->new_session();
  auto all = (*ref)->prefill_all_logits(t);
  ASSERT_TRUE(all.has_value());
  const size_t V = 512;
  auto s = e->new_session();
  ASSERT_TRUE((*s)->prefill(std::span<const int32_t>(t.data(), 300)).has_value());  // checkpoint at 300
  for (size_t i = 300; i < 360; ++i) ASSERT_TRUE((*s)->decode(t[i]).has_value());
  for (size_t target : {350u, 301u, 300u, 299u, 130u, 1u}) {
    ASSERT_TRUE((*s)->rewind(target).has_value()) << target;
    EXPECT_EQ((*s)->n_tokens(), target);
    std::vector<float> want(all->begin() + static_cast<long>((target - 1) * V),
                            all->begin() + static_cast<long>(target * V));
    EXPECT_TRUE(bitwise_equal((*s)->logits(), want)) << "rewind to " << target;
  }
  // And continuing after a rewind matches the reference.
  ASSERT_TRUE((*s)->prefill(std::span<const int32_t>(t.data() + 1, 200)).has_value());
  std::vector<float> want(all->begin() + static_cast<long>(200 * V), all->begin() + static_cast<long>(201 * V));
  EXPECT_TRUE(bitwise_equal((*s)->logits(), want));
  EXPECT_FALSE((*s)->rewind(1000).has_value());
  (*s)->reset();
  EXPECT_EQ((*s)->n_tokens(), 0u);
}

TEST_F(EngineTest, NumericsModesDifferButAgree) {
  auto t = tiny_tokens(300, 17);
  auto r = load(512, "reference");
  auto p = load(512, "plain");
  auto sr = r->new_session();
  auto sp = p->new_session();
  ASSERT_TRUE((*sr)->prefill(t).has_value());
  ASSERT_TRUE((*sp)->prefill(t).has_value());
  EXPECT_FALSE(bitwise_equal((*sr)->logits(), (*sp)->logits()));
  double num = 0, den = 0;
  for (size_t i = 0; i < 512; ++i) {
    double d = (*sr)->logits()[i] - (*sp)->logits()[i];
    num += d * d;
    den += double((*sp)->logits()[i]) * (*sp)->logits()[i];
  }
  EXPECT_LT(num / den, 0.05) << "simulated rounding should perturb, not replace, the logits";
}

TEST_F(EngineTest, PrefillBatchZeroIsTheBackendDefault) {
  auto e = load(0);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->info().prefill_batch, default_prefill_batch(false));
  EXPECT_EQ(default_prefill_batch(false), 512);
  EXPECT_EQ(default_prefill_batch(true), 4096);
  EXPECT_EQ(load(48)->info().prefill_batch, 48);
}

TEST_F(EngineTest, BadInputGivesClearErrors) {
  auto e = load();
  auto s = e->new_session(64);
  ASSERT_TRUE(s.has_value());
  auto st = (*s)->prefill(tiny_tokens(65));
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("context overflow"), std::string::npos);
  EXPECT_EQ((*s)->n_tokens(), 0u);
  std::vector<int32_t> bad = {5, 512};
  st = (*s)->prefill(bad);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("outside the vocabulary"), std::string::npos);
  EXPECT_FALSE(e->new_session(1u << 30).has_value());
  EngineOptions o;
  o.model_path = "/nonexistent/model.gguf";
  auto missing = Engine::load(o);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("dsv4 synth --preset tiny"), std::string::npos);
  o.model_path = g_model;
  EXPECT_FALSE(backend_choice_from_name("tpu").has_value());
  EXPECT_FALSE(numerics_from_name("fp8").has_value());
  o.backend = BackendChoice::CPU;
  o.prefill_batch = -1;
  auto neg = Engine::load(o);
  ASSERT_FALSE(neg.has_value());
  EXPECT_NE(neg.error().message.find("prefill batch -1"), std::string::npos);
  // The CUDA switches are checked on any backend.
  o.prefill_batch = 0;
  CudaOptions bad_threshold;
  bad_threshold.gemm_min_tokens = 1;
  o.cuda = std::make_shared<const CudaOptions>(bad_threshold);
  auto gmt = Engine::load(o);
  ASSERT_FALSE(gmt.has_value());
  EXPECT_NE(gmt.error().message.find("--gemm-min-tokens 1"), std::string::npos) << gmt.error().message;
  CudaOptions no_library;
  no_library.cublas = CublasMode::LIBRARY;
  o.cuda = std::make_shared<const CudaOptions>(no_library);
  auto nolib = Engine::load(o);
  ASSERT_FALSE(nolib.has_value());
  EXPECT_NE(nolib.error().message.find("--cublas"), std::string::npos) << nolib.error().message;
  CudaOptions bad_share;
  bad_share.cpu_experts = 2.0f;
  o.cuda = std::make_shared<const CudaOptions>(bad_share);
  auto share = Engine::load(o);
  ASSERT_FALSE(share.has_value());
  EXPECT_NE(share.error().message.find("--cpu-experts 2"), std::string::npos) << share.error().message;
  CudaOptions valid;
  valid.cublas = CublasMode::OFF;
  valid.pdl = false;
  o.cuda = std::make_shared<const CudaOptions>(valid);
  EXPECT_TRUE(Engine::load(o).has_value());  // valid switches: the CPU backend ignores them
  // Cancellation stops between batches and keeps what was done.
  auto small = load(16);
  auto sc = small->new_session();
  int calls = 0;
  RunHooks hooks;
  hooks.cancelled = [&] { return ++calls > 2; };
  st = (*sc)->prefill(tiny_tokens(100), hooks);
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ((*sc)->n_tokens(), 32u);
}

TEST_F(EngineTest, MtpBlockRuns) {
  auto e = load(512, "reference", true);
  ASSERT_TRUE(e->info().has_mtp);
  auto s = e->new_session();
  auto none = (*s)->mtp_logits(5);
  EXPECT_FALSE(none.has_value());
  ASSERT_TRUE((*s)->prefill(tiny_tokens(50)).has_value());
  auto lg = (*s)->mtp_logits(42);
  ASSERT_TRUE(lg.has_value()) << lg.error().message;
  ASSERT_EQ(lg->size(), 512u);
  for (float v : *lg) ASSERT_TRUE(std::isfinite(v));
  auto no_mtp = load();
  auto s2 = no_mtp->new_session();
  ASSERT_TRUE((*s2)->prefill(tiny_tokens(5)).has_value());
  EXPECT_FALSE((*s2)->mtp_logits(1).has_value());
}

// --synthetic: the preset generated in memory is the same model as the file
// `dsv4 synth` writes (same identity, bitwise the same logits); a bad preset
// is a clear error.
TEST_F(EngineTest, SyntheticInMemoryEqualsTheSynthFile) {
  auto file = load();
  EngineOptions o;
  o.synthetic = "tiny";
  o.synthetic_seed = 11;  // the seed SetUpTestSuite wrote g_model with
  o.backend = BackendChoice::CPU;
  o.ctx = 4096;
  o.show_progress = false;
  auto mem = Engine::load(o);
  ASSERT_TRUE(mem.has_value()) << mem.error().message;
  EXPECT_EQ((*mem)->content_identity(), file->content_identity());
  EXPECT_EQ((*mem)->info().model_path, "synthetic:tiny");
  auto a = file->new_session(), b = (*mem)->new_session();
  ASSERT_TRUE(a.has_value() && b.has_value());
  const auto t = tiny_tokens(300, 5);
  ASSERT_TRUE((*a)->prefill(t).has_value());
  ASSERT_TRUE((*b)->prefill(t).has_value());
  EXPECT_TRUE(bitwise_equal((*a)->logits(), (*b)->logits()));
  ASSERT_TRUE((*a)->decode(7).has_value());
  ASSERT_TRUE((*b)->decode(7).has_value());
  EXPECT_TRUE(bitwise_equal((*a)->logits(), (*b)->logits()));

  o.synthetic_seed = 12;
  auto other = Engine::load(o);
  ASSERT_TRUE(other.has_value());
  EXPECT_NE((*other)->content_identity(), file->content_identity());
  o.synthetic = "no-such-preset";
  auto bad = Engine::load(o);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("no-such-preset"), std::string::npos) << bad.error().message;
}

// Loading does not read the whole model; the content identity is computed at
// the first call (logged once, whatever the number of threads asking at once)
// and memoised. The model file is reported as mapped; a synthetic model has none.
TEST_F(EngineTest, ContentIdentityIsComputedOnDemandOnce) {
  testing::internal::CaptureStderr();
  auto e = load();
  const std::string at_load = testing::internal::GetCapturedStderr();
  EXPECT_EQ(at_load.find("model identity"), std::string::npos) << at_load;
  testing::internal::CaptureStderr();
  std::vector<std::string> ids(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ids.size(); ++i) threads.emplace_back([&, i] { ids[i] = e->content_identity(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(e->content_identity(), ids[0]);
  const std::string err = testing::internal::GetCapturedStderr();
  size_t hashed = 0;
  const std::string line = "model identity: hashed";
  for (size_t at = err.find(line); at != std::string::npos; at = err.find(line, at + 1)) ++hashed;
  EXPECT_EQ(hashed, 1u) << err;
  EXPECT_EQ(ids[0].size(), 64u);
  for (const auto& id : ids) EXPECT_EQ(id, ids[0]);

  const std::optional<ModelFileStamp> f = e->model_file();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->path, std::filesystem::absolute(g_model).lexically_normal().string());
  EXPECT_EQ(f->stamp, *file_stamp_of(g_model));
  EngineOptions o;
  o.synthetic = "tiny";
  o.backend = BackendChoice::CPU;
  o.ctx = 4096;
  o.show_progress = false;
  auto mem = Engine::load(o);
  ASSERT_TRUE(mem.has_value());
  EXPECT_FALSE((*mem)->model_file().has_value());
}

// A shape transformers accepts that `reference` numerics cannot run
// (tests/common/odd_spec.h), every matrix in F32: `plain` runs it with the tiny model's invariants
// (chunked prefill and decode give the bits of one whole prefill, a restored
// snapshot continues identically); `reference` is refused by name.
TEST(EngineAnyShape, PlainRunsItAndReferenceIsRefused) {
  const ModelSpec spec = dsv4::test::odd_spec();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dsv4_engine_odd_" + std::to_string(::getpid()) + ".gguf")).string();
  ASSERT_TRUE(synth_write(synth_plan(Preset{"odd", "", spec, QuantRecipe::F32}, 21), path, 2).has_value());
  auto load = [&](const std::string& numerics, int batch) -> expected<std::unique_ptr<Engine>> {
    EngineOptions o;
    o.model_path = path;
    o.backend = BackendChoice::CPU;
    o.ctx = 1024;
    o.numerics = *numerics_from_name(numerics);
    o.prefill_batch = batch;
    o.show_progress = false;
    return Engine::load(o);
  };
  auto ref = load("reference", 64);
  ASSERT_FALSE(ref.has_value());
  const std::string refusal =
      "this model's attention has 32 non-RoPE dims per head (key_length 96 - 64 RoPE dims), not a multiple of 64, so "
      "`--numerics reference` (FP8 KV rows in 64-value blocks) cannot run it; use --numerics plain";
  EXPECT_NE(ref.error().message.find(refusal), std::string::npos) << ref.error().message;

  const auto t = tiny_tokens(600, 13);
  const size_t V = spec.n_vocab;
  auto whole = load("plain", 1024);
  ASSERT_TRUE(whole.has_value()) << whole.error().message;
  EXPECT_EQ((*whole)->info().numerics, Numerics::PLAIN);
  auto sw = (*whole)->new_session();
  auto all = (*sw)->prefill_all_logits(t);
  ASSERT_TRUE(all.has_value()) << all.error().message;
  double sq = 0;
  for (float v : *all) {
    ASSERT_TRUE(std::isfinite(v));
    sq += double(v) * v;
  }
  EXPECT_GT(sq, 0.0);

  auto chunked = load("plain", 7);
  ASSERT_TRUE(chunked.has_value());
  auto sc = (*chunked)->new_session();
  auto got = (*sc)->prefill_all_logits(t);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(bitwise_equal(*got, *all));

  auto sd = (*chunked)->new_session();
  ASSERT_TRUE((*sd)->prefill(std::span<const int32_t>(t.data(), 300)).has_value());
  const std::vector<uint8_t> snap = (*sd)->save();
  for (size_t i = 300; i < 340; ++i) {
    ASSERT_TRUE((*sd)->decode(t[i]).has_value());
    std::vector<float> want(all->begin() + static_cast<long>(i * V), all->begin() + static_cast<long>((i + 1) * V));
    ASSERT_TRUE(bitwise_equal((*sd)->logits(), want)) << "position " << i;
  }
  auto restored = (*chunked)->new_session();
  ASSERT_TRUE((*restored)->load(snap).has_value());
  auto rest = (*restored)->prefill_all_logits(std::span<const int32_t>(t.data() + 300, t.size() - 300));
  ASSERT_TRUE(rest.has_value());
  EXPECT_TRUE(bitwise_equal(*rest, std::vector<float>(all->begin() + static_cast<long>(300 * V), all->end())));
  std::filesystem::remove(path);
}

// The engine over a layer pipeline (EngineOptions::cpu_stages, what --gpus does over GPUs): the same logits as
// one backend through a prefill of several batches and decode steps, and its session snapshot continues in
// the one-backend engine; the speculation drafters are refused with the reason.
TEST_F(EngineTest, PipelineStagesGiveTheSameLogits) {
  auto one = load(100);
  EngineOptions o = options(100);
  o.cpu_stages = 3;
  auto staged = Engine::load(o);
  ASSERT_TRUE(staged.has_value()) << staged.error().message;
  Engine& e3 = **staged;
  EXPECT_NE(e3.info().backend.find(" + "), std::string::npos) << e3.info().backend;
  EXPECT_EQ(e3.info().kv_bytes_per_token, one->info().kv_bytes_per_token);
  const auto t = tiny_tokens(260, 21);
  auto a = one->new_session(), b = e3.new_session();
  ASSERT_TRUE(a.has_value() && b.has_value());
  ASSERT_TRUE((*a)->prefill(t).has_value());
  ASSERT_TRUE((*b)->prefill(t).has_value());
  EXPECT_TRUE(bitwise_equal((*a)->logits(), (*b)->logits()));
  for (int32_t tok : {7, 19, 300}) {
    ASSERT_TRUE((*a)->decode(tok).has_value());
    ASSERT_TRUE((*b)->decode(tok).has_value());
    EXPECT_TRUE(bitwise_equal((*a)->logits(), (*b)->logits()));
  }
  // A snapshot of the staged session continues in the single-backend engine.
  const std::vector<uint8_t> snap = (*b)->save();
  auto c = one->new_session();
  ASSERT_TRUE((*c)->load(snap).has_value());
  ASSERT_TRUE((*c)->decode(5).has_value());
  ASSERT_TRUE((*b)->decode(5).has_value());
  EXPECT_TRUE(bitwise_equal((*c)->logits(), (*b)->logits()));

  o.mtp_path = g_mtp;
  auto with_mtp = Engine::load(o);
  ASSERT_FALSE(with_mtp.has_value());
  EXPECT_NE(with_mtp.error().message.find("--mtp"), std::string::npos) << with_mtp.error().message;
  o.mtp_path.clear();
  o.backend = BackendChoice::AUTO;
  EXPECT_FALSE(Engine::load(o).has_value());  // cpu stages: the CPU backend only
}
