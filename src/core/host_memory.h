// Host RAM as pinning sees it: memory that is pinned (registered for a GPU to read) must be resident,
// so pinning N bytes of a file mapping needs RAM for the pages of it not resident yet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace dsv4 {

// MemAvailable of /proc/meminfo (or of `meminfo_path`, for tests), in bytes.
expected<uint64_t> mem_available(const std::string& meminfo_path = "/proc/meminfo");

// Bytes of [p, p + n) whose pages are resident now (mincore; whole pages, p need not be aligned).
uint64_t resident_bytes(const void* p, size_t n);

// Whether pinning [p, p + n) fits: its non-resident bytes plus `margin` within `available`. The error
// names `what`, the sizes and the way out (a larger GPU budget, or a smaller model file).
Status check_pinnable(const void* p, size_t n, uint64_t available, uint64_t margin, const std::string& what);

}  // namespace dsv4
