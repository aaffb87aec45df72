// The model content identity (kv/model_identity.h): the documented two-level
// tree hash, every byte counting, any thread count giving the same value; and
// the identities remembered in a cache directory (kv/model_identity_store.h):
// exact stamp and path keys, at most 8 entries, garbage and untrusted files
// ignored and rewritten, and DiskCache::open asking for the identity only
// after the directory passed its checks.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "kv/disk_cache.h"
#include "kv/model_identity.h"
#include "kv/model_identity_store.h"
#include "kv_test_util.h"

using namespace dsv4;
using kvtest::TempDir;

namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> b(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : b) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v = static_cast<uint8_t>(x);
  }
  return b;
}

std::string fingerprint(uint8_t tag) { return std::string(32, static_cast<char>(tag)); }

Digest identity_of(const std::vector<uint8_t>& bytes, const std::string& fp, int threads = 4) {
  auto file = MappedFile::from_memory(bytes.data(), bytes.size(), "<test>");
  return model_content_identity(*file, fp, threads);
}

// The construction of kv/model_identity.h written out independently.
Digest documented_identity(const std::vector<uint8_t>& bytes, const std::string& fp) {
  const uint64_t n = bytes.size(), c = uint64_t{16} << 20;
  std::vector<uint8_t> root;
  const std::string tag = "dsv4-model-id-v1";
  root.insert(root.end(), tag.begin(), tag.end());
  root.insert(root.end(), fp.begin(), fp.end());
  for (uint64_t v : {n, c})
    for (int i = 0; i < 8; ++i) root.push_back(static_cast<uint8_t>(v >> (8 * i)));
  for (uint64_t off = 0; off < n; off += c) {
    const Digest leaf = sha256_digest(bytes.data() + off, static_cast<size_t>(std::min(c, n - off)));
    root.insert(root.end(), leaf.begin(), leaf.end());
  }
  return sha256_digest(root.data(), root.size());
}

// A directory with its descriptor open, as DiskCache hands it to the store.
struct StoreDir {
  TempDir tmp;
  int fd = -1;
  explicit StoreDir(const std::string& tag) : tmp(tag) {
    std::filesystem::create_directories(tmp.path);
    ::chmod(tmp.path.c_str(), 0700);
    fd = ::open(tmp.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  ~StoreDir() { ::close(fd); }
  ModelIdentityStore store() const { return ModelIdentityStore(fd, tmp.path); }
  std::string file() const { return tmp.file(ModelIdentityStore::k_file_name); }
  std::string text() const {
    auto b = kvtest::read_bytes(file());
    return std::string(b.begin(), b.end());
  }
  void write(const std::string& s) const {
    kvtest::write_bytes(file(), std::vector<uint8_t>(s.begin(), s.end()));
    ::chmod(file().c_str(), 0600);
  }
};

ModelFileKey key(const std::string& path, uint64_t ino = 1234) {
  return ModelFileKey{path, FileStamp{2049, ino, 7340032, 1700000000123456789, 1700000001987654321}};
}

Digest digest(uint8_t v) {
  Digest d;
  d.fill(v);
  return d;
}

std::string line_of(const ModelFileKey& k, const Digest& id) {
  return digest_hex(id) + " " + std::to_string(k.stamp.dev) + " " + std::to_string(k.stamp.ino) + " " +
         std::to_string(k.stamp.size) + " " + std::to_string(k.stamp.mtime_ns) + " " +
         std::to_string(k.stamp.ctime_ns) + " " + k.path + "\n";
}

}  // namespace

TEST(ModelIdentity, IsTheDocumentedTreeHash) {
  // Three leaves, the last one short; and a file of one short leaf.
  const auto big = pattern((size_t{40} << 20) + 5, 1);
  const auto fp = fingerprint(7);
  EXPECT_EQ(identity_of(big, fp), documented_identity(big, fp));
  const auto small = pattern(100000, 2);
  EXPECT_EQ(identity_of(small, fp), documented_identity(small, fp));
  // Any number of threads, the same value; progress reaches the total, one call per leaf.
  auto file = MappedFile::from_memory(big.data(), big.size(), "<test>");
  std::vector<uint64_t> seen;
  const Digest one = model_content_identity(*file, fp, 1, [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, big.size());
    seen.push_back(done);
  });
  EXPECT_EQ(one, identity_of(big, fp, 3));
  EXPECT_EQ(one, identity_of(big, fp, 0));
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.back(), big.size());
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
}

TEST(ModelIdentity, EveryByteCounts) {
  const auto base = pattern((size_t{20} << 20) + 3, 3);
  const auto fp = fingerprint(1);
  const Digest id = identity_of(base, fp);
  // The first, a middle, a leaf-boundary and the last byte; a longer file; another fingerprint.
  for (size_t at : {size_t{0}, base.size() / 2, size_t{16} << 20, (size_t{16} << 20) - 1, base.size() - 1}) {
    auto b = base;
    b[at] ^= 0x01;
    EXPECT_NE(identity_of(b, fp), id) << at;
  }
  auto longer = base;
  longer.push_back(0);
  EXPECT_NE(identity_of(longer, fp), id);
  EXPECT_NE(identity_of(base, fingerprint(2)), id);
}

TEST(ModelIdentityStore, RemembersByPathAndEveryStampField) {
  StoreDir d("idstore_keys");
  auto s = d.store();
  EXPECT_FALSE(s.find(key("/models/a.gguf")).has_value());  // no file yet
  ASSERT_TRUE(s.remember(key("/models/a.gguf"), digest(0xa1)).has_value());
  EXPECT_EQ(kvtest::mode_of(d.file()), 0600u);
  const std::string first = std::string(ModelIdentityStore::k_first_line) + "\n";
  EXPECT_EQ(d.text(), first + line_of(key("/models/a.gguf"), digest(0xa1)));
  EXPECT_EQ(s.find(key("/models/a.gguf")), digest(0xa1));
  // Each stamp field and the path must match.
  for (int field = 0; field < 6; ++field) {
    ModelFileKey k = key("/models/a.gguf");
    switch (field) {
      case 0: k.stamp.dev += 1; break;
      case 1: k.stamp.ino += 1; break;
      case 2: k.stamp.size += 1; break;
      case 3: k.stamp.mtime_ns += 1; break;
      case 4: k.stamp.ctime_ns += 1; break;
      case 5: k.path = "/models/b.gguf"; break;
    }
    EXPECT_FALSE(s.find(k).has_value()) << field;
  }
  // Paths the format cannot hold are neither stored nor looked up.
  for (const std::string& p : {std::string("relative.gguf"), std::string("/a\nb.gguf"), "/" + std::string(5000, 'x')}) {
    EXPECT_FALSE(s.remember(key(p), digest(1)).has_value()) << p;
    EXPECT_FALSE(s.find(key(p)).has_value());
  }
  EXPECT_EQ(s.find(key("/models/a.gguf")), digest(0xa1));
}

TEST(ModelIdentityStore, KeepsTheLastEightOnePerPath) {
  StoreDir d("idstore_bound");
  auto s = d.store();
  for (int i = 0; i < 10; ++i)
    ASSERT_TRUE(s.remember(key("/m/" + std::to_string(i)), digest(static_cast<uint8_t>(i))).has_value());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.find(key("/m/" + std::to_string(i))).has_value(), i >= 2) << i;
  // A new stamp of a known path replaces its entry.
  ASSERT_TRUE(s.remember(key("/m/9", 99), digest(0x99)).has_value());
  EXPECT_FALSE(s.find(key("/m/9")).has_value());
  EXPECT_EQ(s.find(key("/m/9", 99)), digest(0x99));
  const std::string t = d.text();
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 9);  // the first line + 8 entries
  EXPECT_EQ(t.find(ModelIdentityStore::k_first_line), 0u);
  EXPECT_NE(t.find(line_of(key("/m/9", 99), digest(0x99))), std::string::npos);
  // No temporary file is left behind.
  for (const auto& e : std::filesystem::directory_iterator(d.tmp.path))
    EXPECT_EQ(e.path().filename().string(), ModelIdentityStore::k_file_name);
}

TEST(ModelIdentityStore, GarbageIsIgnoredAndRewritten) {
  StoreDir d("idstore_garbage");
  auto s = d.store();
  const ModelFileKey k = key("/models/a.gguf");
  const std::string first = std::string(ModelIdentityStore::k_first_line) + "\n";
  testing::internal::CaptureStderr();
  // Random bytes; the right content under another first line; a file beyond the size limit.
  const auto noise = pattern(3000, 9);
  d.write(std::string(noise.begin(), noise.end()));
  EXPECT_FALSE(s.find(k).has_value());
  d.write("dsv4 model identity v2\n" + line_of(k, digest(1)));
  EXPECT_FALSE(s.find(k).has_value());
  d.write(first + line_of(k, digest(1)) + std::string(ModelIdentityStore::k_max_file_bytes, '#'));
  EXPECT_FALSE(s.find(k).has_value());
  // Malformed lines are skipped one by one; the valid entry among them is used.
  const std::string good = line_of(k, digest(2));
  std::string bad_lines;
  for (const std::string& l : {std::string("zz") + good.substr(2),                                // not hex
                               digest_hex(digest(3)).substr(0, 60) + good.substr(64),             // short hex
                               good.substr(0, 65) + "0" + good.substr(65),                        // leading zero in dev
                               good.substr(0, 65) + "+" + good.substr(65),                        // a sign
                               good.substr(0, 65) + "99999999999999999999999" + good.substr(69),  // overflow
                               good.substr(0, good.rfind(' ')) + " relative/path\n",              // a relative path
                               good.substr(0, good.rfind(' ')) + "\n",                            // a field missing
                               std::string("\n")})
    bad_lines += l;
  d.write(first + bad_lines + good + "deadbeef unterminated");
  EXPECT_EQ(s.find(k), digest(2));
  // A file others may write, a symlink, a FIFO: not read (and nothing blocks).
  d.write(first + good);
  ::chmod(d.file().c_str(), 0666);
  EXPECT_FALSE(s.find(k).has_value());
  const std::string elsewhere = d.tmp.file("elsewhere");
  std::filesystem::rename(d.file(), elsewhere);
  ::chmod(elsewhere.c_str(), 0600);
  std::filesystem::create_symlink(elsewhere, d.file());
  EXPECT_FALSE(s.find(k).has_value());
  std::filesystem::remove(d.file());
  ASSERT_EQ(::mkfifo(d.file().c_str(), 0600), 0);
  EXPECT_FALSE(s.find(k).has_value());
  std::filesystem::remove(d.file());
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("ignoring"), std::string::npos) << err;
  EXPECT_NE(err.find("malformed lines ignored"), std::string::npos) << err;
  // The next remember() writes a valid file again, keeping only valid entries.
  d.write(first + bad_lines + line_of(key("/models/b.gguf"), digest(4)));
  testing::internal::CaptureStderr();
  ASSERT_TRUE(s.remember(k, digest(5)).has_value());
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(d.text(), first + line_of(k, digest(5)) + line_of(key("/models/b.gguf"), digest(4)));
  EXPECT_EQ(s.find(k), digest(5));
}

TEST(ModelIdentityStore, DiskCacheAsksForTheIdentityOnlyInAUsableDirectory) {
  TempDir tmp("idstore_open");
  std::filesystem::create_directories(tmp.file("shared"));
  ::chmod(tmp.file("shared").c_str(), 0777);
  int asked = 0;
  std::string store_path;
  auto source = [&](ModelIdentityStore& s) {
    ++asked;
    store_path = s.path();
    return kvtest::test_identity();
  };
  DiskCacheOptions o;
  o.dir = tmp.file("shared");
  EXPECT_FALSE(DiskCache::open(o, source).has_value());
  EXPECT_EQ(asked, 0);
  // A usable directory: asked once, with the store of that directory; the scan leaves the store's file alone.
  o.dir = tmp.file("kv");
  {
    auto c = DiskCache::open(o, source);
    ASSERT_TRUE(c.has_value()) << c.error().message;
    EXPECT_EQ(asked, 1);
    EXPECT_EQ(store_path, tmp.file("kv") + "/" + ModelIdentityStore::k_file_name);
  }
  int dir_fd = ::open(o.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_TRUE(ModelIdentityStore(dir_fd, o.dir).remember(key("/models/a.gguf"), digest(1)).has_value());
  ::close(dir_fd);
  auto c = DiskCache::open(o, source);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->get()->stats().rejected, 0u);
  EXPECT_TRUE(std::filesystem::exists(store_path));
}
