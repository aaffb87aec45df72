// What tells one version of a file from another without reading it: device,
// inode, size, and the modification and status-change times in nanoseconds.
// Equal stamps mean "the same file, unchanged" for anything that rewrites,
// replaces, truncates, extends or touches it (ctime also moves when a tool
// restores the mtime after a write); a write within one timestamp tick of the
// file system that keeps the size is the limit of what a stamp can see.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

struct stat;

namespace dsv4 {

struct FileStamp {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;  // since the Unix epoch
  int64_t ctime_ns = 0;

  bool operator==(const FileStamp&) const = default;
};

FileStamp file_stamp(const struct stat& st);
// fstat of an open descriptor; stat of a path (symlinks followed: the file that open() would read).
expected<FileStamp> file_stamp_of(int fd);
expected<FileStamp> file_stamp_of(const std::string& path);

}  // namespace dsv4
