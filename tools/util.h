// Small formatting helpers shared by the subcommands.
#pragma once

#include <cstdint>
#include <string>

namespace dsv4::tools {

// 86714775900 -> "86,714,775,900"
inline std::string with_commas(uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// Bytes as GiB with two decimals ("80.76 GiB"), or MiB/KiB for small sizes.
inline std::string human_bytes(uint64_t b) {
  char buf[64];
  double v = static_cast<double>(b);
  if (v >= 1024.0 * 1024 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1024.0 * 1024 * 1024));
  else if (v >= 1024.0 * 1024)
    std::snprintf(buf, sizeof buf, "%.2f MiB", v / (1024.0 * 1024));
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024.0);
  return buf;
}

}  // namespace dsv4::tools
