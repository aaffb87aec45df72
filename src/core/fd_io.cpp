#include "core/fd_io.h"

#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace dsv4 {

namespace {

constexpr size_t k_max_transfer = size_t{1} << 30;  // per call: Linux moves at most ~2 GiB at once

}  // namespace

int write_all(int fd, const void* p, size_t n) {
  auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, std::min(n, k_max_transfer));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return EIO;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return 0;
}

int read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, std::min(n, k_max_transfer));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

int pread_all(int fd, void* p, size_t n, uint64_t offset) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::pread(fd, b, std::min(n, k_max_transfer), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) return -1;
    b += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return 0;
}

Status write_file_atomic(const std::string& path, const void* p, size_t n) {
  if (path.empty()) return make_error("no file name given");
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return make_error("cannot create %s: %s", tmp.c_str(), std::strerror(errno));
  const size_t wrote = std::fwrite(p, 1, n, f);
  const bool flushed = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const bool closed = std::fclose(f) == 0;
  if (wrote != n || !flushed || !closed) {
    std::remove(tmp.c_str());
    return make_error("writing %s failed (disk full?)", path.c_str());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return make_error("cannot write %s: %s", path.c_str(), std::strerror(err));
  }
  return {};
}

}  // namespace dsv4
