#include "kv/model_identity_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <random>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "core/fd_io.h"
#include "core/log.h"

namespace dsv4 {

namespace {

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

// Decimal digits without '+' or leading zeros (a lone "0" is fine; signed types: an optional '-'), no overflow.
template <typename T>
std::optional<T> parse_decimal(std::string_view s) {
  std::string_view digits = s;
  if (std::is_signed_v<T> && !digits.empty() && digits[0] == '-') digits.remove_prefix(1);
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  for (char ch : digits)
    if (ch < '0' || ch > '9') return std::nullopt;
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

bool storable_path(std::string_view p) {
  if (p.empty() || p[0] != '/' || p.size() > ModelIdentityStore::k_max_path_bytes) return false;
  for (unsigned char ch : p)
    if (ch < 0x20 || ch == 0x7f) return false;
  return true;
}

// One entry line (without its '\n'), or nullopt when any field is malformed.
std::optional<std::pair<ModelFileKey, Digest>> parse_line(std::string_view line) {
  std::string_view fields[6];
  for (std::string_view& f : fields) {
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) return std::nullopt;
    f = line.substr(0, sp);
    line.remove_prefix(sp + 1);
  }
  if (fields[0].size() != 64) return std::nullopt;
  for (char ch : fields[0])
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return std::nullopt;
  std::optional<Digest> id = digest_from_hex(fields[0]);
  auto dev = parse_decimal<uint64_t>(fields[1]), ino = parse_decimal<uint64_t>(fields[2]);
  auto size = parse_decimal<uint64_t>(fields[3]);
  auto mtime = parse_decimal<int64_t>(fields[4]), ctime = parse_decimal<int64_t>(fields[5]);
  if (!id || !dev || !ino || !size || !mtime || !ctime || !storable_path(line)) return std::nullopt;
  ModelFileKey k;
  k.path = std::string(line);
  k.stamp = FileStamp{*dev, *ino, *size, *mtime, *ctime};
  return std::make_pair(std::move(k), *id);
}

std::string format_line(const ModelFileKey& k, const Digest& id) {
  return strfmt("%s %llu %llu %llu %lld %lld %s\n", digest_hex(id).c_str(),
                static_cast<unsigned long long>(k.stamp.dev), static_cast<unsigned long long>(k.stamp.ino),
                static_cast<unsigned long long>(k.stamp.size), static_cast<long long>(k.stamp.mtime_ns),
                static_cast<long long>(k.stamp.ctime_ns), k.path.c_str());
}

}  // namespace

ModelIdentityStore::ModelIdentityStore(int dir_fd, std::string dir) : dir_fd_(dir_fd), dir_(std::move(dir)) {}

std::vector<ModelIdentityStore::Entry> ModelIdentityStore::load() const {
  std::vector<Entry> out;
  int fd = ::openat(dir_fd_, k_file_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT)
      log_warn("KV disk cache: cannot open %s: %s (ignored)", path().c_str(), errno_text(errno).c_str());
    return out;
  }
  std::string text;
  std::string why;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    why = errno_text(errno);
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else if (st.st_uid != ::geteuid() || (st.st_mode & 022)) {
    why = "it belongs to another user or others may write it";
  } else if (static_cast<uint64_t>(st.st_size) > k_max_file_bytes) {
    why = strfmt("%llu bytes, more than the %zu a valid file can have", static_cast<unsigned long long>(st.st_size),
                 k_max_file_bytes);
  } else {
    // Read at most one byte past the limit: the file may grow after fstat.
    text.resize(k_max_file_bytes + 1);
    size_t got = 0;
    while (got < text.size()) {
      ssize_t r = ::read(fd, text.data() + got, text.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        why = errno_text(errno);
        break;
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    text.resize(got);
    if (why.empty() && got > k_max_file_bytes) why = "larger than a valid file can be";
  }
  ::close(fd);
  if (!why.empty()) {
    log_warn("KV disk cache: ignoring %s: %s", path().c_str(), why.c_str());
    return out;
  }
  std::string_view rest(text);
  const std::string_view first = std::string_view(k_first_line);
  if (rest.substr(0, first.size() + 1) != std::string(first) + "\n") {
    log_warn("KV disk cache: ignoring %s: not a model identity file of this version", path().c_str());
    return out;
  }
  rest.remove_prefix(first.size() + 1);
  size_t bad = 0;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    if (nl == std::string_view::npos) {  // an unterminated last line: a torn or foreign write
      ++bad;
      break;
    }
    auto e = parse_line(rest.substr(0, nl));
    rest.remove_prefix(nl + 1);
    if (!e) {
      ++bad;
      continue;
    }
    out.push_back(Entry{std::move(e->first), e->second});
  }
  if (bad > 0) log_warn("KV disk cache: %s: %zu malformed line%s ignored", path().c_str(), bad, bad == 1 ? "" : "s");
  return out;
}

std::optional<Digest> ModelIdentityStore::find(const ModelFileKey& key) const {
  if (!storable_path(key.path)) return std::nullopt;
  for (const Entry& e : load())
    if (e.key == key) return e.identity;
  return std::nullopt;
}

Status ModelIdentityStore::remember(const ModelFileKey& key, const Digest& identity) {
  if (!storable_path(key.path))
    return make_error(
        "the model path cannot be stored in %s (not absolute, a control character or longer than "
        "%zu bytes)",
        path().c_str(), k_max_path_bytes);
  std::string text = std::string(k_first_line) + "\n" + format_line(key, identity);
  size_t n = 1;
  for (const Entry& e : load()) {
    if (n == k_max_entries) break;
    if (e.key.path == key.path) continue;  // one entry per path: the new one
    text += format_line(e.key, e.identity);
    ++n;
  }
  // A temporary name DiskCache's scan recognises (a dot, ".tmp.<pid>."), so a crash leaves nothing behind for long.
  static std::atomic<uint64_t> counter{0};
  static const uint32_t salt = std::random_device{}();
  const std::string tmp = strfmt(".%s.tmp.%ld.%08x.%llu", k_file_name, static_cast<long>(::getpid()), salt,
                                 static_cast<unsigned long long>(counter.fetch_add(1)));
  int fd = ::openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return make_error("cannot create %s/%s: %s", dir_.c_str(), tmp.c_str(), errno_text(errno).c_str());
  int err = ::fchmod(fd, 0600) != 0 ? errno : 0;
  if (!err) err = write_all(fd, text.data(), text.size());
  if (!err && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && !err) err = errno;
  if (!err && ::renameat(dir_fd_, tmp.c_str(), dir_fd_, k_file_name) != 0) err = errno;
  if (err) {
    ::unlinkat(dir_fd_, tmp.c_str(), 0);
    return make_error("cannot write %s: %s", path().c_str(), errno_text(err).c_str());
  }
  ::fsync(dir_fd_);
  return {};
}

}  // namespace dsv4
