#include "core/numerics.h"

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

}  // namespace dsv4
