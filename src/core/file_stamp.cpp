#include "core/file_stamp.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace dsv4 {

FileStamp file_stamp(const struct stat& st) {
  FileStamp s;
  s.dev = static_cast<uint64_t>(st.st_dev);
  s.ino = static_cast<uint64_t>(st.st_ino);
  s.size = static_cast<uint64_t>(st.st_size);
  s.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  s.ctime_ns = int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec;
  return s;
}

expected<FileStamp> file_stamp_of(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return make_error("fstat: %s", std::strerror(errno));
  return file_stamp(st);
}

expected<FileStamp> file_stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return make_error("cannot stat '%s': %s", path.c_str(), std::strerror(errno));
  return file_stamp(st);
}

}  // namespace dsv4
