#include "kv/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>
#include <set>
#include <system_error>

#include "core/fd_io.h"
#include "core/log.h"
#include "kv/snapshot.h"

namespace dsv4 {

namespace {

constexpr size_t k_text_probe = 32;  // bytes of the key text's tail kept in the index
constexpr size_t k_token_probe = 8;  // token ids of the tail kept in the index
constexpr size_t k_write_chunk = size_t{8} << 20;
constexpr uint64_t k_stale_temp_seconds = 24 * 3600;

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

// A unique temporary name in the cache directory. Temporary names start with a
// dot and hold ".tmp.<pid>.", so a scan never mistakes them for cache files and
// can tell whether their writer is still alive.
std::string temp_name(const std::string& base) {
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = std::random_device{}();
  return strfmt(".%s.tmp.%ld.%08x.%llu", base.c_str(), static_cast<long>(::getpid()), salt,
                static_cast<unsigned long long>(counter.fetch_add(1)));
}

// The writer pid of a temporary name, or -1 when `name` is not one.
long temp_name_pid(const std::string& name) {
  if (name.empty() || name[0] != '.') return -1;
  size_t at = name.find(".tmp.");
  if (at == std::string::npos) return -1;
  long pid = 0;
  size_t i = at + 5;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) pid = pid * 10 + (name[i] - '0');
  return pid;
}

std::string read_error_text(int e) { return e < 0 ? std::string("unexpected end of file") : errno_text(e); }

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

int64_t mtime_ns(const struct stat& st) { return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec; }

// log2 of an entry's value (see evict_to_budget); log space avoids underflow for old files.
double log_value(const CacheEntry& e, uint64_t now, double half_life) {
  const uint64_t last = std::max(e.usage.last_used, e.header.created);
  const double age = now > last ? static_cast<double>(now - last) : 0.0;
  return std::log2(1.0 + e.usage.hits) - age / half_life +
         std::log2(static_cast<double>(e.header.n_tokens) / static_cast<double>(e.file_bytes));
}

}  // namespace

const char* store_outcome_name(StoreOutcome o) {
  switch (o) {
    case StoreOutcome::WRITTEN: return "written";
    case StoreOutcome::ALREADY_PRESENT: return "already present";
    case StoreOutcome::OVER_BUDGET: return "over budget";
    case StoreOutcome::READ_ONLY: return "read-only";
  }
  return "?";
}

DiskCache::DiskCache(DiskCacheOptions options, const KvIdentity& identity, int dir_fd)
    : options_(std::move(options)), identity_(identity), dir_fd_(dir_fd) {
  stats_.budget_bytes = options_.budget_bytes;
  stats_.writable = true;
}

DiskCache::~DiskCache() {
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

uint64_t DiskCache::now() const {
  if (options_.clock) return options_.clock();
  return static_cast<uint64_t>(std::time(nullptr));
}

expected<std::unique_ptr<DiskCache>> DiskCache::open(DiskCacheOptions options, const KvIdentity& identity) {
  return open(std::move(options), [&identity](ModelIdentityStore&) { return identity; });
}

expected<std::unique_ptr<DiskCache>> DiskCache::open(DiskCacheOptions options, const IdentitySource& identity) {
  const std::string dir = options.dir;  // a copy: `options` is moved into the store below, messages still name it
  if (dir.empty()) return make_error("the KV cache directory is empty");
  if (options.budget_bytes == 0) return make_error("the KV cache budget is 0 bytes");
  if (!(options.half_life_seconds > 0)) return make_error("the KV cache half-life must be positive");
  bool created = false;
  {
    std::error_code ec;
    std::filesystem::path p(dir);
    if (p.has_parent_path() && !std::filesystem::exists(p.parent_path(), ec))
      std::filesystem::create_directories(p.parent_path(), ec);
    if (::mkdir(dir.c_str(), 0700) == 0) {
      created = true;
    } else if (errno != EEXIST) {
      return make_error("cannot create the KV cache directory %s: %s", dir.c_str(), errno_text(errno).c_str());
    }
  }
  Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const int fd = dir_fd.fd;
  if (fd < 0) return make_error("cannot open the KV cache directory %s: %s", dir.c_str(), errno_text(errno).c_str());
  struct stat st;
  if (::fstat(fd, &st) != 0) return make_error("cannot stat %s: %s", dir.c_str(), errno_text(errno).c_str());
  if (created) ::fchmod(fd, 0700);
  if (st.st_uid != ::geteuid())
    return make_error("the KV cache directory %s belongs to another user (uid %u); use a directory of your own",
                      dir.c_str(), static_cast<unsigned>(st.st_uid));
  if (!created && (st.st_mode & 022))
    return make_error(
        "the KV cache directory %s is writable by group or others (mode %03o); chmod 700 it or use a private "
        "directory",
        dir.c_str(), static_cast<unsigned>(st.st_mode & 0777));
  // A probe write tells an unwritable directory (read-only mount, permissions) now, not at the first save.
  {
    const std::string probe = temp_name("probe");
    int pf = ::openat(fd, probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (pf < 0)
      return make_error("cannot write in the KV cache directory %s: %s", dir.c_str(), errno_text(errno).c_str());
    const uint8_t one = 1;
    int e = write_all(pf, &one, 1);
    if (e == 0 && ::fsync(pf) != 0) e = errno;
    ::close(pf);
    ::unlinkat(fd, probe.c_str(), 0);
    if (e != 0) return make_error("cannot write in the KV cache directory %s: %s", dir.c_str(), errno_text(e).c_str());
  }
  ModelIdentityStore remembered(fd, dir);
  const KvIdentity id = identity(remembered);
  std::unique_ptr<DiskCache> c(new DiskCache(std::move(options), id, fd));
  dir_fd.fd = -1;  // owned by the store now
  {
    std::lock_guard<std::mutex> lock(c->mu_);
    c->rescan_locked();
    c->evict_locked("");
  }
  return c;
}

void DiskCache::remove_invalid_locked(const std::string& name, uint64_t dev, uint64_t ino, const std::string& why) {
  log_warn("KV disk cache: removing %s/%s: %s", options_.dir.c_str(), name.c_str(), why.c_str());
  // Only the file that was judged: another writer may have renamed a good one into place meanwhile.
  struct stat st;
  if (::fstatat(dir_fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && static_cast<uint64_t>(st.st_dev) == dev &&
      static_cast<uint64_t>(st.st_ino) == ino)
    ::unlinkat(dir_fd_, name.c_str(), 0);
  index_.erase(name);
  ++stats_.rejected;
}

std::optional<CacheEntry> DiskCache::index_file_locked(const std::string& name) {
  std::optional<Digest> key = kv_parse_file_name(name);
  DSV4_ASSERT(key.has_value());
  Fd f(::openat(dir_fd_, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (f.fd < 0) return std::nullopt;
  struct stat st;
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t dev = static_cast<uint64_t>(st.st_dev), ino = static_cast<uint64_t>(st.st_ino);
  uint8_t head[k_kv_text_offset] = {};
  const size_t want = static_cast<size_t>(std::min<uint64_t>(size, k_kv_text_offset));
  int e = pread_all(f.fd, head, want, 0);
  if (e > 0) {
    log_warn("KV disk cache: cannot read %s/%s: %s (skipped)", options_.dir.c_str(), name.c_str(),
             errno_text(e).c_str());
    return std::nullopt;
  }
  if (e < 0) {  // shrank while we looked
    remove_invalid_locked(name, dev, ino, "truncated");
    return std::nullopt;
  }
  auto h = kv_parse_header(std::span<const uint8_t>(head, want), size);
  if (!h) {
    remove_invalid_locked(name, dev, ino, h.error().message);
    return std::nullopt;
  }
  if (auto id = kv_check_identity(*h, identity_); !id) {
    remove_invalid_locked(name, dev, ino, id.error().message);
    return std::nullopt;
  }
  if (h->text_sha != *key) {
    remove_invalid_locked(name, dev, ino, "its name does not match the hash of its key text");
    return std::nullopt;
  }
  CacheEntry ent;
  ent.name = name;
  ent.header = *h;
  ent.usage = kv_parse_usage(std::span<const uint8_t>(head + k_kv_usage_offset, k_kv_usage_bytes))
                  .value_or(KvUsage{0, h->created});
  ent.file_bytes = size;
  ent.dev = dev;
  ent.ino = ino;
  ent.mtime_ns = mtime_ns(st);
  const size_t nt = static_cast<size_t>(std::min<uint64_t>(h->text_bytes, k_text_probe));
  ent.text_tail.resize(nt);
  e = pread_all(f.fd, reinterpret_cast<uint8_t*>(ent.text_tail.data()), nt, h->tokens_offset() - nt);
  const size_t nk = static_cast<size_t>(std::min<uint64_t>(h->n_tokens, k_token_probe));
  ent.token_tail.resize(nk);
  if (e == 0)
    e = pread_all(f.fd, reinterpret_cast<uint8_t*>(ent.token_tail.data()), 4 * nk, h->payload_offset() - 4 * nk);
  if (e != 0) {
    log_warn("KV disk cache: cannot read %s/%s: %s (skipped)", options_.dir.c_str(), name.c_str(),
             read_error_text(e).c_str());
    return std::nullopt;
  }
  return ent;
}

void DiskCache::rescan_locked() {
  int dfd = ::dup(dir_fd_);
  if (dfd < 0) return;
  DIR* d = ::fdopendir(dfd);
  if (!d) {
    ::close(dfd);
    return;
  }
  ::rewinddir(d);
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  std::set<std::string> present;
  for (const std::string& name : names) {
    struct stat st;
    if (long pid = temp_name_pid(name); pid >= 0) {
      // A temporary file of a writer that is gone (or older than a day: pid reuse, another host).
      if (::fstatat(dir_fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      const bool dead = pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
      // File times are wall-clock times, so this compares with the system clock, not options_.clock.
      const bool old = std::time(nullptr) > st.st_mtim.tv_sec + static_cast<time_t>(k_stale_temp_seconds);
      if (dead || old) {
        log_info("KV disk cache: removing the stale temporary file %s/%s", options_.dir.c_str(), name.c_str());
        ::unlinkat(dir_fd_, name.c_str(), 0);
      }
      continue;
    }
    if (!kv_parse_file_name(name)) continue;  // not ours: left alone
    if (::fstatat(dir_fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    present.insert(name);
    auto it = index_.find(name);
    if (it != index_.end() && it->second.dev == static_cast<uint64_t>(st.st_dev) &&
        it->second.ino == static_cast<uint64_t>(st.st_ino) &&
        it->second.file_bytes == static_cast<uint64_t>(st.st_size) && it->second.mtime_ns == mtime_ns(st))
      continue;
    if (auto ent = index_file_locked(name)) {
      index_[name] = std::move(*ent);
    } else {
      index_.erase(name);
      present.erase(name);
    }
  }
  for (auto it = index_.begin(); it != index_.end();) it = present.count(it->first) ? std::next(it) : index_.erase(it);
}

std::vector<CacheCandidate> DiskCache::find(std::string_view text, std::span<const int32_t> tokens, uint64_t min_tokens,
                                            uint64_t max_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  rescan_locked();
  std::map<uint64_t, Digest> text_sha, token_sha;  // by prefix length: each prefix is hashed once
  std::vector<CacheCandidate> out;
  for (const auto& [name, e] : index_) {
    const KvHeader& h = e.header;
    if (h.n_tokens < min_tokens || h.n_tokens > max_tokens) continue;
    CacheCandidate c;
    if (h.n_tokens <= tokens.size() &&
        std::equal(e.token_tail.begin(), e.token_tail.end(),
                   tokens.begin() + static_cast<long>(h.n_tokens - e.token_tail.size()))) {
      auto it = token_sha.find(h.n_tokens);
      if (it == token_sha.end()) it = token_sha.emplace(h.n_tokens, sha256_digest(tokens.data(), 4 * h.n_tokens)).first;
      c.tokens_match = it->second == h.token_sha;
    }
    if (h.text_bytes > 0 && h.text_bytes <= text.size() &&
        text.substr(h.text_bytes - e.text_tail.size(), e.text_tail.size()) == e.text_tail) {
      auto it = text_sha.find(h.text_bytes);
      if (it == text_sha.end()) it = text_sha.emplace(h.text_bytes, sha256_digest(text.data(), h.text_bytes)).first;
      c.text_match = it->second == h.text_sha;
    }
    if (!c.tokens_match && !c.text_match) continue;
    c.entry = e;
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const CacheCandidate& a, const CacheCandidate& b) {
    if (a.entry.header.n_tokens != b.entry.header.n_tokens) return a.entry.header.n_tokens > b.entry.header.n_tokens;
    if (a.tokens_match != b.tokens_match) return a.tokens_match;
    if (a.entry.usage.last_used != b.entry.usage.last_used) return a.entry.usage.last_used > b.entry.usage.last_used;
    return a.entry.name < b.entry.name;
  });
  return out;
}

expected<CacheRecord> DiskCache::read(const CacheEntry& entry) {
  const std::string path = options_.dir + "/" + entry.name;
  Fd f(::openat(dir_fd_, entry.name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  auto forget = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    index_.erase(entry.name);
  };
  if (f.fd < 0) {
    int e = errno;
    forget();
    return make_error("%s: %s", path.c_str(), errno_text(e).c_str());
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    forget();
    return make_error("%s: not a regular file", path.c_str());
  }
  const uint64_t dev = static_cast<uint64_t>(st.st_dev), ino = static_cast<uint64_t>(st.st_ino);
  if (dev != entry.dev || ino != entry.ino) {
    forget();  // another writer renamed a new file into place: the next scan indexes it
    return make_error("%s: replaced since it was indexed", path.c_str());
  }
  auto invalid = [&](const std::string& why) -> Error {
    std::lock_guard<std::mutex> lock(mu_);
    remove_invalid_locked(entry.name, dev, ino, why);
    return make_error("%s: %s", path.c_str(), why.c_str());
  };
  // Files are never modified in place except for the usage block, so the size
  // the scan validated is the size to read; anything else is damage.
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size != entry.file_bytes)
    return invalid(strfmt("truncated or extended: %llu bytes, the header describes %llu",
                          static_cast<unsigned long long>(size), static_cast<unsigned long long>(entry.file_bytes)));
  CacheRecord rec;
  rec.image.resize(static_cast<size_t>(size));
  int e = read_all(f.fd, rec.image.data(), rec.image.size());
  if (e > 0) {
    log_warn("KV disk cache: cannot read %s: %s (skipped)", path.c_str(), errno_text(e).c_str());
    forget();
    return make_error("%s: %s", path.c_str(), errno_text(e).c_str());
  }
  if (e < 0) return invalid("truncated while being read");
  auto v = kv_parse_file(rec.image);
  if (!v) return invalid(v.error().message);
  if (auto id = kv_check_identity(v->header, identity_); !id) return invalid(id.error().message);
  if (kv_parse_file_name(entry.name) != v->header.text_sha)
    return invalid("its name does not match the hash of its key text");
  if (v->header.token_sha != entry.header.token_sha || v->header.n_tokens != entry.header.n_tokens) {
    forget();  // replaced by another writer since the scan: a miss, not a fault
    return make_error("%s: replaced since it was indexed", path.c_str());
  }
  rec.view = std::move(*v);
  rec.entry = entry;
  rec.entry.header = rec.view.header;
  rec.entry.usage = rec.view.usage;
  rec.entry.file_bytes = size;
  rec.entry.dev = dev;
  rec.entry.ino = ino;
  rec.entry.mtime_ns = mtime_ns(st);
  return rec;
}

void DiskCache::record_hit(const CacheEntry& entry) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.hits;
  KvUsage u = entry.usage;
  auto it = index_.find(entry.name);
  if (it != index_.end() && it->second.ino == entry.ino) u = it->second.usage;
  u.hits = u.hits == UINT32_MAX ? u.hits : u.hits + 1;
  u.last_used = now();
  Fd f(::openat(dir_fd_, entry.name.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (f.fd < 0 || ::fstat(f.fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != entry.ino) return;  // gone or replaced
  auto block = kv_encode_usage(u);
  ssize_t w = ::pwrite(f.fd, block.data(), block.size(), k_kv_usage_offset);
  if (w != static_cast<ssize_t>(block.size()) || ::fdatasync(f.fd) != 0) {
    log_debug("KV disk cache: cannot update the usage of %s: %s", entry.name.c_str(), errno_text(errno).c_str());
    return;
  }
  if (it != index_.end() && it->second.ino == entry.ino) {
    it->second.usage = u;
    if (::fstat(f.fd, &st) == 0) it->second.mtime_ns = mtime_ns(st);
  }
}

void DiskCache::record_miss() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses;
}

void DiskCache::disable_writes(const std::string& what, int err) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stats_.writable) return;
  stats_.writable = false;
  log_warn("KV disk cache: %s failed: %s; no new cache files will be written to %s (existing ones still serve hits)",
           what.c_str(), errno_text(err).c_str(), options_.dir.c_str());
}

expected<std::vector<uint8_t>> DiskCache::read_tool_section(const CacheEntry& e) {
  Fd f(::openat(dir_fd_, e.name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (f.fd < 0) return make_error("%s: %s", e.name.c_str(), errno_text(errno).c_str());
  std::vector<uint8_t> b(static_cast<size_t>(e.header.tool_map_bytes));
  int r = pread_all(f.fd, b.data(), b.size(), e.header.tool_map_offset());
  if (r != 0) return make_error("%s: %s", e.name.c_str(), read_error_text(r).c_str());
  if (sha256_digest(b.data(), b.size()) != e.header.tool_map_sha)
    return make_error("%s: corrupt tool map", e.name.c_str());
  return b;
}

expected<StoreResult> DiskCache::store(const StoreInput& in) {
  if (in.tokens.empty() || in.key_text.empty()) return make_error("nothing to store: no tokens or an empty key text");
  if (in.tokens.size() > k_kv_max_tokens || in.key_text.size() > k_kv_max_text_bytes)
    return make_error("nothing stored: %zu tokens / %zu key bytes exceed the file format's limits", in.tokens.size(),
                      in.key_text.size());
  if (in.ctx < in.tokens.size())
    return make_error("nothing stored: %zu tokens in a context of %u", in.tokens.size(), in.ctx);
  auto snap = snapshot_peek(in.payload);
  if (!snap || !snap->with_rows || snap->n_tokens != in.tokens.size() ||
      static_cast<uint32_t>(snap->numerics) != identity_.numerics)
    return make_error("nothing stored: the payload is not a full session snapshot of these %zu tokens",
                      in.tokens.size());
  ToolDsmlMap kept;
  if (in.tools)
    for (const auto& [id, dsml] : *in.tools)
      if (kv_tool_entry_valid(id, dsml) && in.key_text.find(dsml) != std::string_view::npos) kept.emplace(id, dsml);

  KvFileContent c;
  c.identity = identity_;
  c.reason = in.reason;
  c.decoded_key = in.decoded_key;
  c.ctx = in.ctx;
  c.created = now();
  c.text = in.key_text;
  c.tokens = in.tokens;
  c.payload = in.payload;
  StoreResult res;
  KvUsage usage{0, c.created};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stats_.writable) {
      res.outcome = StoreOutcome::READ_ONLY;
      return res;
    }
    // The same state already on disk: nothing to do, unless it lacks some of
    // the tool calls; then it is rewritten with the union of both maps and
    // keeps its hits (same key text, so both maps' DSML occurs in it).
    rescan_locked();
    const Digest text_sha = sha256_digest(in.key_text.data(), in.key_text.size());
    auto it = index_.find(kv_file_name(text_sha));
    if (it != index_.end() && it->second.header.token_sha == sha256_digest(in.tokens.data(), 4 * in.tokens.size()) &&
        it->second.header.decoded_key() == in.decoded_key) {
      ToolDsmlMap have;
      if (it->second.header.tool_map_bytes > 0) {
        auto sec = read_tool_section(it->second);
        auto m = sec ? kv_parse_tool_map(*sec) : expected<ToolDsmlMap>(sec.error());
        if (m) have = std::move(*m);
      }
      bool covered = true;
      for (const auto& [id, dsml] : kept) {
        auto f = have.find(id);
        if (f == have.end() || f->second != dsml) covered = false;
      }
      if (covered) {
        res.name = it->first;
        res.bytes = it->second.file_bytes;
        res.outcome = StoreOutcome::ALREADY_PRESENT;
        return res;
      }
      for (auto& [id, dsml] : have) kept.emplace(id, std::move(dsml));  // new entries win for equal ids
      usage = it->second.usage;
    }
  }
  const std::vector<uint8_t> tool_section = kv_encode_tool_map(kept);
  const KvHeader h = kv_make_header(c, tool_section);
  res.name = kv_file_name(h.text_sha);
  res.bytes = h.file_bytes();
  if (res.bytes > options_.budget_bytes) {
    res.outcome = StoreOutcome::OVER_BUDGET;
    return res;
  }

  // Write a temporary file, make it durable, rename it into place, make the rename durable.
  const std::string tmp = temp_name(res.name);
  std::string step = "creating " + tmp;
  int err = 0;
  int fd = ::openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) err = errno;
  if (!err && ::fchmod(fd, 0600) != 0) err = errno;
  if (!err) {
    // Reserve the space first, so a full disk fails before hundreds of MiB are written.
    int fe = ::posix_fallocate(fd, 0, static_cast<off_t>(res.bytes));
    if (fe == ENOSPC || fe == EDQUOT || fe == EFBIG || fe == EIO) {
      step = "reserving " + std::to_string(res.bytes) + " bytes";
      err = fe;
    }
  }
  KvChecksum sum;
  auto emit = [&](const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    for (size_t off = 0; off < n && !err; off += k_write_chunk) {
      const size_t len = std::min(k_write_chunk, n - off);
      sum.update(p + off, len);
      err = write_all(fd, p + off, len);
    }
  };
  if (!err) {
    step = "writing " + tmp;
    auto hdr = kv_encode_header(h);
    emit(hdr.data(), hdr.size());
    auto use = kv_encode_usage(usage);
    emit(use.data(), use.size());
    emit(in.key_text.data(), in.key_text.size());
    emit(in.tokens.data(), 4 * in.tokens.size());
    emit(in.payload.data(), in.payload.size());
    emit(tool_section.data(), tool_section.size());
    if (!err) {
      Digest d = sum.finish();
      err = write_all(fd, d.data(), d.size());
    }
  }
  if (!err) {
    step = "syncing " + tmp;
    if (::fsync(fd) != 0) err = errno;
  }
  if (fd >= 0 && ::close(fd) != 0 && !err) err = errno;
  if (!err) {
    step = "renaming " + tmp;
    if (::renameat(dir_fd_, tmp.c_str(), dir_fd_, res.name.c_str()) != 0) err = errno;
  }
  if (err) {
    if (fd >= 0) ::unlinkat(dir_fd_, tmp.c_str(), 0);
    disable_writes(step, err);
    return make_error("KV disk cache: %s failed: %s", step.c_str(), errno_text(err).c_str());
  }
  if (::fsync(dir_fd_) != 0)
    log_debug("KV disk cache: fsync of %s: %s", options_.dir.c_str(), errno_text(errno).c_str());

  std::lock_guard<std::mutex> lock(mu_);
  if (auto ent = index_file_locked(res.name)) index_[res.name] = std::move(*ent);
  ++stats_.stores;
  res.outcome = StoreOutcome::WRITTEN;
  res.evicted = evict_locked(res.name);
  return res;
}

std::vector<std::string> DiskCache::evict_to_budget(const std::string& protect) {
  std::lock_guard<std::mutex> lock(mu_);
  rescan_locked();
  return evict_locked(protect);
}

std::vector<std::string> DiskCache::evict_locked(const std::string& protect) {
  std::vector<std::string> evicted;
  uint64_t total = 0;
  for (const auto& [name, e] : index_) total += e.file_bytes;
  const uint64_t t = now();
  while (total > options_.budget_bytes && !index_.empty()) {
    const CacheEntry* victim = nullptr;
    double victim_value = 0;
    for (const auto& [name, e] : index_) {
      if (name == protect && index_.size() > 1) continue;
      const double v = log_value(e, t, options_.half_life_seconds);
      const uint64_t last = std::max(e.usage.last_used, e.header.created);
      const uint64_t victim_last = victim ? std::max(victim->usage.last_used, victim->header.created) : 0;
      if (!victim || v < victim_value || (v == victim_value && last < victim_last)) {
        victim = &e;
        victim_value = v;
      }
    }
    DSV4_ASSERT(victim != nullptr);
    const std::string name = victim->name;
    log_info("KV disk cache: evicting %s (%llu tokens, %.1f MiB, %u hits)", name.c_str(),
             static_cast<unsigned long long>(victim->header.n_tokens),
             static_cast<double>(victim->file_bytes) / (1 << 20), victim->usage.hits);
    if (::unlinkat(dir_fd_, name.c_str(), 0) != 0 && errno != ENOENT)
      log_warn("KV disk cache: cannot remove %s/%s: %s", options_.dir.c_str(), name.c_str(), errno_text(errno).c_str());
    total -= victim->file_bytes;
    index_.erase(name);
    ++stats_.evictions;
    evicted.push_back(name);
  }
  return evicted;
}

void DiskCache::discard(const CacheEntry& entry, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  remove_invalid_locked(entry.name, entry.dev, entry.ino, why);
}

bool DiskCache::has(std::string_view key_text, std::span<const int32_t> tokens) {
  const std::string name = kv_file_name(sha256_digest(key_text.data(), key_text.size()));
  std::lock_guard<std::mutex> lock(mu_);
  rescan_locked();
  auto it = index_.find(name);
  return it != index_.end() && it->second.header.n_tokens == tokens.size() &&
         it->second.header.token_sha == sha256_digest(tokens.data(), 4 * tokens.size());
}

ToolDsmlMap DiskCache::find_tool_calls(const std::vector<std::string>& ids) {
  std::lock_guard<std::mutex> lock(mu_);
  rescan_locked();
  ToolDsmlMap out;
  std::set<std::string> want(ids.begin(), ids.end());
  for (const auto& [name, e] : index_) {
    if (e.header.tool_map_bytes == 0 || out.size() == want.size()) continue;
    auto sec = read_tool_section(e);
    auto m = sec ? kv_parse_tool_map(*sec) : expected<ToolDsmlMap>(sec.error());
    if (!m) {
      log_debug("KV disk cache: tool map of %s: %s", name.c_str(), m.error().message.c_str());
      continue;
    }
    for (const auto& [id, dsml] : *m)
      if (want.count(id)) out.emplace(id, dsml);
  }
  return out;
}

std::vector<CacheEntry> DiskCache::entries() {
  std::lock_guard<std::mutex> lock(mu_);
  rescan_locked();
  std::vector<CacheEntry> out;
  for (const auto& [name, e] : index_) out.push_back(e);
  return out;
}

CacheStats DiskCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheStats s = stats_;
  s.files = index_.size();
  s.bytes = 0;
  for (const auto& [name, e] : index_) s.bytes += e.file_bytes;
  return s;
}

}  // namespace dsv4
