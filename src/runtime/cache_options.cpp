#include "runtime/cache_options.h"

#include "core/error.h"

namespace dsv4::runtime {

SavePolicy KvCacheOptions::policy() const {
  SavePolicy p;
  p.min_tokens = min_tokens;
  p.align = align;
  p.frontier = frontier;
  return p;
}

std::string KvCacheOptions::describe() const {
  std::string disk = disk_dir.empty()
                         ? std::string("off")
                         : strfmt("%s (%llu MiB)", disk_dir.c_str(), static_cast<unsigned long long>(disk_space_mb));
  std::string s = strfmt("sessions=%zu kv-disk=%s min-tokens=%zu frontier=%zu align=%zu", sessions, disk.c_str(),
                         min_tokens, frontier, align);
  if (session_memory_mb > 0)
    s += strfmt(" session-memory=%llu MiB", static_cast<unsigned long long>(session_memory_mb));
  return s;
}

}  // namespace dsv4::runtime
