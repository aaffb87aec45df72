// KV-cache file format (kv/kv_file.h, docs/kv-cache-format.md): round trip,
// documented offsets, and rejection of every kind of damage in every region.
#include <gtest/gtest.h>

#include <cstring>

#include "kv_test_util.h"

using namespace dsv4;

namespace {

struct Sample {
  std::string text = "<｜begin▁of▁sentence｜>You are a helpful assistant.<｜User｜>hello";
  std::vector<int32_t> tokens = {0, 17, 18, 19, 20, 21, 5, 300, 301};
  std::vector<uint8_t> payload = kvtest::fake_snapshot(9, 0, 500);
  ToolDsmlMap tools = {{"call_a", "\n\n<｜DSML｜tool_calls>a</｜DSML｜tool_calls>"}, {"call_b", "dsml b"}};

  KvFileContent content(bool with_tools = true) const {
    KvFileContent c;
    c.identity = kvtest::test_identity();
    c.reason = SaveReason::FRONTIER;
    c.decoded_key = true;
    c.ctx = 4096;
    c.created = 1700000000;
    c.text = text;
    c.tokens = tokens;
    c.payload = payload;
    c.tools = with_tools ? &tools : nullptr;
    return c;
  }
};

template <class T>
T at(const std::vector<uint8_t>& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

}  // namespace

TEST(KvFile, RoundTrip) {
  Sample s;
  auto image = kv_build_image(s.content(), KvUsage{7, 1700000100});
  auto v = kv_parse_file(image);
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_EQ(v->text, s.text);
  EXPECT_EQ(v->tokens, s.tokens);
  EXPECT_TRUE(std::equal(v->payload.begin(), v->payload.end(), s.payload.begin(), s.payload.end()));
  EXPECT_EQ(v->tools, s.tools);
  EXPECT_EQ(v->usage.hits, 7u);
  EXPECT_EQ(v->usage.last_used, 1700000100u);
  EXPECT_EQ(v->header.identity, kvtest::test_identity());
  EXPECT_EQ(v->header.reason, SaveReason::FRONTIER);
  EXPECT_TRUE(v->header.decoded_key());
  EXPECT_EQ(v->header.ctx, 4096u);
  EXPECT_EQ(v->header.created, 1700000000u);
  EXPECT_EQ(v->header.file_bytes(), image.size());
  EXPECT_TRUE(kv_check_identity(v->header, kvtest::test_identity()).has_value());
  EXPECT_FALSE(kv_check_identity(v->header, kvtest::test_identity(2)).has_value());
  KvIdentity plain = kvtest::test_identity();
  plain.numerics = 1;
  EXPECT_FALSE(kv_check_identity(v->header, plain).has_value());
  // Without a tool map: no flag, no section.
  auto bare = kv_build_image(s.content(false), KvUsage{});
  auto vb = kv_parse_file(bare);
  ASSERT_TRUE(vb.has_value()) << vb.error().message;
  EXPECT_TRUE(vb->tools.empty());
  EXPECT_EQ(vb->header.tool_map_bytes, 0u);
  EXPECT_EQ(bare.size() + kv_encode_tool_map(s.tools).size(), image.size());
}

TEST(KvFile, LayoutMatchesTheDocument) {
  // docs/kv-cache-format.md §2: fixed offsets, little-endian.
  Sample s;
  auto image = kv_build_image(s.content(), KvUsage{3, 1700000200});
  EXPECT_EQ(std::memcmp(image.data(), "DSV4KVC\0", 8), 0);
  EXPECT_EQ(at<uint32_t>(image, 8), 2u);     // version
  EXPECT_EQ(at<uint32_t>(image, 12), 256u);  // header bytes
  EXPECT_EQ(image[16], 1);                   // model identity (test_identity fills it with 1)
  EXPECT_EQ(at<uint32_t>(image, 48), 0u);    // numerics
  EXPECT_EQ(at<uint32_t>(image, 52), 16u);   // expert gate/up type (IQ2_XXS)
  EXPECT_EQ(at<uint32_t>(image, 56), 10u);   // expert down type (Q2_K)
  EXPECT_EQ(at<uint32_t>(image, 60), 8u);    // dense type (Q8_0)
  EXPECT_EQ(at<uint32_t>(image, 64), 2u);    // routed bits
  EXPECT_EQ(at<uint32_t>(image, 68), 2u);    // reason: frontier
  EXPECT_EQ(at<uint32_t>(image, 72), 3u);    // flags: decoded key | tool map
  EXPECT_EQ(at<uint32_t>(image, 76), 4096u);
  EXPECT_EQ(at<uint64_t>(image, 80), s.tokens.size());
  EXPECT_EQ(at<uint64_t>(image, 88), 1700000000u);
  EXPECT_EQ(at<uint64_t>(image, 96), s.text.size());
  EXPECT_EQ(at<uint64_t>(image, 104), s.payload.size());
  EXPECT_EQ(at<uint64_t>(image, 112), kv_encode_tool_map(s.tools).size());
  Digest text_sha = sha256_digest(s.text.data(), s.text.size());
  EXPECT_EQ(std::memcmp(image.data() + 120, text_sha.data(), 32), 0);
  Digest tok_sha = sha256_digest(s.tokens.data(), 4 * s.tokens.size());
  EXPECT_EQ(std::memcmp(image.data() + 152, tok_sha.data(), 32), 0);
  Digest hdr_sha = sha256_digest(image.data(), 224);
  EXPECT_EQ(std::memcmp(image.data() + 224, hdr_sha.data(), 32), 0);
  EXPECT_EQ(at<uint64_t>(image, 256), 1700000200u);  // usage: last used
  EXPECT_EQ(at<uint32_t>(image, 264), 3u);           // usage: hits
  EXPECT_EQ(std::memcmp(image.data() + 288, s.text.data(), s.text.size()), 0);
  EXPECT_EQ(at<int32_t>(image, 288 + s.text.size() + 4), s.tokens[1]);
  // The file checksum skips the usage block.
  std::vector<uint8_t> covered(image.begin(), image.begin() + 256);
  covered.insert(covered.end(), image.begin() + 288, image.end() - 32);
  Digest file_sha = sha256_digest(covered.data(), covered.size());
  EXPECT_EQ(std::memcmp(image.data() + image.size() - 32, file_sha.data(), 32), 0);
  // The file name is the key text's SHA-256.
  EXPECT_EQ(kv_file_name(text_sha), sha256_hex(s.text.data(), s.text.size()) + ".kv");
  auto parsed = kv_parse_file_name(kv_file_name(text_sha));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(*parsed, text_sha);
  std::string upper = kv_file_name(text_sha);
  for (size_t i = 0; i < 64; ++i) upper[i] = static_cast<char>(std::toupper(upper[i]));
  EXPECT_TRUE(kv_parse_file_name(upper).has_value());
  EXPECT_FALSE(kv_parse_file_name("abc.kv").has_value());
  EXPECT_FALSE(kv_parse_file_name(std::string(64, 'g') + ".kv").has_value());
  EXPECT_FALSE(kv_parse_file_name(std::string(64, 'a') + ".kvx").has_value());
}

TEST(KvFile, EveryBitFlipOutsideTheUsageBlockIsRejected) {
  Sample s;
  auto image = kv_build_image(s.content(), KvUsage{1, 2});
  const KvHeader h = kv_parse_file(image)->header;
  struct Region {
    const char* name;
    size_t begin, end;
  };
  const Region regions[] = {
      {"header", 0, 256},
      {"text", 288, h.tokens_offset()},
      {"tokens", h.tokens_offset(), h.payload_offset()},
      {"payload", h.payload_offset(), h.tool_map_offset()},
      {"tool map", h.tool_map_offset(), h.checksum_offset()},
      {"checksum", h.checksum_offset(), image.size()},
  };
  for (const Region& r : regions) {
    // Every byte of small regions, a spread of bytes of large ones, several bit positions.
    const size_t step = std::max<size_t>(1, (r.end - r.begin) / 64);
    for (size_t off = r.begin; off < r.end; off += step) {
      for (int bit : {0, 3, 7}) {
        auto bad = image;
        bad[off] ^= static_cast<uint8_t>(1u << bit);
        EXPECT_FALSE(kv_parse_file(bad).has_value()) << r.name << " byte " << off << " bit " << bit;
      }
    }
  }
  // The usage block is outside the checksum: damage there costs only the usage.
  for (size_t off = 256; off < 288; ++off) {
    auto torn = image;
    torn[off] ^= 0x10;
    auto v = kv_parse_file(torn);
    ASSERT_TRUE(v.has_value()) << "usage byte " << off << ": " << v.error().message;
    EXPECT_EQ(v->usage.hits, 0u);
    EXPECT_EQ(v->usage.last_used, h.created);
  }
}

TEST(KvFile, TruncationAndTrailingBytesAreRejected) {
  Sample s;
  auto image = kv_build_image(s.content(), KvUsage{});
  for (size_t len = 0; len < image.size(); len += (len < 300 ? 1 : 37)) {
    auto v = kv_parse_file(std::span<const uint8_t>(image.data(), len));
    ASSERT_FALSE(v.has_value()) << len;
    if (len >= 288) {
      EXPECT_NE(v.error().message.find("truncated"), std::string::npos) << v.error().message;
    }
  }
  auto longer = image;
  longer.push_back(0);
  EXPECT_FALSE(kv_parse_file(longer).has_value());
}

TEST(KvFile, SealedButInvalidFieldsAreRejected) {
  // kv_seal recomputes every checksum, so each image below fails only for the planted field.
  Sample s;
  const auto image = kv_build_image(s.content(), KvUsage{});
  auto sealed_with = [&](size_t off, auto value) {
    auto b = image;
    std::memcpy(b.data() + off, &value, sizeof value);
    kv_seal(b);
    return kv_parse_file(b);
  };
  auto resealed = image;
  kv_seal(resealed);
  EXPECT_EQ(resealed, image);            // sealing a good image changes nothing
  auto v = sealed_with(8, uint32_t{1});  // the previous version
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.error().message.find("wrong version"), std::string::npos);
  EXPECT_FALSE(sealed_with(0, uint8_t{'X'}).has_value());                   // magic
  EXPECT_FALSE(sealed_with(12, uint32_t{300}).has_value());                 // header size
  EXPECT_FALSE(sealed_with(68, uint32_t{99}).has_value());                  // save reason
  EXPECT_FALSE(sealed_with(72, uint32_t{0x7}).has_value());                 // unknown flag
  EXPECT_FALSE(sealed_with(72, uint32_t{0x1}).has_value());                 // tool map present but flag clear
  EXPECT_FALSE(sealed_with(76, uint32_t{3}).has_value());                   // ctx below the token count
  EXPECT_FALSE(sealed_with(80, uint64_t{0}).has_value());                   // no tokens
  EXPECT_FALSE(sealed_with(80, uint64_t{1} << 40).has_value());             // absurd token count
  EXPECT_FALSE(sealed_with(96, uint64_t{1} << 50).has_value());             // absurd text size
  EXPECT_FALSE(sealed_with(104, uint64_t{0}).has_value());                  // no payload
  EXPECT_FALSE(sealed_with(216, uint8_t{1}).has_value());                   // reserved byte
  EXPECT_FALSE(sealed_with(120, uint8_t{0}).has_value());                   // text hash
  EXPECT_FALSE(sealed_with(152, uint8_t{0}).has_value());                   // token hash
  EXPECT_FALSE(sealed_with(288 + s.text.size(), int32_t{-5}).has_value());  // negative token id
  // The payload must be a full snapshot of exactly these tokens, with the header's numerics.
  const size_t p = 288 + s.text.size() + 4 * s.tokens.size();
  EXPECT_FALSE(sealed_with(p, uint8_t{'x'}).has_value());      // payload magic
  EXPECT_FALSE(sealed_with(p + 12, uint32_t{0}).has_value());  // light checkpoint
  EXPECT_FALSE(sealed_with(p + 84, uint64_t{8}).has_value());  // 8 tokens, not 9
  EXPECT_FALSE(sealed_with(p + 48, uint32_t{1}).has_value());  // other numerics
  // A damaged tool map with a resealed hash is still parsed and rejected.
  const size_t tm = p + s.payload.size();
  EXPECT_FALSE(sealed_with(tm, uint32_t{3}).has_value());         // entry count
  EXPECT_FALSE(sealed_with(tm + 4, uint32_t{0}).has_value());     // empty id
  EXPECT_FALSE(sealed_with(tm + 8, uint32_t{1000}).has_value());  // dsml runs past the end
}

TEST(KvFile, ToolMapSection) {
  ToolDsmlMap m = {{"a", "x"}, {"call_123", std::string(1000, 'd')}};
  auto b = kv_encode_tool_map(m);
  auto back = kv_parse_tool_map(b);
  ASSERT_TRUE(back.has_value()) << back.error().message;
  EXPECT_EQ(*back, m);
  EXPECT_TRUE(kv_encode_tool_map({}).empty());
  EXPECT_FALSE(kv_parse_tool_map({}).has_value());
  // Ids out of order.
  std::vector<uint8_t> swapped;
  auto u32 = [&](uint32_t v) {
    uint8_t x[4];
    std::memcpy(x, &v, 4);
    swapped.insert(swapped.end(), x, x + 4);
  };
  u32(2);
  for (const char* id : {"b", "a"}) {
    u32(1);
    u32(1);
    swapped.push_back(static_cast<uint8_t>(id[0]));
    swapped.push_back('z');
  }
  EXPECT_FALSE(kv_parse_tool_map(swapped).has_value());
  EXPECT_FALSE(kv_tool_entry_valid("", "x"));
  EXPECT_FALSE(kv_tool_entry_valid(std::string(257, 'i'), "x"));
  EXPECT_FALSE(kv_tool_entry_valid("id", ""));
  EXPECT_TRUE(kv_tool_entry_valid(std::string(256, 'i'), "x"));
}

TEST(KvFile, UsageBlock) {
  auto b = kv_encode_usage(KvUsage{42, 1234567890123});
  auto u = kv_parse_usage(b);
  ASSERT_TRUE(u.has_value());
  EXPECT_EQ(u->hits, 42u);
  EXPECT_EQ(u->last_used, 1234567890123u);
  b[3] ^= 1;
  EXPECT_FALSE(kv_parse_usage(b).has_value());
}

TEST(KvFile, GoldenFilesWrittenFromTheDocument) {
  // The fuzz seeds were written by an independent implementation of
  // docs/kv-cache-format.md; the reader must agree with it byte for byte.
  const std::string dir = std::string(DSV4_TEST_DATA_DIR) + "/../fuzz/corpus/fuzz_kv_file/";
  auto image = kvtest::read_bytes(dir + "valid_tools.bin");
  ASSERT_FALSE(image.empty());
  auto v = kv_parse_file(image);
  ASSERT_TRUE(v.has_value()) << v.error().message;
  EXPECT_EQ(v->text, "<｜begin▁of▁sentence｜>You are a coding agent.<｜User｜>list files");
  EXPECT_EQ(v->tokens, (std::vector<int32_t>{0, 40, 41, 42, 43, 44, 5, 300, 301, 302}));
  EXPECT_EQ(v->tools, (ToolDsmlMap{{"call_1", "<｜User｜>"}}));
  EXPECT_EQ(v->usage.hits, 3u);
  EXPECT_EQ(v->usage.last_used, 1700000500u);
  EXPECT_EQ(v->header.reason, SaveReason::COLD);
  Digest sevens;
  sevens.fill(7);
  EXPECT_EQ(v->header.identity.model, sevens);
  EXPECT_EQ(v->header.identity.routed_bits, 2u);
  EXPECT_EQ(v->payload.size(), 92u + 64u);
  // Our writer produces the same bytes from the same content.
  KvFileContent c;
  c.identity = v->header.identity;
  c.reason = v->header.reason;
  c.decoded_key = true;
  c.ctx = v->header.ctx;
  c.created = v->header.created;
  c.text = v->text;
  c.tokens = v->tokens;
  c.payload = v->payload;
  c.tools = &v->tools;
  EXPECT_EQ(kv_build_image(c, v->usage), image);

  const std::vector<uint8_t> plain_image = kvtest::read_bytes(dir + "valid_plain.bin");  // the view's bytes
  auto plain = kv_parse_file(plain_image);
  ASSERT_TRUE(plain.has_value()) << plain.error().message;
  EXPECT_FALSE(plain->header.decoded_key());
  EXPECT_EQ(plain->header.reason, SaveReason::FRONTIER);
  EXPECT_EQ(plain->text, "hello world");
  const std::vector<uint8_t> torn_image = kvtest::read_bytes(dir + "torn_usage.bin");
  auto torn = kv_parse_file(torn_image);
  ASSERT_TRUE(torn.has_value());
  EXPECT_EQ(torn->usage.hits, 0u);
  const std::pair<const char*, const char*> rejected[] = {
      {"truncated.bin", "truncated"},
      {"header_only.bin", "truncated"},
      {"wrong_version.bin", "wrong version"},
      {"bitflip_text.bin", "checksum"},
      {"light_payload.bin", "light checkpoint"},
  };
  for (const auto& [file, why] : rejected) {
    const std::vector<uint8_t> bytes = kvtest::read_bytes(dir + file);
    auto r = kv_parse_file(bytes);
    ASSERT_FALSE(r.has_value()) << file;
    EXPECT_NE(r.error().message.find(why), std::string::npos) << file << ": " << r.error().message;
  }
}
