// Sessions and the on-disk KV cache on the synthetic tiny model (CPU):
// save -> load -> continue == continue live (bitwise), a restart that finds a
// longer prompt's prefix, TEXT matches of sampled tokens, control-piece
// alignment, foreign models (one changed byte in the middle of a tensor is
// enough), the model identity remembered next to the cache, damaged files,
// the save policy and the resident session pool.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "runtime/save_policy.h"
#include "runtime/session_cache.h"
#include "../common/token_walk.h"
#include "runtime/session_pool.h"
#include "generate/generate.h"
#include "kv_test_util.h"
#include "synth/synth.h"

using namespace dsv4;
using dsv4::test::bitwise_equal;
using dsv4::test::tiny_tokens;
using namespace dsv4::runtime;
using kvtest::TempDir;

namespace {

struct Models {
  std::string dir, seed11, seed12, f32;
  Models() {
    dir = (std::filesystem::temp_directory_path() / ("dsv4_sc_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    seed11 = dir + "/tiny11.gguf";
    seed12 = dir + "/tiny12.gguf";
    f32 = dir + "/tiny-f32.gguf";
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 11), seed11, 2).has_value());
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny"), 12), seed12, 2).has_value());
    EXPECT_TRUE(synth_write(synth_plan(*find_preset("tiny-f32"), 11), f32, 2).has_value());
  }
  ~Models() { std::filesystem::remove_all(dir); }
};

Models& models() {
  static Models m;
  return m;
}

std::unique_ptr<Engine> load(const std::string& path, const std::string& numerics = "reference") {
  EngineOptions o;
  o.model_path = path;
  o.backend = BackendChoice::CPU;
  o.ctx = 4096;
  o.numerics = *numerics_from_name(numerics);
  o.prefill_batch = 128;
  o.show_progress = false;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
  return e ? std::move(*e) : nullptr;
}

Engine& engine() {
  static std::unique_ptr<Engine> e = load(models().seed11);
  return *e;
}

std::unique_ptr<DiskCache> open_cache(const std::string& dir, const Engine& e, uint64_t budget = uint64_t{1} << 30) {
  DiskCacheOptions o;
  o.dir = dir;
  o.budget_bytes = budget;
  auto c = DiskCache::open(o, cache_identity(e));
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

std::unique_ptr<Session> new_session(Engine& e) {
  auto s = e.new_session();
  EXPECT_TRUE(s.has_value());
  return std::move(*s);
}

TextPiece ctl(std::string_view s) { return TextPiece{std::string(s), true}; }
TextPiece txt(std::string s) { return TextPiece{std::move(s), false}; }

std::string long_text(const char* words, int repeat) {
  std::string s;
  for (int i = 0; i < repeat; ++i) s += std::string(words) + " " + std::to_string(i) + ".\n";
  return s;
}

// BOS system User user Assistant </think>: a chat-mode first turn.
RenderedPrompt first_turn(const std::string& system, const std::string& user) {
  return {ctl(k_token_bos), txt(system), ctl(k_token_user), txt(user), ctl(k_token_assistant), ctl(k_token_think_end)};
}

std::vector<int32_t> encode(const RenderedPrompt& p) {
  auto t = engine().tokenizer().encode_prompt(p);
  EXPECT_TRUE(t.has_value()) << (t ? "" : t.error().message);
  return t ? *t : std::vector<int32_t>{};
}

GenerateOptions greedy(int n) {
  GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = n;
  o.ignore_eos = true;
  o.parse_chat = false;
  return o;
}

}  // namespace

TEST(SessionCache, SaveLoadContinueEqualsContinueLive) {
  TempDir tmp("roundtrip");
  auto t = tiny_tokens(700, 9);
  auto live = new_session(engine());
  ASSERT_TRUE(live->prefill(std::span<const int32_t>(t.data(), 400)).has_value());
  {
    auto cache = open_cache(tmp.path, engine());
    CacheSave s;
    s.reason = SaveReason::EXPLICIT;
    auto r = cache_save(*cache, engine().tokenizer(), *live, s);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(r->outcome, StoreOutcome::WRITTEN);
    // Saving the same state again costs no serialisation and no file.
    auto again = cache_save(*cache, engine().tokenizer(), *live, s);
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->outcome, StoreOutcome::ALREADY_PRESENT);
  }
  // A new store (a restarted server) restores into a new session.
  auto cache = open_cache(tmp.path, engine());
  auto restored = new_session(engine());
  CacheQuery q;
  q.tokens = t;
  auto hit = cache_restore(*cache, engine().tokenizer(), *restored, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_TRUE(hit->by_tokens);
  EXPECT_EQ(hit->cached_tokens, 400u);
  EXPECT_EQ(hit->prompt, t);
  EXPECT_EQ(hit->reason, SaveReason::EXPLICIT);
  EXPECT_EQ(restored->tokens(), live->tokens());
  EXPECT_TRUE(bitwise_equal(restored->logits(), live->logits()));
  auto rest = std::span<const int32_t>(t.data() + 400, 300);
  auto a = live->prefill_all_logits(rest);
  auto b = restored->prefill_all_logits(rest);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_TRUE(bitwise_equal(*a, *b));
  EXPECT_EQ(cache->stats().hits, 1u);
  auto es = cache->entries();
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].usage.hits, 1u);
  // A prompt that diverges inside the cached prefix, or is too short for it, misses.
  auto other = t;
  other[200] = other[200] == 5 ? 6 : 5;
  auto s2 = new_session(engine());
  q.tokens = other;
  EXPECT_FALSE(cache_restore(*cache, engine().tokenizer(), *s2, q).has_value());
  EXPECT_EQ(s2->n_tokens(), 0u);
  EXPECT_EQ(cache->stats().misses, 1u);
  // A session whose context cannot hold the entry plus one token misses.
  auto tiny_ctx = engine().new_session(400);
  ASSERT_TRUE(tiny_ctx.has_value());
  q.tokens = t;
  EXPECT_FALSE(cache_restore(*cache, engine().tokenizer(), **tiny_ctx, q).has_value());
}

TEST(SessionCache, RestartServesTheColdPrefixAndPrefillsOnlyTheSuffix) {
  TempDir tmp("restart");
  SavePolicy policy;
  policy.min_tokens = 64;
  policy.align = 128;
  policy.margin = 8;
  const std::string system = long_text("You are a careful coding assistant with many tools", 20);
  RenderedPrompt p = first_turn(system, "fix the bug in main.c");
  std::vector<int32_t> prompt = encode(p);
  const size_t cold = cold_store_length(prompt, engine().tokenizer(), policy);
  // The anchor: everything before the <｜User｜> of the first turn.
  ASSERT_GT(cold, 64u);
  EXPECT_EQ(prompt[cold], engine().tokenizer().user());
  std::vector<int32_t> first_reply;
  {
    // First server: prefill up to the cold length, save, prefill the rest, generate.
    auto cache = open_cache(tmp.path, engine());
    auto s = new_session(engine());
    ASSERT_TRUE(s->prefill(std::span<const int32_t>(prompt.data(), cold)).has_value());
    CacheSave save;
    save.reason = SaveReason::COLD;
    auto w = cache_save(*cache, engine().tokenizer(), *s, save);
    ASSERT_TRUE(w.has_value());
    ASSERT_EQ(w->outcome, StoreOutcome::WRITTEN);
    auto r = generate(*s, engine().tokenizer(), prompt, greedy(6));
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->cached_tokens, cold);
    first_reply = r->tokens;
  }
  // Restart: a new engine, a new store; the same long prompt arrives again.
  auto engine2 = load(models().seed11);
  auto cache = open_cache(tmp.path, *engine2);
  auto s = new_session(*engine2);
  CacheQuery q;
  q.tokens = prompt;
  q.rendered = &p;
  auto hit = cache_restore(*cache, engine2->tokenizer(), *s, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->cached_tokens, cold);
  EXPECT_EQ(hit->reason, SaveReason::COLD);
  EXPECT_TRUE(hit->by_tokens);
  size_t prefilled = 0;
  GenerateCallbacks cb;
  cb.on_prefill_progress = [&](uint64_t, uint64_t total) { prefilled = total; };
  auto r = generate(*s, engine2->tokenizer(), hit->prompt, greedy(6), cb);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->cached_tokens, cold);           // usage: prompt_tokens_details.cached_tokens
  EXPECT_EQ(prefilled, prompt.size() - cold);  // only the suffix was prefilled
  EXPECT_EQ(r->tokens, first_reply);           // and the model continues exactly as before
  // A different conversation of the same agent shares the system prompt: it hits too.
  RenderedPrompt p2 = first_turn(system, "write tests for parser.c");
  auto prompt2 = encode(p2);
  auto s2 = new_session(*engine2);
  q.tokens = prompt2;
  q.rendered = &p2;
  hit = cache_restore(*cache, engine2->tokenizer(), *s2, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->cached_tokens, cold);
}

TEST(SessionCache, TextMatchReusesSampledTokens) {
  // A conversation saved with the tokens the model sampled; the client sends it
  // back re-rendered, which tokenizes the reply differently. The TEXT rule still
  // reuses every saved token and tokenizes only the new suffix.
  TempDir tmp("text");
  const Tokenizer& tok = engine().tokenizer();
  RenderedPrompt p1 = first_turn(long_text("hello world, you help with code", 8), "print the model");
  auto prompt1 = encode(p1);
  const std::string reply = " hello world, the code is in the model";
  std::vector<int32_t> sampled;  // one byte token per byte: not the canonical tokenization
  for (unsigned char c : reply) {
    std::string b(1, static_cast<char>(c));
    auto ids = tok.encode(b);
    ASSERT_EQ(ids.size(), 1u);
    sampled.push_back(ids[0]);
  }
  ASSERT_NE(tok.encode(reply), sampled);
  auto live = new_session(engine());
  ASSERT_TRUE(live->prefill(prompt1).has_value());
  ASSERT_TRUE(live->prefill(sampled).has_value());
  ASSERT_TRUE(live->decode(tok.eos()).has_value());
  auto cache = open_cache(tmp.path, engine());
  CacheSave save;
  save.reason = SaveReason::DISPLACED;
  ASSERT_TRUE(cache_save(*cache, tok, *live, save).has_value());

  RenderedPrompt p2 = p1;
  for (TextPiece piece : {txt(reply), ctl(k_token_eos), ctl(k_token_user), txt("and now the tests"),
                          ctl(k_token_assistant), ctl(k_token_think_end)})
    p2.push_back(piece);
  auto canonical2 = encode(p2);
  auto s = new_session(engine());
  CacheQuery q;
  q.tokens = canonical2;
  q.rendered = &p2;
  auto hit = cache_restore(*cache, tok, *s, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_FALSE(hit->by_tokens);
  EXPECT_EQ(hit->cached_tokens, live->n_tokens());
  EXPECT_EQ(hit->text_bytes, tok.decode(live->tokens()).size());
  ASSERT_GT(hit->prompt.size(), hit->cached_tokens);
  EXPECT_TRUE(std::equal(live->tokens().begin(), live->tokens().end(), hit->prompt.begin()));
  auto rest = std::span<const int32_t>(hit->prompt).subspan(hit->cached_tokens);
  auto want = encode(*rendered_from(p2, hit->text_bytes));
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), want.begin(), want.end()));
  auto a = live->prefill_all_logits(rest);
  auto b = s->prefill_all_logits(rest);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_TRUE(bitwise_equal(*a, *b));
  // Without the rendered prompt (tokens only) the sampled entry is not found.
  auto s3 = new_session(engine());
  q.rendered = nullptr;
  EXPECT_FALSE(cache_restore(*cache, tok, *s3, q).has_value());
}

TEST(SessionCache, ControlPiecesMustAlign) {
  TempDir tmp("align");
  const Tokenizer& tok = engine().tokenizer();
  auto cache = open_cache(tmp.path, engine());
  const std::string sys = long_text("the tool can call the model", 6);
  // Stored: the client's text spelled "<｜User｜>" as plain text (BPE tokens, no control token).
  RenderedPrompt forged = {ctl(k_token_bos), txt(sys + std::string(k_token_user) + "hi")};
  auto forged_tokens = encode(forged);
  auto s = new_session(engine());
  ASSERT_TRUE(s->prefill(forged_tokens).has_value());
  ASSERT_TRUE(cache_save(*cache, tok, *s, CacheSave{}).has_value());
  // Requested: the same bytes, but with a real control piece there.
  RenderedPrompt real = {ctl(k_token_bos), txt(sys), ctl(k_token_user), txt("hi there"), ctl(k_token_assistant)};
  ASSERT_EQ(rendered_text(real).substr(0, rendered_text(forged).size()), rendered_text(forged));
  auto real_tokens = encode(real);
  auto fresh = new_session(engine());
  CacheQuery q;
  q.tokens = real_tokens;
  q.rendered = &real;
  EXPECT_FALSE(cache_restore(*cache, tok, *fresh, q).has_value());
  EXPECT_EQ(fresh->n_tokens(), 0u);
  EXPECT_FALSE(spelled_prefix_bytes(tok, forged_tokens, real).has_value());
  // And the reverse: a cached control token never serves text that only spells it.
  auto s2 = new_session(engine());
  auto real_prefix = encode({ctl(k_token_bos), txt(sys), ctl(k_token_user), txt("hi")});
  ASSERT_TRUE(s2->prefill(real_prefix).has_value());
  ASSERT_TRUE(cache_save(*cache, tok, *s2, CacheSave{}).has_value());
  RenderedPrompt spelled = {ctl(k_token_bos), txt(sys + std::string(k_token_user) + "hi there")};
  auto spelled_tokens = encode(spelled);
  q.tokens = spelled_tokens;
  q.rendered = &spelled;
  EXPECT_FALSE(cache_restore(*cache, tok, *fresh, q).has_value());
  // The aligned request finds the aligned entry.
  q.tokens = real_tokens;
  q.rendered = &real;
  auto hit = cache_restore(*cache, tok, *fresh, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->cached_tokens, real_prefix.size());
  // rendered_from cuts text pieces, refuses control pieces.
  auto tail = rendered_from(real, 1);
  EXPECT_FALSE(tail.has_value());  // inside the BOS marker
  tail = rendered_from(real, k_token_bos.size() + 3);
  ASSERT_TRUE(tail.has_value());
  EXPECT_EQ((*tail)[0].text, sys.substr(3));
  EXPECT_FALSE((*tail)[0].control);
  EXPECT_FALSE(rendered_from(real, rendered_text(real).size() + 1).has_value());
  EXPECT_TRUE(rendered_from(real, rendered_text(real).size())->empty());
}

TEST(SessionCache, ForeignModelsAreRejected) {
  TempDir tmp("foreign");
  auto t = tiny_tokens(120, 4);
  {
    auto cache = open_cache(tmp.path, engine());
    auto s = new_session(engine());
    ASSERT_TRUE(s->prefill(t).has_value());
    ASSERT_TRUE(cache_save(*cache, engine().tokenizer(), *s, CacheSave{}).has_value());
  }
  // Same shape and quant mix, other weights: same layout fingerprint, other identity.
  auto other = load(models().seed12);
  EXPECT_EQ(other->info().fingerprint, engine().info().fingerprint);
  EXPECT_NE(other->content_identity(), engine().content_identity());
  EXPECT_EQ(other->content_identity().size(), 64u);
  auto f32 = load(models().f32);
  EXPECT_NE(f32->info().fingerprint, engine().info().fingerprint);
  EXPECT_EQ(cache_identity(*f32).expert_gate_up_type, 0u);  // F32
  EXPECT_EQ(cache_identity(engine()).routed_bits, 2u);
  auto plain = load(models().seed11, "plain");
  EXPECT_FALSE(cache_identity(*plain) == cache_identity(engine()));
  for (Engine* e : {other.get(), f32.get(), plain.get()}) {
    // Re-create the file, then open the directory as the other engine: removed at once.
    {
      auto cache = open_cache(tmp.path, engine());
      auto s = new_session(engine());
      ASSERT_TRUE(s->prefill(t).has_value());
      ASSERT_TRUE(cache_save(*cache, engine().tokenizer(), *s, CacheSave{}).has_value());
      ASSERT_EQ(cache->entries().size(), 1u);
    }
    auto cache = open_cache(tmp.path, *e);
    EXPECT_EQ(cache->stats().rejected, 1u);
    EXPECT_TRUE(cache->entries().empty());
    EXPECT_TRUE(std::filesystem::is_empty(tmp.path));
    auto s = new_session(*e);
    CacheQuery q;
    q.tokens = t;
    EXPECT_FALSE(cache_restore(*cache, e->tokenizer(), *s, q).has_value());
  }
}

TEST(SessionCache, AModelDifferingInOneMiddleByteIsForeign) {
  TempDir tmp("middle");
  const std::string flipped = models().dir + "/tiny11-flipped.gguf";
  ASSERT_TRUE(kvtest::write_flipped_copy(models().seed11, flipped));
  auto other = load(flipped);
  EXPECT_EQ(other->info().fingerprint, engine().info().fingerprint);
  EXPECT_FALSE(cache_identity(*other) == cache_identity(engine()));
  auto t = tiny_tokens(120, 8);
  {
    auto cache = open_cache(tmp.path, engine());
    auto s = new_session(engine());
    ASSERT_TRUE(s->prefill(t).has_value());
    ASSERT_TRUE(cache_save(*cache, engine().tokenizer(), *s, CacheSave{}).has_value());
  }
  testing::internal::CaptureStderr();
  auto cache = open_cache(tmp.path, *other);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("foreign model"), std::string::npos) << err;
  EXPECT_EQ(cache->stats().rejected, 1u);
  EXPECT_TRUE(cache->entries().empty());
  auto s = new_session(*other);
  CacheQuery q;
  q.tokens = t;
  EXPECT_FALSE(cache_restore(*cache, other->tokenizer(), *s, q).has_value());
  EXPECT_TRUE(s->tokens().empty());
}

// The content identity is kept in the cache directory's model-identity.v1,
// keyed by the model file's path and stamp: a restart reads no model byte; a
// touched or resized file, a garbage store, or an entry for another path
// means hashing again.
TEST(SessionCache, ModelIdentityIsRememberedNextToTheCache) {
  TempDir tmp("remembered");
  TempDir own("remembered_model");  // a copy of the model to touch and extend
  std::filesystem::create_directories(own.path);
  const std::string path = own.file("tiny.gguf");
  std::filesystem::copy_file(models().seed11, path);
  const std::string store_file = tmp.file(ModelIdentityStore::k_file_name);
  std::string err;
  auto open_as = [&](const Engine& e) {
    std::optional<ResolvedIdentity> r;
    DiskCacheOptions o;
    o.dir = tmp.path;
    testing::internal::CaptureStderr();
    auto c = DiskCache::open(o, [&](ModelIdentityStore& s) {
      r = cache_identity(e, s);
      return r->identity;
    });
    err = testing::internal::GetCapturedStderr();
    EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
    EXPECT_TRUE(r.has_value());
    return r.value_or(ResolvedIdentity{});
  };
  auto first_engine = load(path);
  const ResolvedIdentity first = open_as(*first_engine);
  EXPECT_EQ(first.origin, IdentityOrigin::COMPUTED);
  EXPECT_NE(err.find("model identity: hashed"), std::string::npos) << err;
  EXPECT_EQ(digest_hex(first.identity.model), first_engine->content_identity());
  EXPECT_TRUE(first.identity == cache_identity(engine()));  // the same bytes as seed11
  EXPECT_TRUE(std::filesystem::exists(store_file));
  // A restart: a new engine of the unchanged file, no byte of it hashed.
  const ResolvedIdentity again = open_as(*load(path));
  EXPECT_EQ(again.origin, IdentityOrigin::REMEMBERED);
  EXPECT_TRUE(again.identity == first.identity);
  EXPECT_NE(err.find("model identity from cache"), std::string::npos) << err;
  EXPECT_EQ(err.find("model identity: hashed"), std::string::npos) << err;
  // Touched (another mtime): hashed again, then remembered under the new stamp.
  const timespec times[2] = {{0, UTIME_OMIT}, {1600000000, 5}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  const ResolvedIdentity touched = open_as(*load(path));
  EXPECT_EQ(touched.origin, IdentityOrigin::COMPUTED);
  EXPECT_TRUE(touched.identity == first.identity);
  EXPECT_EQ(open_as(*load(path)).origin, IdentityOrigin::REMEMBERED);
  // One byte more at the end (the GGUF reader ignores trailing bytes): hashed, another identity.
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out.put('\0');
  }
  const ResolvedIdentity longer = open_as(*load(path));
  EXPECT_EQ(longer.origin, IdentityOrigin::COMPUTED);
  EXPECT_FALSE(longer.identity == first.identity);
  EXPECT_EQ(open_as(*load(path)).origin, IdentityOrigin::REMEMBERED);
  // Garbage in the store: ignored with a warning, the identity hashed, the store rewritten.
  kvtest::write_bytes(store_file, std::vector<uint8_t>(3000, 0xee));
  ::chmod(store_file.c_str(), 0600);
  const ResolvedIdentity after_garbage = open_as(*load(path));
  EXPECT_EQ(after_garbage.origin, IdentityOrigin::COMPUTED);
  EXPECT_TRUE(after_garbage.identity == longer.identity);
  EXPECT_NE(err.find("ignoring"), std::string::npos) << err;
  const auto rewritten = kvtest::read_bytes(store_file);
  EXPECT_EQ(std::string(rewritten.begin(), rewritten.end()).rfind(ModelIdentityStore::k_first_line, 0), 0u);
  EXPECT_EQ(open_as(*load(path)).origin, IdentityOrigin::REMEMBERED);
  // The file's exact stamp under another path, with a forged identity: not used.
  std::filesystem::remove(store_file);
  {
    int fd = ::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    Digest forged;
    forged.fill(0x5a);
    const ModelFileKey elsewhere{"/elsewhere/tiny.gguf", *file_stamp_of(path)};
    ASSERT_TRUE(ModelIdentityStore(fd, tmp.path).remember(elsewhere, forged).has_value());
    ::close(fd);
  }
  const ResolvedIdentity other_path = open_as(*load(path));
  EXPECT_EQ(other_path.origin, IdentityOrigin::COMPUTED);
  EXPECT_TRUE(other_path.identity == longer.identity);
  // A synthetic model has no file: computed from its bytes (those of the seed-11 file), nothing remembered for it.
  const auto before = kvtest::read_bytes(store_file);
  EngineOptions o;
  o.synthetic = "tiny";
  o.synthetic_seed = 11;
  o.backend = BackendChoice::CPU;
  o.show_progress = false;
  auto synthetic = Engine::load(o);
  ASSERT_TRUE(synthetic.has_value());
  const ResolvedIdentity mem = open_as(**synthetic);
  EXPECT_EQ(mem.origin, IdentityOrigin::COMPUTED);
  EXPECT_TRUE(mem.identity == first.identity);
  EXPECT_EQ(kvtest::read_bytes(store_file), before);
}

TEST(SessionCache, DamagedFilesNeverTouchTheSession) {
  TempDir tmp("damaged");
  const Tokenizer& tok = engine().tokenizer();
  auto t = tiny_tokens(300, 6);
  auto cache = open_cache(tmp.path, engine());
  auto writer = new_session(engine());
  ASSERT_TRUE(writer->prefill(std::span<const int32_t>(t.data(), 200)).has_value());
  auto w = cache_save(*cache, tok, *writer, CacheSave{});
  ASSERT_TRUE(w.has_value());
  const std::string path = tmp.path + "/" + w->name;
  const auto good = kvtest::read_bytes(path);
  // A session that already holds a different timeline.
  auto s = new_session(engine());
  auto mine = tiny_tokens(50, 7);
  ASSERT_TRUE(s->prefill(mine).has_value());
  const auto logits = s->logits();
  CacheQuery q;
  q.tokens = t;
  q.min_tokens = 1;
  // One bit flipped in each region of the file; each time the file is removed and the session untouched.
  const KvHeader h = kv_parse_file(good)->header;
  for (size_t off : {size_t{40}, size_t{300}, static_cast<size_t>(h.tokens_offset() + 8),
                     static_cast<size_t>(h.payload_offset() + 1000), static_cast<size_t>(h.checksum_offset() + 5)}) {
    auto bad = good;
    bad[off] ^= 2;
    kvtest::write_bytes(path, bad);
    EXPECT_FALSE(cache_restore(*cache, tok, *s, q).has_value()) << off;
    EXPECT_EQ(s->tokens(), mine);
    EXPECT_TRUE(bitwise_equal(s->logits(), logits));
    EXPECT_FALSE(std::filesystem::exists(path)) << off;
  }
  // A file the format accepts but the engine does not (a payload that is only a snapshot header):
  // removed when the engine refuses it, the session untouched.
  auto fake = kvtest::fake_snapshot(200, 0, 4000);
  KvFileContent c;
  c.identity = cache_identity(engine());
  c.ctx = 4096;
  c.created = 1;
  const std::string key = tok.decode(std::vector<int32_t>(t.begin(), t.begin() + 200));
  c.text = key;
  c.tokens = std::span<const int32_t>(t.data(), 200);
  c.payload = fake;
  kvtest::write_bytes(path, kv_build_image(c, KvUsage{}));
  const uint64_t rejected = cache->stats().rejected;
  EXPECT_FALSE(cache_restore(*cache, tok, *s, q).has_value());
  EXPECT_EQ(s->tokens(), mine);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(cache->stats().rejected, rejected + 1);
  // The intact file works again afterwards.
  kvtest::write_bytes(path, good);
  auto hit = cache_restore(*cache, tok, *s, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->cached_tokens, 200u);
}

TEST(SavePolicy, ColdStoreLength) {
  const Tokenizer& tok = engine().tokenizer();
  SavePolicy p;
  p.min_tokens = 64;
  p.align = 128;
  p.margin = 8;
  // 1. The anchor: a long system prompt before the first user turn.
  RenderedPrompt agent = first_turn(long_text("you can call the tool with the name", 20), "hello");
  auto a = encode(agent);
  size_t s = cold_store_length(a, tok, p);
  ASSERT_GE(s, 64u);
  EXPECT_EQ(a[s], tok.user());
  // With history: still the last <｜User｜> before the first <｜Assistant｜>.
  RenderedPrompt hist = agent;
  hist.pop_back();
  for (TextPiece piece : {ctl(k_token_think_end), txt("ok"), ctl(k_token_eos), ctl(k_token_user), txt("more"),
                          ctl(k_token_assistant), ctl(k_token_think_end)})
    hist.push_back(piece);
  EXPECT_EQ(cold_store_length(encode(hist), tok, p), s);
  // 2. A short system prompt and one long message: aligned, `margin` before the end of the text.
  RenderedPrompt doc = first_turn("be brief", long_text("the model and the code of the world", 40));
  auto d = encode(doc);
  s = cold_store_length(d, tok, p);
  size_t text_end = d.size() - 2;  // <｜Assistant｜></think> follow the text
  EXPECT_EQ(s % 128, 0u);
  EXPECT_LE(s, text_end - 8);
  EXPECT_GT(s + 128, text_end - 8);
  // ... and stable: appending to the message keeps the stored tokens (no retokenisation across the boundary).
  RenderedPrompt doc2 =
      first_turn("be brief", long_text("the model and the code of the world", 40) + " and one more thing");
  auto d2 = encode(doc2);
  EXPECT_TRUE(std::equal(d.begin(), d.begin() + static_cast<long>(s), d2.begin()));
  // 3. Too short for 2: right after the last <｜Assistant｜>.
  p.align = 4096;
  s = cold_store_length(d, tok, p);
  EXPECT_EQ(s, d.size() - 1);
  EXPECT_EQ(d[s - 1], tok.assistant());
  // 4. Too short for anything.
  p.min_tokens = d.size() + 1;
  EXPECT_EQ(cold_store_length(d, tok, p), 0u);
  p.min_tokens = 64;
  EXPECT_EQ(cold_store_length(std::vector<int32_t>(10, 5), tok, p), 0u);
  // No chat markers at all (a raw completion): the aligned rule alone.
  p.align = 128;
  auto raw = tiny_tokens(1000, 3);
  for (auto& v : raw)
    if (tok.is_special(v)) v = 100;
  EXPECT_EQ(cold_store_length(raw, tok, p), (1000 - 8) / 128 * 128);
}

TEST(SavePolicy, Frontiers) {
  SavePolicy p;  // 512 / 2048 / 32 / 10240
  EXPECT_FALSE(frontier_due(0, 0, p));
  EXPECT_TRUE(frontier_due(10240, 0, p));
  EXPECT_FALSE(frontier_due(10240, 10240, p));
  EXPECT_FALSE(frontier_due(10241, 0, p));
  EXPECT_TRUE(frontier_due(20480, 10240, p));
  EXPECT_EQ(prefill_save_points(0, 25000, 3000, 0, p), (std::vector<size_t>{3000, 10240, 20480}));
  EXPECT_EQ(prefill_save_points(12000, 25000, 3000, 10240, p), (std::vector<size_t>{20480}));
  EXPECT_EQ(prefill_save_points(0, 20480, 0, 0, p), (std::vector<size_t>{10240, 20480}));
  EXPECT_EQ(prefill_save_points(0, 25000, 10240, 0, p), (std::vector<size_t>{10240, 20480}));
  EXPECT_EQ(prefill_save_points(0, 5000, 300, 0, p), std::vector<size_t>{});  // below min_tokens
  EXPECT_EQ(prefill_save_points(500, 400, 450, 0, p), std::vector<size_t>{});
  p.frontier = 0;
  EXPECT_EQ(prefill_save_points(0, 25000, 3000, 0, p), std::vector<size_t>{3000});
  EXPECT_TRUE(worth_saving(512, SavePolicy{}));
  EXPECT_FALSE(worth_saving(511, SavePolicy{}));
}

TEST(SessionPool, TwoAlternatingConversationsBothHit) {
  // Two agents share a system prompt and alternate requests. With two resident
  // sessions, every turn after the first reuses all of its own conversation.
  const Tokenizer& tok = engine().tokenizer();
  const std::string sys = long_text("you are the tool model", 6);
  std::vector<int32_t> conv[2];
  conv[0] = encode(first_turn(sys, "hello from agent one"));
  conv[1] = encode(first_turn(sys, "hello from agent two"));
  SessionPool pool(engine(), SessionPoolOptions{2, 0, nullptr});
  std::vector<size_t> slot(2);
  for (int turn = 0; turn < 3; ++turn) {
    for (int a = 0; a < 2; ++a) {
      auto lease = pool.acquire(conv[a]);
      ASSERT_TRUE(lease.has_value());
      if (turn == 0) {
        EXPECT_EQ(lease->pick, PoolPick::NEW) << "agent " << a;
        slot[a] = lease->slot;
      } else {
        EXPECT_EQ(lease->pick, PoolPick::EXTENDS) << "turn " << turn << " agent " << a;
        EXPECT_EQ(lease->slot, slot[a]);
      }
      const size_t had = lease->session->n_tokens();
      auto r = generate(*lease->session, tok, conv[a], greedy(3));
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->cached_tokens, lease->reused);
      if (turn > 0) {
        EXPECT_EQ(r->cached_tokens, had);  // the whole previous turn
      }
      // The next request: this prompt + the reply + a new user turn.
      conv[a].insert(conv[a].end(), r->tokens.begin(), r->tokens.end());
      auto more = encode({ctl(k_token_user), txt("next " + std::to_string(turn)), ctl(k_token_assistant)});
      conv[a].insert(conv[a].end(), more.begin(), more.end());
      pool.release(lease->slot);
    }
  }
  EXPECT_EQ(pool.size(), 2u);
  EXPECT_NE(slot[0], slot[1]);
  // A retry of agent 0's last request (same prompt, different completion wanted): REGENERATES.
  auto& s0 = pool.session(slot[0]);
  std::vector<int32_t> retry(s0.tokens().begin(), s0.tokens().end() - 3);  // the last prompt
  auto lease = pool.acquire(retry);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->pick, PoolPick::REGENERATES);
  EXPECT_EQ(lease->slot, slot[0]);
  pool.release(lease->slot);
  // for_each: most recently used first.
  std::vector<Session*> order;
  pool.for_each([&](Session& s) { order.push_back(&s); });
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], &pool.session(slot[0]));
}

TEST(SessionPool, NoRoomForAnotherSessionKeepsTheLiveOnes) {
  // --sessions 3, but the backend has room for one session only (the second
  // new_session fails, as it does on a full GPU): the request that wanted a new
  // session displaces the live one instead of failing, and the pool keeps one.
  const Tokenizer& tok = engine().tokenizer();
  int made = 0;
  std::vector<Session*> displaced;
  SessionPoolOptions o{3, 0, [&](Session& s) { displaced.push_back(&s); }};
  o.make_session = [&](uint32_t ctx) -> expected<std::unique_ptr<Session>> {
    if (made++ >= 1) return make_error("not enough GPU memory for a session (test)");
    return engine().new_session(ctx);
  };
  SessionPool pool(engine(), o);
  const std::vector<int32_t> a = encode(first_turn("system a", "hello from agent one"));
  const std::vector<int32_t> b = encode(first_turn("another system prompt", "hello from agent two"));
  auto first = pool.acquire(a);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->pick, PoolPick::NEW);
  ASSERT_TRUE(generate(*first->session, tok, a, greedy(2)).has_value());
  pool.release(first->slot);
  auto second = pool.acquire(b);
  ASSERT_TRUE(second.has_value()) << second.error().message;
  EXPECT_EQ(second->pick, PoolPick::DISPLACED);
  EXPECT_EQ(second->slot, first->slot);
  EXPECT_EQ(displaced.size(), 1u);
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool.capacity(), 1u);
  EXPECT_EQ(made, 2);
  // The one session is in use: nothing to hand out, and the caller waits for it (KV admission).
  auto busy = pool.acquire(a);
  ASSERT_FALSE(busy.has_value());
  EXPECT_EQ(pool.in_use(), pool.capacity());
  pool.release(second->slot);
  ASSERT_TRUE(pool.acquire(a).has_value());
  EXPECT_EQ(made, 2);  // no further attempts once the capacity dropped

  // With no live session the error is the request's.
  SessionPoolOptions none{2, 0, nullptr};
  none.make_session = [](uint32_t) -> expected<std::unique_ptr<Session>> { return make_error("no memory (test)"); };
  SessionPool empty(engine(), none);
  auto failed = empty.acquire(a);
  ASSERT_FALSE(failed.has_value());
  EXPECT_NE(failed.error().message.find("no memory"), std::string::npos);
}

TEST(SessionPool, DisplacedSessionsGoToDiskAndComeBack) {
  // One resident session, two agents: each request displaces the other's
  // session, which is saved first and restored from disk when its agent returns.
  TempDir tmp("pool");
  const Tokenizer& tok = engine().tokenizer();
  auto cache = open_cache(tmp.path, engine());
  SavePolicy policy;
  policy.min_tokens = 16;
  int displaced = 0;
  SessionPoolOptions o;
  o.max_sessions = 1;
  o.on_displace = [&](Session& s) {
    ++displaced;
    if (!worth_saving(s.n_tokens(), policy)) return;
    CacheSave save;
    save.reason = SaveReason::DISPLACED;
    auto r = cache_save(*cache, tok, s, save);
    EXPECT_TRUE(r.has_value());
  };
  SessionPool pool(engine(), o);
  const std::string sys = long_text("you are the tool model", 4);
  std::vector<int32_t> conv[2] = {encode(first_turn(sys, "agent one")), encode(first_turn(sys, "agent two"))};
  for (int turn = 0; turn < 2; ++turn) {
    for (int a = 0; a < 2; ++a) {
      auto lease = pool.acquire(conv[a]);
      ASSERT_TRUE(lease.has_value());
      size_t expect_cached = lease->reused;
      if (turn > 0 || a > 0) {
        EXPECT_EQ(lease->pick, PoolPick::DISPLACED);
      }
      if (turn > 0) {
        // The disk has this agent's whole previous turn.
        CacheQuery q;
        q.tokens = conv[a];
        q.min_tokens = lease->reused + 1;
        auto hit = cache_restore(*cache, tok, *lease->session, q);
        ASSERT_TRUE(hit.has_value()) << "turn " << turn << " agent " << a;
        EXPECT_EQ(hit->reason, SaveReason::DISPLACED);
        expect_cached = hit->cached_tokens;
      }
      const size_t before = lease->session->n_tokens();
      auto r = generate(*lease->session, tok, conv[a], greedy(3));
      ASSERT_TRUE(r.has_value());
      EXPECT_EQ(r->cached_tokens, expect_cached);
      if (turn > 0) {
        EXPECT_EQ(r->cached_tokens, before);
      }
      conv[a].insert(conv[a].end(), r->tokens.begin(), r->tokens.end());
      auto more = encode({ctl(k_token_user), txt("again"), ctl(k_token_assistant)});
      conv[a].insert(conv[a].end(), more.begin(), more.end());
      pool.release(lease->slot);
    }
  }
  EXPECT_EQ(displaced, 3);
  EXPECT_EQ(pool.size(), 1u);
  EXPECT_EQ(cache->stats().hits, 2u);
}

TEST(SessionCache, PreparedSaveWritesOnAnotherThread) {
  TempDir tmp("prepared");
  const Tokenizer& tok = engine().tokenizer();
  auto cache = open_cache(tmp.path, engine());
  auto s = new_session(engine());
  auto t = tiny_tokens(150, 12);
  ASSERT_TRUE(s->prefill(t).has_value());
  auto p = cache_prepare_save(*cache, tok, *s, CacheSave{SaveReason::FRONTIER, std::nullopt, nullptr});
  ASSERT_TRUE(p.has_value());
  ASSERT_FALSE(p->skipped.has_value());
  // The session moves on while the file is written.
  expected<StoreResult> written = make_error("not run");
  std::thread writer([&] { written = cache->store(p->input()); });
  ASSERT_TRUE(s->prefill(tiny_tokens(20, 13)).has_value());
  writer.join();
  ASSERT_TRUE(written.has_value()) << written.error().message;
  EXPECT_EQ(written->outcome, StoreOutcome::WRITTEN);
  // The file holds the state as captured, not as the session is now.
  auto fresh = new_session(engine());
  CacheQuery q;
  q.tokens = t;
  auto hit = cache_restore(*cache, tok, *fresh, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(fresh->tokens(), t);
  // Capturing the same state again is skipped before serialising.
  auto again = cache_prepare_save(*cache, tok, *fresh, CacheSave{});
  ASSERT_TRUE(again.has_value());
  ASSERT_TRUE(again->skipped.has_value());
  EXPECT_EQ(again->skipped->outcome, StoreOutcome::ALREADY_PRESENT);
  EXPECT_TRUE(again->payload.empty());
}

TEST(SessionCache, VisibleKeyMatchesTheTranscriptWithoutHiddenReasoning) {
  // Thinking mode without tools: the session holds the reasoning, the client
  // sends the turn back without it. Saved under the visible transcript, the
  // file is found by the next prompt's text, and all its tokens are reused.
  TempDir tmp("visible");
  const Tokenizer& tok = engine().tokenizer();
  const std::string sys = long_text("you think before you answer", 8);
  RenderedPrompt p1 = {ctl(k_token_bos),        txt(sys), ctl(k_token_user), txt("why"), ctl(k_token_assistant),
                       ctl(k_token_think_begin)};
  auto live = new_session(engine());
  ASSERT_TRUE(live->prefill(encode(p1)).has_value());
  auto reply = encode({txt("hidden reasoning here"), ctl(k_token_think_end), txt(" because."), ctl(k_token_eos)});
  ASSERT_TRUE(live->prefill(reply).has_value());
  // What the client renders for that turn: no reasoning, no <think>.
  RenderedPrompt visible(p1.begin(), p1.end() - 1);
  for (TextPiece piece : {ctl(k_token_think_end), txt(" because."), ctl(k_token_eos)}) visible.push_back(piece);
  auto cache = open_cache(tmp.path, engine());
  CacheSave save;
  save.reason = SaveReason::SHUTDOWN;
  save.visible_key = rendered_text(visible);
  ASSERT_TRUE(cache_save(*cache, tok, *live, save).has_value());
  // The decoded tokens (with the reasoning) are not the key: a prompt holding them does not match by text.
  RenderedPrompt p2 = visible;
  for (TextPiece piece : {ctl(k_token_user), txt("and then"), ctl(k_token_assistant), ctl(k_token_think_begin)})
    p2.push_back(piece);
  auto canonical2 = encode(p2);
  auto s = new_session(engine());
  CacheQuery q;
  q.tokens = canonical2;
  q.rendered = &p2;
  auto hit = cache_restore(*cache, tok, *s, q);
  ASSERT_TRUE(hit.has_value());
  EXPECT_FALSE(hit->by_tokens);
  EXPECT_FALSE(hit->decoded_key);
  EXPECT_EQ(hit->cached_tokens, live->n_tokens());
  EXPECT_EQ(hit->text_bytes, rendered_text(visible).size());
  EXPECT_EQ(s->tokens(), live->tokens());
  auto rest = std::span<const int32_t>(hit->prompt).subspan(hit->cached_tokens);
  auto want = encode(*rendered_from(p2, hit->text_bytes));
  EXPECT_TRUE(std::equal(rest.begin(), rest.end(), want.begin(), want.end()));
  // A decoded-key file reports decoded_key.
  TempDir tmp2("visible_decoded");
  auto cache2 = open_cache(tmp2.path, engine());
  ASSERT_TRUE(cache_save(*cache2, tok, *live, CacheSave{}).has_value());
  auto s2 = new_session(engine());
  CacheQuery q2;
  q2.tokens = live->tokens();
  auto hit2 = cache_restore(*cache2, tok, *s2, q2);
  ASSERT_TRUE(hit2.has_value());
  EXPECT_TRUE(hit2->decoded_key);
}

TEST(SessionPool, ReuseSeesTheSlotAndRegeneratesUseThePromptActuallyUsed) {
  SessionPool pool(engine(), SessionPoolOptions{2, 0, nullptr});
  auto a = tiny_tokens(40, 31), b = tiny_tokens(40, 32);
  auto la = pool.acquire(a);
  ASSERT_TRUE(la.has_value());
  ASSERT_TRUE(la->session->prefill(a).has_value());
  auto lb = pool.acquire(b);
  ASSERT_TRUE(lb.has_value());
  ASSERT_TRUE(lb->session->prefill(b).has_value());
  ASSERT_NE(la->slot, lb->slot);
  // Both in use (two requests running): a third request finds no session.
  EXPECT_FALSE(pool.acquire(a).has_value());
  pool.release(la->slot);
  pool.release(lb->slot);
  // The reuse function is told which slot it measures.
  std::vector<size_t> seen;
  auto pick = pool.acquire(40, [&](size_t slot, const std::vector<int32_t>& tokens) {
    seen.push_back(slot);
    EXPECT_EQ(&tokens, &pool.session(slot).tokens());
    return slot == lb->slot ? tokens.size() : size_t{0};
  });
  ASSERT_TRUE(pick.has_value());
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(pick->slot, lb->slot);
  EXPECT_EQ(pick->pick, PoolPick::EXTENDS);
  pool.release(pick->slot);
  // The request on b's slot was told 40 prompt tokens but used 30 (other tokens for the
  // same text); the session then holds those 30 and a 5-token reply.
  ASSERT_TRUE(pool.session(lb->slot).rewind(30).has_value());
  ASSERT_TRUE(pool.session(lb->slot).prefill(tiny_tokens(5, 33)).has_value());
  auto keeps_30 = [&](size_t slot, const std::vector<int32_t>&) { return slot == lb->slot ? size_t{30} : size_t{0}; };
  // Measured against the 40 it was told, a retry keeping the 30 looks unrelated: a's session would go.
  auto wrong = pool.acquire(40, keeps_30);
  ASSERT_TRUE(wrong.has_value());
  EXPECT_EQ(wrong->pick, PoolPick::DISPLACED);
  EXPECT_EQ(wrong->slot, la->slot);
  pool.release(wrong->slot);
  // Told the prompt actually used, the retry regenerates b's reply on b's session.
  pool.set_prompt_tokens(lb->slot, 30);
  auto retry = pool.acquire(40, keeps_30);
  ASSERT_TRUE(retry.has_value());
  EXPECT_EQ(retry->slot, lb->slot);
  EXPECT_EQ(retry->pick, PoolPick::REGENERATES);
}
