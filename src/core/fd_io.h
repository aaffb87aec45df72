// Whole reads and writes on file descriptors: loops over short transfers and
// EINTR. Each returns 0, the errno of the failure, or (reads) -1 when the
// file ends before `n` bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace dsv4 {

int write_all(int fd, const void* p, size_t n);
int read_all(int fd, void* p, size_t n);
int pread_all(int fd, void* p, size_t n, uint64_t offset);

// Replaces `path` with these n bytes whole or not at all: a temporary file beside it, fsync, rename.
Status write_file_atomic(const std::string& path, const void* p, size_t n);

}  // namespace dsv4
