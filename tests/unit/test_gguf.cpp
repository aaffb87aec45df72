// GGUF reader/writer: round trip of every value type, and a table of
// handcrafted corrupt files that must each be rejected with a clear error.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "gguf/gguf.h"

using namespace dsv4;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("dsv4_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::vector<uint8_t> read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Raw byte builder for handcrafted files.
struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  Bytes& put(T v) {
    uint8_t x[sizeof(T)];
    std::memcpy(x, &v, sizeof v);
    b.insert(b.end(), x, x + sizeof v);
    return *this;
  }
  Bytes& str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3, uint32_t magic = k_gguf_magic) {
    return put<uint32_t>(magic).put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
  }
  Bytes& kv_u32(std::string_view key, uint32_t v) { return str(key).put<uint32_t>(4).put<uint32_t>(v); }
  Bytes& tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) put<uint64_t>(d);
    return put<uint32_t>(type).put<uint64_t>(offset);
  }
  Bytes& pad_to(size_t align) {
    while (b.size() % align) b.push_back(0);
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.insert(b.end(), n, 0);
    return *this;
  }
};

std::string parse_error(const std::vector<uint8_t>& bytes) {
  auto f = GgufFile::from_memory(bytes.data(), bytes.size(), "corrupt");
  if (f) return "";
  return f.error().message;
}

}  // namespace

TEST(Gguf, RoundTripEveryValueType) {
  GgufWriter w;
  w.set_u8("t.u8", 200);
  w.set_i8("t.i8", -100);
  w.set_u16("t.u16", 60000);
  w.set_i16("t.i16", -30000);
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_u64("t.u64", 18000000000000000000ull);
  w.set_i64("t.i64", -9000000000000000000ll);
  w.set_f32("t.f32", 1.5f);
  w.set_f64("t.f64", -2.25e100);
  w.set_bool("t.bool", true);
  w.set_string("t.str", "h\xc3\xa9llo \xef\xbd\x9c");
  w.set_array_u32("t.au32", {1, 2, 3});
  w.set_array_i32("t.ai32", {-1, 0, 7});
  w.set_array_f32("t.af32", {0.5f, -1.0f});
  w.set_array_string("t.astr", {"a", "", "<\xef\xbd\x9cUser\xef\xbd\x9c>"});
  // A nested array (array of two u8 arrays), encoded by hand.
  Bytes nested;
  nested.put<uint32_t>(9).put<uint64_t>(2);
  nested.put<uint32_t>(0).put<uint64_t>(2).put<uint8_t>(1).put<uint8_t>(2);
  nested.put<uint32_t>(0).put<uint64_t>(1).put<uint8_t>(3);
  w.set_raw("t.nested", GgufType::ARRAY, nested.b);

  std::vector<float> f32 = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> f16(64, 0x3c00);
  w.add_tensor("a", GgmlType::F32, {3, 2}, [&](uint64_t r0, uint64_t nr, uint8_t* dst) -> Status {
    std::memcpy(dst, f32.data() + r0 * 3, nr * 3 * 4);
    return {};
  });
  w.add_tensor("b", GgmlType::F16, {32, 2}, [&](uint64_t r0, uint64_t nr, uint8_t* dst) -> Status {
    std::memcpy(dst, f16.data() + r0 * 32, nr * 32 * 2);
    return {};
  });
  std::string path = temp_path("roundtrip.gguf");
  ASSERT_TRUE(w.write(path, {}, 16).has_value());  // tiny chunks: exercises the row-chunked fill
  EXPECT_EQ(std::filesystem::file_size(path), w.file_bytes());

  auto fr = GgufFile::open(path);
  ASSERT_TRUE(fr.has_value()) << fr.error().message;
  const GgufFile& f = **fr;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.kvs().size(), 17u);
  EXPECT_EQ(f.get_scalar("t.u8")->u, 200u);
  EXPECT_EQ(f.get_scalar("t.i8")->i, -100);
  EXPECT_EQ(f.get_scalar("t.u16")->u, 60000u);
  EXPECT_EQ(f.get_scalar("t.i16")->i, -30000);
  EXPECT_EQ(f.get_scalar("t.u32")->u, 4000000000u);
  EXPECT_EQ(f.get_scalar("t.i32")->i, -2000000000);
  EXPECT_EQ(f.get_scalar("t.u64")->u, 18000000000000000000ull);
  EXPECT_EQ(f.get_scalar("t.i64")->i, -9000000000000000000ll);
  EXPECT_EQ(f.get_scalar("t.f32")->f, 1.5);
  EXPECT_EQ(f.get_scalar("t.f64")->f, -2.25e100);
  EXPECT_EQ(f.get_scalar("t.bool")->u, 1u);
  EXPECT_EQ(*f.get_string("t.str"), "h\xc3\xa9llo \xef\xbd\x9c");
  auto au32 = f.get_array("t.au32");
  ASSERT_TRUE(au32.has_value());
  ASSERT_EQ(au32->size(), 3u);
  EXPECT_EQ((*au32)[2].u, 3u);
  EXPECT_EQ((*f.get_array("t.ai32"))[0].i, -1);
  EXPECT_EQ((*f.get_array("t.af32"))[1].f, -1.0);
  auto astr = f.get_array("t.astr");
  ASSERT_TRUE(astr.has_value());
  ASSERT_EQ(astr->size(), 3u);
  EXPECT_EQ((*astr)[1].s, "");
  EXPECT_EQ((*astr)[2].s, "<\xef\xbd\x9cUser\xef\xbd\x9c>");
  const GgufKV* nk = f.find("t.nested");
  ASSERT_NE(nk, nullptr);
  EXPECT_EQ(nk->elem_type, GgufType::ARRAY);
  EXPECT_EQ(nk->count, 2u);
  EXPECT_FALSE(GgufFile::array(*nk).has_value());  // nested arrays are walked, not flattened
  EXPECT_EQ(gguf_value_to_string(*nk), "[array of 2 arrays]");

  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo* a = f.find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->shape_string(), "[3, 2]");
  EXPECT_EQ(a->n_bytes, 24u);
  EXPECT_EQ(std::memcmp(f.tensor_data(*a), f32.data(), 24), 0);
  const GgufTensorInfo* b = f.find_tensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->rel_offset % 32, 0u);
  EXPECT_EQ(std::memcmp(f.tensor_data(*b), f16.data(), 128), 0);
  EXPECT_EQ(f.tensor_data_bytes(), 24u + 128u);

  // Copying KVs verbatim reproduces identical metadata.
  GgufWriter w2;
  for (const auto& kv : f.kvs()) w2.copy_kv(f, kv);
  std::string path2 = temp_path("copy.gguf");
  ASSERT_TRUE(w2.write(path2).has_value());
  auto f2 = GgufFile::open(path2);
  ASSERT_TRUE(f2.has_value()) << f2.error().message;
  ASSERT_EQ((*f2)->kvs().size(), f.kvs().size());
  for (size_t i = 0; i < f.kvs().size(); ++i) {
    EXPECT_EQ((*f2)->kvs()[i].key, f.kvs()[i].key);
    EXPECT_EQ(gguf_value_to_string((*f2)->kvs()[i], 100), gguf_value_to_string(f.kvs()[i], 100));
  }
  std::filesystem::remove(path);
  std::filesystem::remove(path2);
}

TEST(Gguf, CustomAlignment) {
  GgufWriter w(64);
  std::vector<float> v(8, 1.0f);
  for (const char* n : {"x", "y"})
    w.add_tensor(n, GgmlType::F32, {8}, [&](uint64_t, uint64_t, uint8_t* dst) -> Status {
      std::memcpy(dst, v.data(), 32);
      return {};
    });
  std::string path = temp_path("align.gguf");
  ASSERT_TRUE(w.write(path).has_value());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ((*f)->find_tensor("y")->rel_offset, 64u);
  std::filesystem::remove(path);
}

TEST(Gguf, WriterReportsFillErrorsAndLeavesNoFile) {
  GgufWriter w;
  w.add_tensor("x", GgmlType::F32, {4}, [](uint64_t, uint64_t, uint8_t*) -> Status { return make_error("boom"); });
  std::string path = temp_path("fail.gguf");
  auto st = w.write(path);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("boom"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

// write_mapped: the same bytes as write() (padding, alignment, rows split across
// write()'s chunks), through a file and through a memfd; a failing fill leaves nothing.
TEST(Gguf, MappedWriterWritesTheSameBytes) {
  GgufWriter w(64);
  w.set_string("general.name", "mapped");
  w.set_array_string("list", {"a", "bc", ""});
  std::vector<float> v(3 * 7);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f - 3.0f;
  w.add_tensor("a", GgmlType::F32, {7, 3}, [&](uint64_t r0, uint64_t nr, uint8_t* dst) -> Status {
    std::memcpy(dst, v.data() + r0 * 7, nr * 7 * sizeof(float));
    return {};
  });
  w.add_tensor("b", GgmlType::F32, {5}, [&](uint64_t, uint64_t, uint8_t* dst) -> Status {
    std::memcpy(dst, v.data(), 5 * sizeof(float));
    return {};
  });
  const std::string p1 = temp_path("streamed.gguf"), p2 = temp_path("mapped.gguf");
  ASSERT_TRUE(w.write(p1, {}, 28).has_value());  // one row per chunk
  uint64_t last = 0;
  ASSERT_TRUE(w.write_mapped(p2, [&](uint64_t done, uint64_t total) {
                 last = done;
                 EXPECT_LE(done, total);
               }).has_value());
  EXPECT_EQ(last, w.file_bytes());
  const std::string a = read_all(p1), b = read_all(p2);
  EXPECT_EQ(a.size(), w.file_bytes());
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(std::filesystem::exists(p2 + ".tmp"));

  const int fd = ::memfd_create("dsv4-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(w.write_mapped(fd, "memfd").has_value());
  auto f = GgufFile::open("/proc/self/fd/" + std::to_string(fd));
  ::close(fd);
  ASSERT_TRUE(f.has_value()) << f.error().message;
  ASSERT_NE((*f)->find_tensor("a"), nullptr);
  EXPECT_EQ(std::memcmp((*f)->tensor_data(*(*f)->find_tensor("a")), v.data(), v.size() * sizeof(float)), 0);
  std::filesystem::remove(p1);
  std::filesystem::remove(p2);

  GgufWriter bad;
  bad.add_tensor("x", GgmlType::F32, {4}, [](uint64_t, uint64_t, uint8_t*) -> Status { return make_error("boom"); });
  const std::string p3 = temp_path("mapped-fail.gguf");
  auto st = bad.write_mapped(p3);
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("boom"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(p3));
  EXPECT_FALSE(std::filesystem::exists(p3 + ".tmp"));
}

TEST(Gguf, WriterReportsUnwritableDirectory) {
  GgufWriter w;
  auto st = w.write("/nonexistent-dir-dsv4/x.gguf");
  ASSERT_FALSE(st.has_value());
  EXPECT_NE(st.error().message.find("cannot create"), std::string::npos);
}

TEST(Gguf, OpenMissingFile) {
  auto f = GgufFile::open("/nonexistent-dsv4.gguf");
  ASSERT_FALSE(f.has_value());
  EXPECT_NE(f.error().message.find("cannot open"), std::string::npos);
}

struct CorruptCase {
  const char* name;
  std::vector<uint8_t> bytes;
  const char* expect;  // substring of the error
};

// A valid one-tensor file used as the base of several corruptions.
static Bytes valid_file(uint64_t offset = 0, uint32_t type = 0, std::vector<uint64_t> ne = {4}) {
  Bytes b;
  b.header(1, 1).kv_u32("k", 1).tensor("t", ne, type, offset).pad_to(32).zeros(64);
  return b;
}

TEST(Gguf, CorruptFilesAreRejectedCleanly) {
  std::vector<CorruptCase> cases;
  cases.push_back({"empty", {}, "not a GGUF file"});
  cases.push_back({"short", Bytes().put<uint32_t>(k_gguf_magic).b, "not a GGUF file"});
  cases.push_back({"bad magic", Bytes().header(0, 0, 3, 0x12345678).b, "bad magic"});
  cases.push_back({"version 2", Bytes().header(0, 0, 2).b, "unsupported GGUF version 2"});
  cases.push_back({"absurd kv count", Bytes().header(0, 1ull << 60).b, "absurd metadata count"});
  cases.push_back({"absurd tensor count", Bytes().header(1ull << 60, 0).b, "absurd tensor count"});
  {
    Bytes b;
    b.header(0, 1).put<uint64_t>(1000).put<uint8_t>('k');
    cases.push_back({"key runs past end", b.b, "truncated"});
  }
  {
    Bytes b;
    b.header(0, 2).kv_u32("dup", 1).kv_u32("dup", 2);
    cases.push_back({"duplicate key", b.b, "duplicate metadata key \"dup\""});
  }
  {
    Bytes b;
    b.header(0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
    cases.push_back({"unknown value type", b.b, "unknown value type 13"});
  }
  {
    Bytes b;
    b.header(0, 1).str("k").put<uint32_t>(8).put<uint64_t>(1ull << 40);
    cases.push_back({"string past end", b.b, "truncated file"});
  }
  {
    Bytes b;
    b.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1ull << 50);
    cases.push_back({"absurd string array", b.b, "absurd array length"});
  }
  {
    Bytes b;
    b.header(0, 1).str("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(1ull << 50);
    cases.push_back({"absurd u32 array", b.b, "runs past the end"});
  }
  {
    Bytes b;
    b.header(0, 1).str("k");
    b.put<uint32_t>(9);
    for (int d = 0; d < 10; ++d) b.put<uint32_t>(9).put<uint64_t>(1);
    b.put<uint32_t>(0).put<uint64_t>(0).zeros(64);
    cases.push_back({"arrays nested too deep", b.b, "nested deeper than 8"});
  }
  {
    Bytes b;
    b.header(0, 1).kv_u32("k\xff", 1);
    cases.push_back({"non-UTF-8 key", b.b, "not valid UTF-8"});
  }
  {
    Bytes b;
    b.header(0, 1).kv_u32("general.alignment", 24);
    cases.push_back({"alignment not a power of two", b.b, "not a power of two"});
  }
  {
    Bytes b;
    b.header(0, 1).str("general.alignment").put<uint32_t>(8).str("32");
    cases.push_back({"alignment wrong type", b.b, "general.alignment must be a u32"});
  }
  {
    Bytes b;
    b.header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad_to(32).zeros(64);
    cases.push_back({"duplicate tensor name", b.b, "duplicate tensor name \"t\""});
  }
  cases.push_back({"unknown tensor type", valid_file(0, 4).b, "unknown ggml type 4"});
  cases.push_back({"unknown tensor type 2", valid_file(0, 1000).b, "unknown ggml type 1000"});
  {
    Bytes b;
    b.header(1, 0).str("t").put<uint32_t>(0).put<uint32_t>(0).put<uint64_t>(0).pad_to(32);
    cases.push_back({"zero dims", b.b, "has 0 dimensions"});
  }
  {
    Bytes b;
    b.header(1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0).pad_to(32).zeros(32);
    cases.push_back({"five dims", b.b, "has 5 dimensions"});
  }
  cases.push_back({"zero dimension", valid_file(0, 0, {4, 0}).b, "zero dimension"});
  cases.push_back({"element count overflow", valid_file(0, 0, {1ull << 32, 1ull << 32}).b, "overflows"});
  cases.push_back({"row not a block multiple", valid_file(0, 8, {33}).b, "not a multiple of the Q8_0 block size"});
  cases.push_back({"misaligned offset", valid_file(4).b, "not a multiple of the alignment"});
  cases.push_back({"tensor past end", valid_file(0, 0, {1000}).b, "runs past the end of the file"});
  {
    Bytes b;
    b.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad_to(32).zeros(128);
    cases.push_back({"overlapping tensors", b.b, "tensor data overlaps"});
  }
  {
    Bytes b;
    b.header(1, 0).str("t").put<uint32_t>(1).put<uint64_t>(4);  // type and offset missing
    cases.push_back({"truncated tensor info", b.b, "truncated"});
  }
  {
    Bytes b;
    b.header(1, 0).tensor("t", {4}, 0, 0);  // data section missing entirely
    cases.push_back({"no data section", b.b, "truncated file"});
  }

  ASSERT_GE(cases.size(), 12u);
  for (const auto& c : cases) {
    std::string err = parse_error(c.bytes);
    EXPECT_NE(err, "") << c.name << ": accepted";
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": error was \"" << err << "\"";
  }
  // The base file itself is valid.
  EXPECT_EQ(parse_error(valid_file().b), "");
}

TEST(Gguf, EveryTruncationOfAValidFileIsRejected) {
  GgufWriter w;
  w.set_string("general.name", "x");
  w.set_array_string("tokens", {"a", "bc", "def"});
  std::vector<float> v(64, 2.0f);
  w.add_tensor("t", GgmlType::F32, {64}, [&](uint64_t, uint64_t, uint8_t* dst) -> Status {
    std::memcpy(dst, v.data(), 256);
    return {};
  });
  std::string path = temp_path("trunc.gguf");
  ASSERT_TRUE(w.write(path).has_value());
  auto bytes = read_file(path);
  std::filesystem::remove(path);
  ASSERT_EQ(parse_error(bytes), "");
  // The tensor's 256 bytes end exactly at the end of the file (no padding), so
  // every proper prefix lacks something and must be rejected.
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto f = GgufFile::from_memory(bytes.data(), n);
    EXPECT_FALSE(f.has_value()) << "truncated at " << n << " of " << bytes.size() << " accepted";
  }
}
