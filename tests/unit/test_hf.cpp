// Tests of src/hf, files: safetensors files (byte-exact files built here), checkpoint folders and
// element readers (plain, FP8 block-scaled, packed FP4, integer tables). config.json and the name
// map / conversion plan: test_hf_config.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/float_conv.h"
#include "core/rng.h"
#include "hf/hf_config.h"
#include "hf/hf_names.h"
#include "hf/safetensors.h"
#include "hf_test_util.h"

using namespace dsv4;
using namespace dsv4::hftest;
namespace fs = std::filesystem;

namespace {

// ---- building safetensors files by hand -------------------------------------------------------

expected<std::unique_ptr<SafetensorsFile>> parse(std::vector<uint8_t> bytes) {
  static std::deque<std::vector<uint8_t>> keep;
  keep.push_back(std::move(bytes));
  return SafetensorsFile::from_memory(keep.back().data(), keep.back().size(), "test.safetensors");
}

// The parse must fail with `needle` in the message.
void expect_rejected(const std::vector<uint8_t>& bytes, const std::string& needle) {
  auto r = parse(bytes);
  ASSERT_FALSE(r.has_value()) << "accepted a file that should fail with: " << needle;
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << "message: " << r.error().message;
}

}  // namespace

// =================================================================================================
// safetensors: valid files
// =================================================================================================

TEST(Safetensors, RoundTripAllDtypes) {
  const std::vector<float> f32 = {1.5f, -2.25f, 0.0f, 3.0e-3f, 65504.0f, -1e-30f};
  const std::vector<float> bf = {1.0f, -0.5f, 3.140625f, -100.0f};
  const std::vector<float> h = {0.5f, -1.25f, 2048.0f, 0x1p-24f};
  const std::vector<int64_t> i64 = {0, 3, 255, -7, 2147483647, -2147483647 - 1};
  const std::vector<int32_t> i32 = {-1, 7};
  const std::vector<uint8_t> e4m3 = {0x38, 0xB8, 0x7E, 0x01};  // 1.0, -1.0, 448, 2^-9
  std::vector<Entry> es = {
      {"a.f32", "F32", {2, 3}, le_bytes(f32)},
      {"b.bf16", "BF16", {4}, bf16_bytes(bf)},
      {"c.f16", "F16", {2, 2}, f16_bytes(h)},
      {"d.i64", "I64", {3, 2}, le_bytes(i64)},
      {"e.i32", "I32", {2}, le_bytes(i32)},
      {"f.i8", "I8", {3}, {0xFF, 0x05, 0x80}},
      {"g.u8", "U8", {2}, {200, 1}},
      {"h.e4m3", "F8_E4M3", {2, 2}, e4m3},
      {"i.scalar", "F32", {}, le_bytes(std::vector<float>{42.0f})},
      {"j.empty", "F32", {0, 4}, {}},
      {"k.e8m0", "F8_E8M0", {1, 1}, {130}},
  };
  auto bytes = build(es, "{\"format\":\"pt\",\"note\":\"x\"}", 5);
  auto r = parse(bytes);
  ASSERT_TRUE(r.has_value()) << r.error().message;
  const SafetensorsFile& f = **r;
  ASSERT_EQ(f.tensors().size(), es.size());
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].first, "format");
  EXPECT_EQ(f.metadata()[0].second, "pt");

  const StTensor* a = f.find("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, StDtype::F32);
  EXPECT_EQ(a->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(a->n_rows(), 2u);
  EXPECT_EQ(a->row_length(), 3u);
  EXPECT_EQ(a->shape_string(), "[2, 3]");
  std::vector<float> out(6);
  ASSERT_TRUE(st_read_f32(*a, out.data()).has_value());
  EXPECT_EQ(out, f32);
  std::vector<float> row1(3);
  ASSERT_TRUE(st_read_rows_f32(*a, 1, 1, row1.data()).has_value());
  EXPECT_EQ(row1, (std::vector<float>{3.0e-3f, 65504.0f, -1e-30f}));
  EXPECT_FALSE(st_read_rows_f32(*a, 1, 2, row1.data()).has_value());  // rows out of range

  out.assign(4, 0);
  ASSERT_TRUE(st_read_f32(*f.find("b.bf16"), out.data()).has_value());
  EXPECT_EQ(out, bf);
  ASSERT_TRUE(st_read_f32(*f.find("c.f16"), out.data()).has_value());
  EXPECT_EQ(out, h);
  ASSERT_TRUE(st_read_f32(*f.find("h.e4m3"), out.data()).has_value());
  EXPECT_EQ(out, (std::vector<float>{1.0f, -1.0f, 448.0f, 0x1p-9f}));

  std::vector<int32_t> iv(6);
  ASSERT_TRUE(st_read_i32(*f.find("d.i64"), iv.data()).has_value());
  EXPECT_EQ(iv, (std::vector<int32_t>{0, 3, 255, -7, 2147483647, -2147483647 - 1}));
  ASSERT_TRUE(st_read_rows_i32(*f.find("d.i64"), 2, 1, iv.data()).has_value());
  EXPECT_EQ(iv[0], 2147483647);
  ASSERT_TRUE(st_read_i32(*f.find("f.i8"), iv.data()).has_value());
  EXPECT_EQ((std::vector<int32_t>(iv.begin(), iv.begin() + 3)), (std::vector<int32_t>{-1, 5, -128}));
  ASSERT_TRUE(st_read_i32(*f.find("g.u8"), iv.data()).has_value());
  EXPECT_EQ(iv[0], 200);

  const StTensor* s = f.find("i.scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->n_elements(), 1u);
  ASSERT_TRUE(st_read_f32(*s, out.data()).has_value());
  EXPECT_EQ(out[0], 42.0f);
  const StTensor* e = f.find("j.empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->n_elements(), 0u);
  EXPECT_EQ(e->n_bytes, 0u);

  // tensors are listed in data order and offsets are consistent
  uint64_t pos = 0;
  for (const StTensor& t : f.tensors()) {
    EXPECT_EQ(t.data_begin, pos) << t.name;
    pos += t.n_bytes;
  }
  EXPECT_EQ(f.data_offset() + pos, bytes.size());
  EXPECT_EQ(f.find("missing"), nullptr);

  // wrong-kind reads are errors, not garbage
  EXPECT_FALSE(st_read_f32(*f.find("d.i64"), out.data()).has_value());
  EXPECT_FALSE(st_read_i32(*f.find("a.f32"), iv.data()).has_value());
  EXPECT_FALSE(st_read_f32(*f.find("k.e8m0"), out.data()).has_value());
}

TEST(Safetensors, OpensMappedFile) {
  TempDir dir;
  std::string p = dir.write("x.safetensors", build({{"w", "F32", {2}, le_bytes(std::vector<float>{1, 2})}}));
  auto f = SafetensorsFile::open(p);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  EXPECT_EQ((*f)->path(), p);
  std::vector<float> v(2);
  ASSERT_TRUE(st_read_f32(*(*f)->find("w"), v.data()).has_value());
  EXPECT_EQ(v, (std::vector<float>{1, 2}));
  auto missing = SafetensorsFile::open((dir.path / "nope.safetensors").string());
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("cannot open"), std::string::npos);
}

TEST(Safetensors, OutOfOrderOffsetsAndUnsortedHeaderAreFine) {
  // header order differs from data order; the reader sorts by offset
  std::vector<uint8_t> data = le_bytes(std::vector<float>{1, 2, 3});
  std::string h =
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  auto r = parse(raw_file(h, data));
  ASSERT_TRUE(r.has_value()) << r.error().message;
  EXPECT_EQ((*r)->tensors()[0].name, "a");
  std::vector<float> v(2);
  ASSERT_TRUE(st_read_f32(*(*r)->find("b"), v.data()).has_value());
  EXPECT_EQ(v, (std::vector<float>{2, 3}));
}

// =================================================================================================
// safetensors: malformed files are rejected with clear errors
// =================================================================================================

TEST(Safetensors, RejectsBadHeaderLength) {
  expect_rejected({1, 2, 3}, "shorter than the 8-byte header length");
  expect_rejected(raw_file("", {}), "header length is 0");
  auto f = raw_file("{}", {});
  f[0] = 200;  // claims 200 header bytes, has 2
  expect_rejected(f, "runs past the end");
  auto huge = raw_file("{}", {});
  huge[4] = 1;  // 2^32 + 2 bytes
  expect_rejected(huge, "exceeds the 100000000-byte limit");
}

TEST(Safetensors, RejectsBadJson) {
  expect_rejected(raw_file("not json at all", {}), "JSON syntax error at byte");
  expect_rejected(raw_file("{\"a\":{\"dtype\":\"F32\"", {}), "JSON syntax error");
  expect_rejected(raw_file("[1,2,3]", {}), "not an object");
  expect_rejected(raw_file("{\"a\":5}", {}), "entry is not an object");
  // a tensor described twice
  std::string dup =
      R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_rejected(raw_file(dup, std::vector<uint8_t>(4)), "duplicate key \"w\"");
  std::string dup_field = R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})";
  expect_rejected(raw_file(dup_field, std::vector<uint8_t>(4)), "duplicate key \"dtype\"");
}

TEST(Safetensors, RejectsBadEntries) {
  auto one = [](const std::string& entry, size_t data_bytes) {
    return raw_file("{\"w\":" + entry + "}", std::vector<uint8_t>(data_bytes));
  };
  expect_rejected(one(R"({"shape":[1],"data_offsets":[0,4]})", 4), "missing or non-string \"dtype\"");
  expect_rejected(one(R"({"dtype":"F32","data_offsets":[0,4]})", 4), "missing or non-array \"shape\"");
  expect_rejected(one(R"({"dtype":"F32","shape":[1]})", 4), "data_offsets");
  expect_rejected(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", 4), "data_offsets");
  expect_rejected(one(R"({"dtype":"F4","shape":[2],"data_offsets":[0,1]})", 1), "unsupported dtype \"F4\"");
  expect_rejected(one(R"({"dtype":"f32","shape":[1],"data_offsets":[0,4]})", 4), "unsupported dtype \"f32\"");
  expect_rejected(one(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", 4), "non-integer or negative");
  expect_rejected(one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", 4), "non-integer or negative");
  expect_rejected(one(R"({"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]})", 4), "overflows");
  expect_rejected(one(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})", 20),
                  "dtype F32 x shape [2, 3] = 24 bytes, but data_offsets [0, 20] span 20 bytes");
  expect_rejected(one(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})", 8), "end before they begin");
  expect_rejected(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})", 2), "run past the 2-byte data section");
  expect_rejected(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1})", 4), "unknown field \"extra\"");
  expect_rejected(raw_file(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::vector<uint8_t>(4)),
                  "empty name");
  expect_rejected(raw_file(R"({"__metadata__":{"a":1}})", {}), "\"__metadata__\" entry \"a\" is not a string");
  expect_rejected(raw_file(R"({"__metadata__":[1]})", {}), "\"__metadata__\" is not an object");
}

TEST(Safetensors, RejectsOverlapGapsAndTrailingBytes) {
  std::string overlap =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_rejected(raw_file(overlap, std::vector<uint8_t>(12)), "tensors 'a' and 'b' overlap");
  std::string gap =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  expect_rejected(raw_file(gap, std::vector<uint8_t>(12)), "gap of 4 bytes before tensor 'b'");
  std::string late = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  expect_rejected(raw_file(late, std::vector<uint8_t>(8)), "gap of 4 bytes before tensor 'a'");
  std::string trailing = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_rejected(raw_file(trailing, std::vector<uint8_t>(9)), "5 trailing bytes after the last tensor");
  std::string same =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  expect_rejected(raw_file(same, std::vector<uint8_t>(4)), "overlap");
}

TEST(Safetensors, TruncationsAndHeaderCorruptionNeverCrash) {
  std::vector<Entry> es = {{"a", "BF16", {3, 2}, bf16_bytes({1, 2, 3, 4, 5, 6})},
                           {"b", "I64", {2}, le_bytes(std::vector<int64_t>{1, 2})}};
  auto good = build(es, "{\"k\":\"v\"}");
  ASSERT_TRUE(parse(good).has_value());
  for (size_t n = 0; n < good.size(); ++n) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(parse(cut).has_value()) << "truncated to " << n;
  }
  // Flip bytes of the header: the result is either a valid file (that reads back cleanly) or
  // an error; never a crash or an out-of-bounds read (run under ASan in the sanitizer build).
  Rng rng(7);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto b = good;
    size_t n_flips = 1 + rng.below(3);
    for (size_t k = 0; k < n_flips; ++k) b[rng.below(b.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
    auto r = parse(b);
    if (!r) continue;
    ++accepted;
    for (const StTensor& t : (*r)->tensors()) {
      std::vector<float> f(t.n_elements());
      std::vector<int32_t> i(t.n_elements());
      (void)st_read_f32(t, f.data());
      (void)st_read_i32(t, i.data());
    }
  }
  EXPECT_LT(accepted, 3000);  // most corruptions are caught
}

// =================================================================================================
// block-scaled and integer readers
// =================================================================================================

TEST(SafetensorsReaders, Fp8BlockScaled) {
  // w [130, 3] F8_E4M3 with E8M0 scales [2, 1]: rows 0..127 scale 2^3, rows 128..129 scale 2^-2.
  const uint64_t R = 130, C = 3;
  std::vector<uint8_t> w(R * C);
  for (uint64_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>((i * 37 + 11) % 0x7E);  // finite codes
  std::vector<Entry> es = {{"l.weight", "F8_E4M3", {R, C}, w}, {"l.scale", "F8_E8M0", {2, 1}, {130, 125}}};
  auto f = parse(build(es));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const StTensor& wt = *(*f)->find("l.weight");
  const StTensor& st = *(*f)->find("l.scale");
  auto shape = st_scaled_logical_shape(wt, st, StScaledFormat::FP8_BLOCK);
  ASSERT_TRUE(shape.has_value()) << shape.error().message;
  EXPECT_EQ(*shape, (std::pair<uint64_t, uint64_t>{R, C}));
  std::vector<float> out(4 * C);
  ASSERT_TRUE(st_read_rows_f32_scaled(wt, st, StScaledFormat::FP8_BLOCK, 126, 4, out.data()).has_value());
  for (uint64_t r = 126; r < 130; ++r)
    for (uint64_t c = 0; c < C; ++c)
      EXPECT_EQ(out[(r - 126) * C + c], fp8_e4m3_decode(w[r * C + c]) * (r < 128 ? 8.0f : 0.25f)) << r << "," << c;
  // wrong scale shape, FP4 format on an FP8 tensor, NaN scale
  std::vector<Entry> bad_shape = {{"l.weight", "F8_E4M3", {R, C}, w}, {"l.scale", "F8_E8M0", {1, 1}, {127}}};
  auto g = parse(build(bad_shape));
  ASSERT_TRUE(g.has_value());
  auto e = st_read_rows_f32_scaled(*(*g)->find("l.weight"), *(*g)->find("l.scale"), StScaledFormat::FP8_BLOCK, 0, 1,
                                   out.data());
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("ceil(rows/128)"), std::string::npos) << e.error().message;
  EXPECT_FALSE(st_scaled_logical_shape(wt, st, StScaledFormat::FP4_PACKED).has_value());
  std::vector<Entry> nan_scale = {{"l.weight", "F8_E4M3", {R, C}, w}, {"l.scale", "F8_E8M0", {2, 1}, {0xFF, 127}}};
  auto n = parse(build(nan_scale));
  ASSERT_TRUE(n.has_value());
  EXPECT_FALSE(st_read_rows_f32_scaled(*(*n)->find("l.weight"), *(*n)->find("l.scale"), StScaledFormat::FP8_BLOCK, 0, 1,
                                       out.data())
                   .has_value());
  // An FP8 NaN code in the weight is an error too.
  std::vector<uint8_t> wn = w;
  wn[5] = 0x7F;
  std::vector<Entry> nan_w = {{"l.weight", "F8_E4M3", {R, C}, wn},
                              {"l.scale", "F32", {2, 1}, le_bytes(std::vector<float>{1, 1})}};
  auto m = parse(build(nan_w));
  ASSERT_TRUE(m.has_value());
  auto err = st_read_rows_f32_scaled(*(*m)->find("l.weight"), *(*m)->find("l.scale"), StScaledFormat::FP8_BLOCK, 0, 2,
                                     out.data());
  ASSERT_FALSE(err.has_value());
  EXPECT_NE(err.error().message.find("non-finite value at element 5"), std::string::npos) << err.error().message;
}

TEST(SafetensorsReaders, Fp4PackedLowNibbleFirst) {
  // logical [2, 64]: packed I8 [2, 32], scales [2, 2] (per 32 columns).
  std::vector<uint8_t> packed(2 * 32);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>((i * 29 + 3) & 0xFF);
  std::vector<Entry> es = {{"e.weight", "I8", {2, 32}, packed},
                           {"e.scale", "F8_E8M0", {2, 2}, {127, 128, 126, 129}}};  // 1, 2, 0.5, 4
  auto f = parse(build(es));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  const StTensor& w = *(*f)->find("e.weight");
  const StTensor& s = *(*f)->find("e.scale");
  std::vector<float> out(2 * 64);
  ASSERT_TRUE(st_read_rows_f32_scaled(w, s, StScaledFormat::FP4_PACKED, 0, 2, out.data()).has_value());
  const float scales[2][2] = {{1.0f, 2.0f}, {0.5f, 4.0f}};
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 64; ++c) {
      uint8_t byte = packed[r * 32 + c / 2];
      uint8_t nib = (c % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      EXPECT_EQ(out[r * 64 + c], fp4_e2m1_decode(nib) * scales[r][c / 32]) << r << "," << c;
    }
  // row 1 alone
  ASSERT_TRUE(st_read_rows_f32_scaled(w, s, StScaledFormat::FP4_PACKED, 1, 1, out.data()).has_value());
  EXPECT_EQ(out[1], fp4_e2m1_decode(packed[32] >> 4) * 0.5f);
}

TEST(SafetensorsReaders, IntegerRangeAndNonFiniteFloats) {
  std::vector<Entry> es = {
      {"big", "I64", {2, 1}, le_bytes(std::vector<int64_t>{1, int64_t(1) << 40})},
      {"ubig", "U64", {1}, le_bytes(std::vector<uint64_t>{uint64_t(1) << 63})},
      {"u32", "U32", {1}, le_bytes(std::vector<uint32_t>{0x80000000u})},
      {"b", "BOOL", {2}, {1, 2}},
      {"nan", "F32", {2}, le_bytes(std::vector<float>{1.0f, NAN})},
      {"inf", "BF16", {1}, bf16_bytes({INFINITY})},
  };
  auto f = parse(build(es));
  ASSERT_TRUE(f.has_value()) << f.error().message;
  std::vector<int32_t> iv(2);
  auto e = st_read_i32(*(*f)->find("big"), iv.data());
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("element 1 does not fit int32"), std::string::npos) << e.error().message;
  ASSERT_TRUE(st_read_rows_i32(*(*f)->find("big"), 0, 1, iv.data()).has_value());  // row 0 alone is fine
  EXPECT_FALSE(st_read_i32(*(*f)->find("ubig"), iv.data()).has_value());
  EXPECT_FALSE(st_read_i32(*(*f)->find("u32"), iv.data()).has_value());
  EXPECT_FALSE(st_read_i32(*(*f)->find("b"), iv.data()).has_value());
  std::vector<float> fv(2);
  auto n = st_read_f32(*(*f)->find("nan"), fv.data());
  ASSERT_FALSE(n.has_value());
  EXPECT_NE(n.error().message.find("non-finite value at element 1"), std::string::npos);
  EXPECT_FALSE(st_read_f32(*(*f)->find("inf"), fv.data()).has_value());
}

// =================================================================================================
// checkpoint folders
// =================================================================================================

TEST(HfCheckpoint, SingleFileFolderAndShards) {
  TempDir dir;
  auto s1 = build(
      {{"a", "F32", {2}, le_bytes(std::vector<float>{1, 2})}, {"b", "I64", {1}, le_bytes(std::vector<int64_t>{9})}});
  auto s2 = build({{"c", "BF16", {2}, bf16_bytes({3, 4})}});
  {
    TempDir single;
    single.write("model.safetensors", s1);
    auto ck = HfCheckpoint::open(single.path.string());
    ASSERT_TRUE(ck.has_value()) << ck.error().message;
    EXPECT_EQ((*ck)->tensors().size(), 2u);
    auto direct = HfCheckpoint::open((single.path / "model.safetensors").string());
    ASSERT_TRUE(direct.has_value());
    EXPECT_NE((*direct)->find("b"), nullptr);
  }
  dir.write("model-00001-of-00002.safetensors", s1);
  dir.write("model-00002-of-00002.safetensors", s2);
  dir.write_text("model.safetensors.index.json",
                 R"({"metadata":{"total_size":20},"weight_map":{"a":"model-00001-of-00002.safetensors",
                     "b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  auto ck = HfCheckpoint::open(dir.path.string());
  ASSERT_TRUE(ck.has_value()) << ck.error().message;
  ASSERT_EQ((*ck)->tensors().size(), 3u);
  EXPECT_EQ((*ck)->files().size(), 2u);
  EXPECT_EQ((*ck)->tensors()[2]->name, "c");  // sorted by name
  std::vector<float> v(2);
  ASSERT_TRUE(st_read_f32(*(*ck)->find("c"), v.data()).has_value());
  EXPECT_EQ(v, (std::vector<float>{3, 4}));
  EXPECT_EQ((*ck)->find("zz"), nullptr);
}

TEST(HfCheckpoint, RejectsInconsistentIndexes) {
  auto s1 =
      build({{"a", "F32", {1}, le_bytes(std::vector<float>{1})}, {"b", "F32", {1}, le_bytes(std::vector<float>{2})}});
  auto s2 = build({{"b", "F32", {1}, le_bytes(std::vector<float>{3})}});
  auto check = [&](const std::string& index, bool second_shard, const std::string& needle) {
    TempDir dir;
    dir.write("s1.safetensors", s1);
    if (second_shard) dir.write("s2.safetensors", s2);
    dir.write_text("model.safetensors.index.json", index);
    auto ck = HfCheckpoint::open(dir.path.string());
    ASSERT_FALSE(ck.has_value()) << needle;
    EXPECT_NE(ck.error().message.find(needle), std::string::npos) << ck.error().message;
  };
  check(R"({"weight_map":{"a":"s1.safetensors"}})", false, "does not assign to it");  // b unlisted
  check(R"({"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","c":"s1.safetensors"}})", false,
        "'c' is listed in shard 's1.safetensors' but that shard does not contain it");
  check(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})", true, "appears in two files");
  check(R"({"weight_map":{"a":"../s1.safetensors"}})", false, "unsafe shard path");
  check(R"({"weight_map":{"a":"/etc/passwd"}})", false, "unsafe shard path");
  check(R"({"weight_map":{"a":3}})", false, "not a file name string");
  check(R"({"weight_map":{}})", false, "is empty");
  check(R"({"nothing":1})", false, "missing \"weight_map\"");
  check(R"({"weight_map":{"a":"missing.safetensors"}})", false, "cannot open");
  check("{oops", false, "JSON syntax error");
  TempDir empty;
  auto ck = HfCheckpoint::open(empty.path.string());
  ASSERT_FALSE(ck.has_value());
  EXPECT_NE(ck.error().message.find("neither model.safetensors.index.json nor model.safetensors"), std::string::npos);
  EXPECT_FALSE(HfCheckpoint::open((empty.path / "nope").string()).has_value());
}

// =================================================================================================
// config.json
// =================================================================================================
