#include "core/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

namespace dsv4 {

expected<uint64_t> mem_available(const std::string& meminfo_path) {
  std::ifstream in(meminfo_path);
  if (!in) return make_error("cannot read %s", meminfo_path.c_str());
  std::string key;
  unsigned long long kb = 0;
  std::string unit;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemAvailable:") return static_cast<uint64_t>(kb) * 1024;
  }
  return make_error("%s has no MemAvailable line", meminfo_path.c_str());
}

uint64_t resident_bytes(const void* p, size_t n) {
  if (n == 0) return 0;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
  uint64_t resident = 0;
  // In pieces of 1 GiB of address space (a 1 MiB-vector of page flags at 4 KiB pages).
  const uintptr_t piece = uintptr_t{1} << 30;
  std::vector<unsigned char> flags(piece / page);
  for (uintptr_t a = lo; a < hi; a += piece) {
    const uintptr_t len = hi - a < piece ? hi - a : piece;
    if (::mincore(reinterpret_cast<void*>(a), len, flags.data()) != 0) continue;  // unmapped: counts as not resident
    for (uintptr_t i = 0; i < len / page; ++i) resident += flags[i] & 1u;
  }
  return resident * page;
}

Status check_pinnable(const void* p, size_t n, uint64_t available, uint64_t margin, const std::string& what) {
  const uint64_t resident = resident_bytes(p, n);
  const uint64_t need = n > resident ? n - resident : 0;
  if (need + margin <= available) return {};
  const double gib = static_cast<double>(uint64_t{1} << 30);
  return make_error(
      "%s: %.2f GiB must stay in host RAM for the GPU to read (%.2f GiB of it not in RAM yet), but only %.2f GiB "
      "of RAM is available (less a %.2f GiB margin); give the GPU more (--gpu-memory), free RAM, or use a smaller "
      "model file (reading experts from disk during decoding is not supported)",
      what.c_str(), static_cast<double>(n) / gib, static_cast<double>(need) / gib, static_cast<double>(available) / gib,
      static_cast<double>(margin) / gib);
}

}  // namespace dsv4
