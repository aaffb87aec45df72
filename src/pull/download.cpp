// download_resumable (download.h): one file over HTTP(S) into PATH.part, resumed by Range requests.
#include "pull/download.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <httplib.h>

#include "core/fd_io.h"

namespace dsv4 {

namespace {

struct Url {
  std::string origin;  // scheme://host[:port]
  std::string path;    // /...
};

expected<Url> split_url(const std::string& url) {
  const size_t p = url.find("://");
  const std::string scheme = p == std::string::npos ? "" : url.substr(0, p);
  if (scheme != "http" && scheme != "https") return make_error("URL %s: want http:// or https://", url.c_str());
  const size_t slash = url.find('/', p + 3);
  if (slash == p + 3) return make_error("URL %s: no host", url.c_str());
  return Url{url.substr(0, slash), slash == std::string::npos ? "/" : url.substr(slash)};
}

uint64_t size_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// "bytes FIRST-LAST/TOTAL" -> first, total (total "*" is refused: dsv4 needs the size).
bool parse_content_range(const std::string& v, uint64_t& first, uint64_t& total) {
  unsigned long long a = 0, b = 0, t = 0;
  if (std::sscanf(v.c_str(), "bytes %llu-%llu/%llu", &a, &b, &t) != 3 || b < a || t <= b) return false;
  first = a;
  total = t;
  return true;
}

double gib(uint64_t b) { return static_cast<double>(b) / static_cast<double>(uint64_t{1} << 30); }

}  // namespace

expected<DownloadResult> download_resumable(const DownloadOptions& o) {
  auto url = split_url(o.url);
  if (!url) return url.error();
  const std::string part = o.path + ".part";
  DownloadResult r;
  r.resumed_from = size_of(part);
  httplib::Client cli(url->origin);
  cli.set_follow_location(true);
  cli.set_connection_timeout(30);
  cli.set_read_timeout(o.read_timeout_s);
  uint64_t total = 0;  // the file's size, once a response said it
  std::string last_error = "no request made";
  int delay_ms = o.retry_delay_ms;
  for (int attempt = 1; attempt <= o.max_attempts; ++attempt) {
    const uint64_t have = size_of(part);
    if (total > 0 && have == total) break;
    r.attempts = attempt;
    const int fd = ::open(part.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return make_error("cannot open %s for writing: %s", part.c_str(), std::strerror(errno));
    httplib::Headers headers;
    if (have > 0) headers.emplace("Range", "bytes=" + std::to_string(have) + "-");
    uint64_t at = have;
    std::string fatal;  // an answer that retrying cannot change
    int write_errno = 0;
    auto res = cli.Get(
        url->path, headers,
        [&](const httplib::Response& resp) {
          if (resp.status == 206) {
            uint64_t first = 0, t = 0;
            if (!parse_content_range(resp.get_header_value("Content-Range"), first, t) || first != have) {
              fatal = strfmt("the server answered the range %llu- with \"Content-Range: %s\"",
                             static_cast<unsigned long long>(have), resp.get_header_value("Content-Range").c_str());
              return false;
            }
            total = t;
          } else if (resp.status == 200) {  // the whole file: the server ignored the range, or there was none
            if (have > 0 && ::ftruncate(fd, 0) != 0) {
              write_errno = errno;
              return false;
            }
            at = 0;
            const std::string len = resp.get_header_value("Content-Length");
            total = len.empty() ? 0 : std::strtoull(len.c_str(), nullptr, 10);
          } else if (resp.status == 416 && have > 0) {
            fatal = strfmt("the server has fewer than the %llu bytes of %s (HTTP 416): delete it and pull again",
                           static_cast<unsigned long long>(have), part.c_str());
            return false;
          } else {
            fatal = strfmt("HTTP %d for %s", resp.status, o.url.c_str());
            return false;
          }
          if (total > at) {  // room for the rest
            struct statvfs sv {};
            if (::fstatvfs(fd, &sv) == 0) {
              const uint64_t free_b = static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
              if (free_b < total - at) {
                fatal = strfmt("%s needs %.2f GiB more on its disk, %.2f GiB free", o.path.c_str(), gib(total - at),
                               gib(free_b));
                return false;
              }
            }
          }
          if (::lseek(fd, static_cast<off_t>(at), SEEK_SET) < 0) {
            write_errno = errno;
            return false;
          }
          if (o.progress) o.progress(at, total);
          return true;
        },
        [&](const char* data, size_t len) {
          if (const int e = write_all(fd, data, len); e != 0) {
            write_errno = e;
            return false;
          }
          at += len;
          if (o.progress) o.progress(at, total);
          return true;
        });
    const int sync_errno = ::fsync(fd) == 0 ? 0 : errno;
    ::close(fd);
    if (write_errno != 0 || sync_errno != 0)
      return make_error("writing %s: %s", part.c_str(), std::strerror(write_errno ? write_errno : sync_errno));
    if (!fatal.empty()) {
      if (have == 0 && size_of(part) == 0) ::unlink(part.c_str());  // leave no empty .part behind
      return make_error("%s", fatal.c_str());
    }
    if (res && (res->status == 200 || res->status == 206)) {
      if (total == 0) total = at;  // no size given: the end of the stream is the end of the file
      if (at == total) break;
      last_error = strfmt("the connection ended after %llu of %llu bytes", static_cast<unsigned long long>(at),
                          static_cast<unsigned long long>(total));
    } else {
      last_error = res ? strfmt("HTTP %d", res->status) : "request failed: " + httplib::to_string(res.error());
    }
    if (attempt < o.max_attempts) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      delay_ms = std::min(delay_ms * 2, 30000);
    }
  }
  const uint64_t got = size_of(part);
  if (total == 0 || got != total) {
    if (got == 0) {
      ::unlink(part.c_str());
      return make_error("%s: nothing downloaded after %d requests (%s)", o.url.c_str(), r.attempts, last_error.c_str());
    }
    return make_error("%s did not complete after %d requests (%s); %s keeps %.2f GiB: run again to resume",
                      o.url.c_str(), r.attempts, last_error.c_str(), part.c_str(), gib(got));
  }
  if (::rename(part.c_str(), o.path.c_str()) != 0)
    return make_error("cannot rename %s to %s: %s", part.c_str(), o.path.c_str(), std::strerror(errno));
  r.bytes = got;
  return r;
}

}  // namespace dsv4
