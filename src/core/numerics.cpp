#include "core/numerics.h"

#include <algorithm>
#include <string>

namespace dsv4 {

const char* numerics_name(Numerics n) {
  switch (n) {
    case Numerics::REFERENCE: return "reference";
    case Numerics::PLAIN: return "plain";
    case Numerics::FAST: return "fast";
  }
  return "?";
}

expected<Numerics> numerics_from_name(std::string_view s) {
  if (s == "reference") return Numerics::REFERENCE;
  if (s == "plain") return Numerics::PLAIN;
  if (s == "fast") return Numerics::FAST;
  return make_error("unknown numerics \"%s\" (expected reference, plain or fast)", std::string(s).c_str());
}

namespace {
struct SiteName {
  unsigned bit;
  const char* name;
};
constexpr SiteName k_sites[] = {{FAST_ATTN_IN, "attn-in"},
                                {FAST_Q, "q"},
                                {FAST_WO_B, "wo-b"},
                                {FAST_FFN_IN, "ffn-in"},
                                {FAST_SHEXP_MID, "shexp-mid"},
                                {FAST_EXP_MID, "exp-mid"},
                                {FAST_MTP, "mtp"}};
}  // namespace

std::string fast_sites_name(unsigned sites) {
  std::string out;
  for (const SiteName& s : k_sites)
    if (sites & s.bit) out += (out.empty() ? "" : ",") + std::string(s.name);
  return out.empty() ? "none" : out;
}

expected<unsigned> fast_sites_from_names(std::string_view list) {
  if (list == "none") return 0u;
  unsigned sites = 0;
  size_t i = 0;
  while (i <= list.size()) {
    const size_t j = std::min(list.find(',', i), list.size());
    const std::string_view name = list.substr(i, j - i);
    bool found = false;
    for (const SiteName& s : k_sites)
      if (name == s.name) sites |= s.bit, found = true;
    if (!found) {
      std::string known;
      for (const SiteName& s : k_sites) known += (known.empty() ? "" : ", ") + std::string(s.name);
      return make_error("unknown fast-numerics site \"%s\" (expected none or a comma-separated list of %s)",
                        std::string(name).c_str(), known.c_str());
    }
    i = j + 1;
  }
  return sites;
}

}  // namespace dsv4
