// The on-disk KV cache store (kv/disk_cache.h) with stand-in payloads: file
// permissions, atomic writes, lookup by token and text prefix, rejection and
// removal of damaged or foreign files, budget and eviction order, a full disk,
// an unwritable directory, and two stores sharing one directory.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <fcntl.h>

#include <ctime>

#include <atomic>
#include <thread>

#include "kv/disk_cache.h"
#include "kv_test_util.h"

using namespace dsv4;
using kvtest::TempDir;

namespace {

// A test clock (Unix seconds) shared by the stores of one test.
struct Clock {
  std::shared_ptr<std::atomic<uint64_t>> t = std::make_shared<std::atomic<uint64_t>>(1700000000);
  std::function<uint64_t()> fn() const {
    auto p = t;
    return [p] { return p->load(); };
  }
  void advance(uint64_t s) { *t += s; }
};

std::unique_ptr<DiskCache> open_cache(const std::string& dir, uint64_t budget, const Clock& clock,
                                      const KvIdentity& id = kvtest::test_identity()) {
  DiskCacheOptions o;
  o.dir = dir;
  o.budget_bytes = budget;
  o.clock = clock.fn();
  auto c = DiskCache::open(o, id);
  EXPECT_TRUE(c.has_value()) << (c ? "" : c.error().message);
  return c ? std::move(*c) : nullptr;
}

// A stored prefix: tokens 1000+seed.., text "<seed>:" + token text.
struct Item {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<uint8_t> payload;
  Item(int seed, size_t n, size_t body = 256) {
    text = "item" + std::to_string(seed) + ":";
    for (size_t i = 0; i < n; ++i) {
      tokens.push_back(static_cast<int32_t>(1000 * seed + i));
      text += "t" + std::to_string(i) + " ";
    }
    payload = kvtest::fake_snapshot(n, 0, body, static_cast<uint8_t>(seed));
  }
  StoreInput input(SaveReason reason = SaveReason::COLD, const ToolDsmlMap* tools = nullptr) const {
    StoreInput in;
    in.key_text = text;
    in.tokens = tokens;
    in.payload = payload;
    in.ctx = 4096;
    in.reason = reason;
    in.tools = tools;
    return in;
  }
};

StoreResult store_ok(DiskCache& c, const StoreInput& in) {
  auto r = c.store(in);
  EXPECT_TRUE(r.has_value()) << (r ? "" : r.error().message);
  return r ? *r : StoreResult{};
}

std::vector<std::string> names(DiskCache& c) {
  std::vector<std::string> out;
  for (const auto& e : c.entries()) out.push_back(e.name);
  return out;
}

std::vector<std::string> dir_listing(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(DiskCache, StoreFindReadWithPrivatePermissions) {
  TempDir tmp("basic");
  Clock clock;
  auto c = open_cache(tmp.path + "/cache", 1 << 20, clock);
  ASSERT_TRUE(c);
  EXPECT_EQ(kvtest::mode_of(tmp.path + "/cache"), 0700u);
  Item a(1, 40);
  ToolDsmlMap tools = {{"call_x", "t3 t4"}, {"call_absent", "not in the text"}};
  auto r = store_ok(*c, a.input(SaveReason::COLD, &tools));
  EXPECT_EQ(r.outcome, StoreOutcome::WRITTEN);
  EXPECT_EQ(r.name, sha256_hex(a.text.data(), a.text.size()) + ".kv");
  EXPECT_EQ(kvtest::mode_of(tmp.path + "/cache/" + r.name), 0600u);
  EXPECT_EQ(dir_listing(tmp.path + "/cache"), std::vector<std::string>{r.name});  // no temporary left
  EXPECT_EQ(std::filesystem::file_size(tmp.path + "/cache/" + r.name), r.bytes);

  // A longer prompt: the entry matches both as a token prefix and as a text prefix.
  std::vector<int32_t> longer = a.tokens;
  longer.push_back(77);
  std::string longer_text = a.text + "more";
  auto found = c->find(longer_text, longer, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].tokens_match);
  EXPECT_TRUE(found[0].text_match);
  // Only one of the two queries matching.
  longer[3] = 5;
  found = c->find(longer_text, longer, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_FALSE(found[0].tokens_match);
  EXPECT_TRUE(found[0].text_match);
  found = c->find("item1:t0 t1 X", a.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].tokens_match);
  EXPECT_FALSE(found[0].text_match);
  // Limits: too short for min_tokens, too long for the session.
  EXPECT_TRUE(c->find(longer_text, a.tokens, 41, 4095).empty());
  EXPECT_TRUE(c->find(longer_text, a.tokens, 1, 39).empty());
  // A prompt shorter than the entry, or differing inside the probe, does not match.
  EXPECT_TRUE(c->find(a.text.substr(0, a.text.size() - 1), std::span(a.tokens).first(39), 1, 4095).empty());

  auto rec = c->read(found[0].entry);
  ASSERT_TRUE(rec.has_value()) << rec.error().message;
  EXPECT_EQ(rec->view.text, a.text);
  EXPECT_EQ(rec->view.tokens, a.tokens);
  EXPECT_TRUE(std::equal(rec->view.payload.begin(), rec->view.payload.end(), a.payload.begin(), a.payload.end()));
  EXPECT_EQ(rec->view.tools, (ToolDsmlMap{{"call_x", "t3 t4"}}));  // only calls whose DSML is in the text
  EXPECT_EQ(rec->view.header.reason, SaveReason::COLD);
  EXPECT_EQ(c->find_tool_calls({"call_x", "call_y"}), (ToolDsmlMap{{"call_x", "t3 t4"}}));

  // Hits are persisted in the file's usage block.
  clock.advance(100);
  c->record_hit(rec->entry);
  c->record_hit(rec->entry);
  auto again = open_cache(tmp.path + "/cache", 1 << 20, clock);
  auto es = again->entries();
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].usage.hits, 2u);
  EXPECT_EQ(es[0].usage.last_used, 1700000100u);
  EXPECT_EQ(c->stats().hits, 2u);

  // The same state again is not rewritten; new tool calls are.
  EXPECT_EQ(store_ok(*c, a.input()).outcome, StoreOutcome::ALREADY_PRESENT);
  EXPECT_EQ(store_ok(*c, a.input(SaveReason::COLD, &tools)).outcome, StoreOutcome::ALREADY_PRESENT);
  ToolDsmlMap more = {{"call_z", "t5"}};
  EXPECT_EQ(store_ok(*c, a.input(SaveReason::COLD, &more)).outcome, StoreOutcome::WRITTEN);
  // ... merged with the calls the file had, keeping its hits.
  auto merged = c->entries();
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].usage.hits, 2u);
  auto mrec = c->read(merged[0]);
  ASSERT_TRUE(mrec.has_value());
  EXPECT_EQ(mrec->view.tools, (ToolDsmlMap{{"call_x", "t3 t4"}, {"call_z", "t5"}}));
  EXPECT_TRUE(c->has(a.text, a.tokens));
  EXPECT_FALSE(c->has(a.text, std::span(a.tokens).first(10)));

  // Inputs that do not describe a snapshot of the tokens are refused.
  Item bad(2, 10);
  auto in = bad.input();
  auto wrong = kvtest::fake_snapshot(11);
  in.payload = wrong;
  EXPECT_FALSE(c->store(in).has_value());
  in = bad.input();
  in.ctx = 5;
  EXPECT_FALSE(c->store(in).has_value());
  in = bad.input();
  in.key_text = "";
  EXPECT_FALSE(c->store(in).has_value());
}

TEST(DiskCache, LongestMatchWinsAndTiesPreferTokens) {
  TempDir tmp("longest");
  Clock clock;
  auto c = open_cache(tmp.path, 1 << 20, clock);
  Item full(3, 60);
  auto prefix_input = [&](size_t n, std::string text) {
    StoreInput in = full.input();
    in.tokens = std::span(full.tokens).first(n);
    static std::vector<std::vector<uint8_t>> keep;
    keep.push_back(kvtest::fake_snapshot(n));
    in.payload = keep.back();
    static std::vector<std::string> texts;
    texts.push_back(std::move(text));
    in.key_text = texts.back();
    return in;
  };
  // 20 and 40 token prefixes of `full`, keyed by prefixes of its text.
  std::string t20 = full.text.substr(0, full.text.find("t20 "));
  std::string t40 = full.text.substr(0, full.text.find("t40 "));
  store_ok(*c, prefix_input(20, t20));
  store_ok(*c, prefix_input(40, t40));
  auto found = c->find(full.text, full.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].entry.header.n_tokens, 40u);
  EXPECT_EQ(found[1].entry.header.n_tokens, 20u);
  // A different-text entry with 40 tokens that matches only by text ranks after the token match.
  store_ok(*c, prefix_input(40, full.text.substr(0, full.text.find("t41 "))));
  found = c->find(full.text, full.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].entry.header.n_tokens, 40u);
  EXPECT_TRUE(found[0].tokens_match);
  EXPECT_EQ(found[1].entry.header.n_tokens, 40u);
}

TEST(DiskCache, DamagedForeignAndWrongVersionFilesAreRemoved) {
  TempDir tmp("damaged");
  Clock clock;
  const std::string dir = tmp.path;
  std::string good_name;
  std::vector<uint8_t> good;
  {
    auto c = open_cache(dir, 1 << 20, clock);
    Item a(4, 30);
    good_name = store_ok(*c, a.input()).name;
    good = kvtest::read_bytes(dir + "/" + good_name);
  }
  // Files planted under valid names (the SHA-256 of their key), each with one fault.
  auto make = [&](int seed, auto fault) {
    Item it(100 + seed, 25);
    KvFileContent c;
    c.identity = kvtest::test_identity();
    c.ctx = 4096;
    c.created = 1700000000;
    c.text = it.text;
    c.tokens = it.tokens;
    c.payload = it.payload;
    auto image = kv_build_image(c, KvUsage{});
    fault(image);
    kvtest::write_bytes(dir + "/" + kv_file_name(sha256_digest(it.text.data(), it.text.size())), image);
  };
  make(1, [](std::vector<uint8_t>& b) { b.erase(b.end() - 10, b.end()); });     // truncated
  make(2, [](std::vector<uint8_t>& b) { b.erase(b.begin() + 100, b.end()); });  // truncated inside the header
  make(3, [](std::vector<uint8_t>& b) { b[40] ^= 1; });                         // header bit flip
  make(4, [](std::vector<uint8_t>& b) {                                         // wrong version (sealed)
    b[8] = 9;
    kv_seal(b);
  });
  make(5, [](std::vector<uint8_t>& b) {  // foreign model (sealed)
    b[16] ^= 0xff;
    kv_seal(b);
  });
  make(6, [](std::vector<uint8_t>& b) { std::fill(b.begin(), b.end(), 0x5a); });  // garbage
  make(7, [](std::vector<uint8_t>& b) { b.clear(); });                            // empty
  // A valid file under the wrong name.
  kvtest::write_bytes(dir + "/" + std::string(64, 'a') + ".kv", good);
  // Not ours: left alone.
  kvtest::write_bytes(dir + "/notes.txt", {1, 2, 3});
  // Payload damage is only visible to a full read.
  make(8, [](std::vector<uint8_t>& b) { b[b.size() - 100] ^= 4; });

  auto c = open_cache(dir, 1 << 20, clock);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->stats().rejected, 8u);  // all but the payload-damaged one, at open
  auto listing = dir_listing(dir);
  EXPECT_EQ(listing.size(), 3u);  // good, payload-damaged, notes.txt
  EXPECT_TRUE(std::find(listing.begin(), listing.end(), "notes.txt") != listing.end());
  EXPECT_TRUE(std::find(listing.begin(), listing.end(), good_name) != listing.end());
  Item damaged(108, 25);
  auto found = c->find(damaged.text, damaged.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  auto rec = c->read(found[0].entry);
  ASSERT_FALSE(rec.has_value());
  EXPECT_NE(rec.error().message.find("checksum"), std::string::npos) << rec.error().message;
  EXPECT_EQ(c->stats().rejected, 9u);
  EXPECT_EQ(dir_listing(dir).size(), 2u);
  EXPECT_TRUE(c->find(damaged.text, damaged.tokens, 1, 4095).empty());

  // A file damaged after it was indexed is caught at read time too.
  Item a(4, 30);
  found = c->find(a.text, a.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  auto bytes = kvtest::read_bytes(dir + "/" + good_name);
  bytes[bytes.size() / 2] ^= 0x20;
  {
    // Rewrite in place (same inode), as a disk fault would.
    std::fstream f(dir + "/" + good_name, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(bytes.size() / 2));
    f.put(static_cast<char>(bytes[bytes.size() / 2]));
  }
  rec = c->read(found[0].entry);
  ASSERT_FALSE(rec.has_value());
  EXPECT_EQ(dir_listing(dir), std::vector<std::string>{"notes.txt"});
  // A vanished file is a quiet miss.
  Item b(5, 30);
  auto sb = store_ok(*c, b.input());
  found = c->find(b.text, b.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  std::filesystem::remove(dir + "/" + sb.name);
  EXPECT_FALSE(c->read(found[0].entry).has_value());
  EXPECT_EQ(c->stats().rejected, 10u);
}

TEST(DiskCache, TornUsageBlockKeepsTheFile) {
  TempDir tmp("torn");
  Clock clock;
  auto c = open_cache(tmp.path, 1 << 20, clock);
  Item a(6, 20);
  auto r = store_ok(*c, a.input());
  auto bytes = kvtest::read_bytes(tmp.path + "/" + r.name);
  bytes[260] ^= 0xff;  // inside the usage block
  kvtest::write_bytes(tmp.path + "/" + r.name, bytes);
  auto c2 = open_cache(tmp.path, 1 << 20, clock);
  auto es = c2->entries();
  ASSERT_EQ(es.size(), 1u);
  EXPECT_EQ(es[0].usage.hits, 0u);
  EXPECT_EQ(es[0].usage.last_used, es[0].header.created);
  auto rec = c2->read(es[0]);
  ASSERT_TRUE(rec.has_value()) << rec.error().message;
  EXPECT_EQ(c2->stats().rejected, 0u);
}

TEST(DiskCache, EvictionOrderAndBudget) {
  TempDir tmp("evict");
  Clock clock;
  // Four files of nearly equal size; a budget that holds three.
  Item a(11, 100), b(12, 100), c_(13, 100), d(14, 100, 100000);
  const uint64_t one = [&] {
    TempDir probe("evict_probe");
    auto p = open_cache(probe.path, 1 << 30, clock);
    return store_ok(*p, a.input()).bytes;
  }();
  auto c = open_cache(tmp.path, 3 * one + one / 2, clock);
  auto ra = store_ok(*c, a.input());
  clock.advance(60);
  auto rb = store_ok(*c, b.input());
  clock.advance(60);
  auto rc = store_ok(*c, c_.input());
  // a: 3 hits long ago; b: never used, newer than a; c: 1 recent hit.
  auto entry = [&](const std::string& name) {
    for (const auto& e : c->entries())
      if (e.name == name) return e;
    ADD_FAILURE() << name;
    return CacheEntry{};
  };
  for (int i = 0; i < 3; ++i) c->record_hit(entry(ra.name));
  clock.advance(3600);
  c->record_hit(entry(rc.name));
  clock.advance(60);
  // value = (1 + hits) * 2^(-age / 6h) * tokens / bytes:
  //   a: 4 * 2^(-3660/21600) = 3.55;  b: 1 * 2^(-3720/21600) = 0.89;  c: 2 * 2^(-60/21600) = 1.99
  Item e(15, 100);
  auto re = store_ok(*c, e.input());
  ASSERT_EQ(re.evicted, std::vector<std::string>{rb.name});
  EXPECT_EQ(c->stats().evictions, 1u);
  // Next, with e protected no more: e has no hits and is the least valuable.
  //   a: 4 * 2^(-3720/21600) = 3.55;  c: 2 * 2^(-120/21600) = 1.99;  e: 1 * 2^(-60/21600) = 1.00
  clock.advance(60);
  Item f(16, 100);
  auto rf = store_ok(*c, f.input());
  EXPECT_EQ(rf.evicted, std::vector<std::string>{re.name});
  auto left = names(*c);
  EXPECT_EQ(left.size(), 3u);
  EXPECT_TRUE(std::find(left.begin(), left.end(), rf.name) != left.end());
  // A day later every value has decayed by about 2^-4, and hits still order them:
  //   a: 4 * 2^(-4.17) = 0.22;  c: 2 * 2^(-4.01) = 0.12;  f: 1 * 2^(-4.00) = 0.06
  clock.advance(24 * 3600);
  Item g(17, 100);
  auto rg = store_ok(*c, g.input());
  EXPECT_EQ(rg.evicted, std::vector<std::string>{rf.name});
  // Three days later the fresher g outranks both long-idle files despite their hits:
  //   a: 4 * 2^(-16.17) = 5.4e-5;  c: 2 * 2^(-16.01) = 3.1e-5;  g: 1 * 2^(-12) = 2.4e-4
  clock.advance(3 * 24 * 3600);
  Item h(18, 100);
  auto rh = store_ok(*c, h.input());
  EXPECT_EQ(rh.evicted, std::vector<std::string>{rc.name});
  uint64_t total = 0;
  for (const auto& en : c->entries()) total += en.file_bytes;
  EXPECT_LE(total, 3 * one + one / 2);
  // A file larger than the whole budget is not written.
  auto rd = store_ok(*c, d.input());
  EXPECT_EQ(rd.outcome, StoreOutcome::OVER_BUDGET);
  // Shrinking the budget at open evicts down to it.
  auto small = open_cache(tmp.path, one + one / 2, clock);
  EXPECT_EQ(small->entries().size(), 1u);
  EXPECT_EQ(small->stats().evictions, 2u);
}

TEST(DiskCache, EvictionPrefersTokensPerByte) {
  // Same tokens, hits and age: the bigger file saves less prefill per byte and goes first,
  // even though it is the newer one.
  TempDir tmp("perbyte");
  Clock clock;
  Item x(51, 100), y(52, 100, 20000), z(53, 100);
  auto c = open_cache(tmp.path, 1 << 30, clock);
  auto rx = store_ok(*c, x.input());
  auto ry = store_ok(*c, y.input());
  auto c2 = open_cache(tmp.path, rx.bytes + ry.bytes + 10, clock);
  clock.advance(10);
  auto rz = store_ok(*c2, z.input());
  EXPECT_EQ(rz.evicted, std::vector<std::string>{ry.name});
  // Equal value: the older last use goes first.
  TempDir tmp2("ties");
  auto d = open_cache(tmp2.path, 1 << 30, clock);
  auto r1 = store_ok(*d, x.input());
  clock.advance(1);
  auto r2 = store_ok(*d, Item(54, 100).input());
  auto d2 = open_cache(tmp2.path, r1.bytes + r2.bytes + 10, clock);
  auto r3 = store_ok(*d2, z.input());
  // x is older by one second; 1 s of decay is smaller than any size difference here: check by value.
  EXPECT_EQ(r3.evicted, std::vector<std::string>{r1.name});
}

TEST(DiskCache, UnwritableDirectoryIsAnError) {
  TempDir tmp("unwritable");
  std::filesystem::create_directories(tmp.path);
  kvtest::write_bytes(tmp.path + "/file", {1});
  Clock clock;
  DiskCacheOptions o;
  o.clock = clock.fn();
  o.dir = tmp.path + "/file";  // a regular file
  EXPECT_FALSE(DiskCache::open(o, kvtest::test_identity()).has_value());
  o.dir = tmp.path + "/file/sub";  // below a regular file
  auto r = DiskCache::open(o, kvtest::test_identity());
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find(o.dir), std::string::npos);
  // A directory others can write to is refused.
  std::filesystem::create_directories(tmp.path + "/shared");
  ::chmod((tmp.path + "/shared").c_str(), 0777);
  o.dir = tmp.path + "/shared";
  r = DiskCache::open(o, kvtest::test_identity());
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("writable by group or others"), std::string::npos);
  // A directory of another user is refused (root can make one).
  std::filesystem::create_directories(tmp.path + "/theirs");
  ::chmod((tmp.path + "/theirs").c_str(), 0700);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown((tmp.path + "/theirs").c_str(), 65534, 65534), 0);
    o.dir = tmp.path + "/theirs";
    r = DiskCache::open(o, kvtest::test_identity());
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message.find("another user"), std::string::npos);
  } else {
    // Without write permission the probe write fails.
    ::chmod((tmp.path + "/theirs").c_str(), 0500);
    o.dir = tmp.path + "/theirs";
    r = DiskCache::open(o, kvtest::test_identity());
    ASSERT_FALSE(r.has_value());
    EXPECT_NE(r.error().message.find("cannot write"), std::string::npos);
  }
  o.dir = "";
  EXPECT_FALSE(DiskCache::open(o, kvtest::test_identity()).has_value());
}

// Every refusal of a directory names it, also those found after the store
// took over the options (ownership, permissions, the probe write).
TEST(DiskCache, DirectoryErrorsNameTheDirectory) {
  TempDir tmp("named");
  std::filesystem::create_directories(tmp.path + "/shared");
  ::chmod((tmp.path + "/shared").c_str(), 0777);
  std::filesystem::create_directories(tmp.path + "/theirs");
  ::chmod((tmp.path + "/theirs").c_str(), 0500);
  if (::geteuid() == 0) {  // root passes the probe write: the directory belongs to someone else instead
    ASSERT_EQ(::chown((tmp.path + "/theirs").c_str(), 65534, 65534), 0);
  }
  for (const std::string& dir : {tmp.path + "/shared", tmp.path + "/theirs"}) {
    DiskCacheOptions o;
    o.dir = dir;
    auto r = DiskCache::open(o, kvtest::test_identity());
    ASSERT_FALSE(r.has_value()) << dir;
    EXPECT_NE(r.error().message.find("directory " + dir), std::string::npos) << r.error().message;
  }
}

TEST(DiskCache, FileSizeLimitTurnsTheStoreReadOnly) {
  // RLIMIT_FSIZE makes write() fail with EFBIG, a real kernel-level write failure.
  TempDir tmp("fsize");
  Clock clock;
  auto c = open_cache(tmp.path, 1 << 30, clock);
  Item small(21, 10), big(22, 10, 200000), later(23, 10);
  auto rs = store_ok(*c, small.input());
  ASSERT_EQ(rs.outcome, StoreOutcome::WRITTEN);
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  auto r = c->store(big.input());
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(r.has_value());
  EXPECT_FALSE(c->stats().writable);
  // Read-only from now on; existing files still serve hits; no temporary file is left behind.
  EXPECT_EQ(store_ok(*c, later.input()).outcome, StoreOutcome::READ_ONLY);
  auto found = c->find(small.text, small.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(c->read(found[0].entry).has_value());
  EXPECT_EQ(dir_listing(tmp.path), std::vector<std::string>{rs.name});
}

TEST(DiskCache, FullDiskTurnsTheStoreReadOnly) {
  // A real ENOSPC from a 256 KiB tmpfs (needs permission to mount; skipped without).
  TempDir tmp("enospc");
  std::filesystem::create_directories(tmp.path);
  if (::mount("tmpfs", tmp.path.c_str(), "tmpfs", 0, "size=256k,mode=0700") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount(p.c_str()); }
  } unmount{tmp.path};
  Clock clock;
  auto c = open_cache(tmp.path + "/cache", 1 << 30, clock);
  ASSERT_TRUE(c);
  Item small(31, 10, 1000), big(32, 10, 400 * 1024), later(33, 10, 1000);
  ASSERT_EQ(store_ok(*c, small.input()).outcome, StoreOutcome::WRITTEN);
  auto r = c->store(big.input());
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("space"), std::string::npos) << r.error().message;
  EXPECT_FALSE(c->stats().writable);
  EXPECT_EQ(store_ok(*c, later.input()).outcome, StoreOutcome::READ_ONLY);
  EXPECT_EQ(dir_listing(tmp.path + "/cache").size(), 1u);
  auto found = c->find(small.text, small.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(c->read(found[0].entry).has_value());
}

TEST(DiskCache, StaleTemporaryFilesAreRemovedLiveOnesKept) {
  TempDir tmp("stale");
  std::filesystem::create_directories(tmp.path);
  ::chmod(tmp.path.c_str(), 0700);
  const std::string dead = ".x.kv.tmp.999999999.00000000.0";  // no such pid
  const std::string live = ".y.kv.tmp." + std::to_string(::getpid()) + ".00000000.0";
  kvtest::write_bytes(tmp.file(dead), {1});
  kvtest::write_bytes(tmp.file(live), {1});
  Clock clock;
  auto c = open_cache(tmp.path, 1 << 20, clock);
  auto listing = dir_listing(tmp.path);
  EXPECT_EQ(listing, std::vector<std::string>{live});
  // Older than a day, even a live-looking one is stale (pid reuse, another host).
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = std::time(nullptr) - 2 * 24 * 3600;
  times[0].tv_nsec = times[1].tv_nsec = 0;
  ASSERT_EQ(::utimensat(AT_FDCWD, tmp.file(live).c_str(), times, 0), 0);
  c->entries();
  EXPECT_TRUE(dir_listing(tmp.path).empty());
}

TEST(DiskCache, TwoStoresShareADirectory) {
  TempDir tmp("shared");
  Clock clock;
  auto a = open_cache(tmp.path, 1 << 30, clock);
  auto b = open_cache(tmp.path, 1 << 30, clock);
  Item common(40, 50);
  store_ok(*a, common.input());
  // b sees what a wrote.
  auto found = b->find(common.text, common.tokens, 1, 4095);
  ASSERT_EQ(found.size(), 1u);
  ASSERT_TRUE(b->read(found[0].entry).has_value());
  // Both write, read and count hits at once.
  std::atomic<int> failures{0};
  auto worker = [&](DiskCache* c, int base) {
    for (int i = 0; i < 12; ++i) {
      Item it(base + i, 20 + i);
      if (!c->store(it.input()).has_value()) ++failures;
      auto f = c->find(common.text, common.tokens, 1, 4095);
      if (f.size() != 1) {
        ++failures;
        continue;
      }
      auto rec = c->read(f[0].entry);
      if (!rec)
        ++failures;
      else
        c->record_hit(rec->entry);
      // Rewriting the same key concurrently from both stores: atomic renames, never a torn file.
      Item shared(39, 30);
      ToolDsmlMap tools = {{"id" + std::to_string(base + i), "t1"}};
      if (!c->store(shared.input(SaveReason::FRONTIER, &tools)).has_value()) ++failures;
    }
  };
  std::thread ta(worker, a.get(), 100), tb(worker, b.get(), 200);
  ta.join();
  tb.join();
  EXPECT_EQ(failures.load(), 0);
  // A third store finds every file valid: nothing rejected, 24 + 2 files.
  auto c = open_cache(tmp.path, 1 << 30, clock);
  auto es = c->entries();
  EXPECT_EQ(es.size(), 26u);
  for (const auto& e : es) {
    auto rec = c->read(e);
    EXPECT_TRUE(rec.has_value()) << e.name << ": " << (rec ? "" : rec.error().message);
  }
  EXPECT_EQ(c->stats().rejected, 0u);
  EXPECT_EQ(a->stats().rejected + b->stats().rejected, 0u);
  // The hits of both stores landed in the one file (an update may be lost to a race, never the file).
  for (const auto& e : es)
    if (e.header.n_tokens == 50) {
      EXPECT_GE(e.usage.hits, 1u);
    }
  EXPECT_EQ(a->stats().hits + b->stats().hits, 24u);
}
