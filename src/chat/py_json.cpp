#include "chat/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/assert.h"

namespace dsv4 {

void py_json_escape_to(std::string& out, std::string_view s) {
  static constexpr char HEX[] = "0123456789abcdef";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += HEX[c >> 4];
          out += HEX[c & 0xf];
        } else {
          out += ch;
        }
        break;
    }
  }
}

std::string py_json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  py_json_escape_to(out, s);
  out += '"';
  return out;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits in scientific form: [-]d[.ddd]e(+|-)XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  DSV4_ASSERT(res.ec == std::errc(), "to_chars failed");
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string out;
  if (!sci.empty() && sci[0] == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  DSV4_ASSERT(e_pos != std::string_view::npos, "no exponent in %s", buf);
  std::string digits;
  for (char c : sci.substr(0, e_pos))
    if (c != '.') digits += c;
  const int exp10 = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int n = static_cast<int>(digits.size());
  const int decpt = exp10 + 1;  // digits d1 d2 ... with the point after decpt of them
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= n) {
      out += digits;
      out.append(static_cast<size_t>(decpt - n), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) {
    out += '.';
    out += digits.substr(1);
  }
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  out += ebuf;
  return out;
}

namespace {

using ordered_json = nlohmann::ordered_json;

// Writes a scalar, or the opening bracket of a container (its members and the
// closing bracket are written by py_json_dump_to's loop). True for a container.
bool dump_scalar_or_open(std::string& out, const ordered_json& v) {
  using value_t = ordered_json::value_t;
  switch (v.type()) {
    case value_t::null: out += "null"; return false;
    case value_t::boolean: out += v.get<bool>() ? "true" : "false"; return false;
    case value_t::number_integer: out += std::to_string(v.get<int64_t>()); return false;
    case value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); return false;
    case value_t::number_float: out += py_float_repr(v.get<double>()); return false;
    case value_t::string:
      out += '"';
      py_json_escape_to(out, v.get_ref<const std::string&>());
      out += '"';
      return false;
    case value_t::array: out += '['; return true;
    case value_t::object: out += '{'; return true;
    case value_t::binary:
    case value_t::discarded:
      // Neither comes out of parsing JSON text; only a programming error puts
      // one into a value that is rendered.
      DSV4_ASSERT(false, "py_json_dumps: binary or discarded JSON value");
  }
  DSV4_UNREACHABLE();
}

}  // namespace

void py_json_dump_to(std::string& out, const ordered_json& v) {
  // Iterative, with an explicit stack of the open containers: the schemas and
  // arguments rendered here come from clients and the model, and no nesting
  // depth may exhaust the thread's stack (parsing limits it to
  // k_max_json_depth anyway, json_limits.h). The stack holds one entry per
  // open level.
  struct Frame {
    const ordered_json* container;
    ordered_json::const_iterator next;
    bool first;
  };
  std::vector<Frame> stack;
  if (dump_scalar_or_open(out, v)) stack.push_back(Frame{&v, v.cbegin(), true});
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next == f.container->cend()) {
      out += f.container->is_array() ? ']' : '}';
      stack.pop_back();
      continue;
    }
    if (!f.first) out += ", ";
    f.first = false;
    if (f.container->is_object()) {
      out += '"';
      py_json_escape_to(out, f.next.key());
      out += "\": ";
    }
    const ordered_json& member = *f.next;
    ++f.next;  // (before the push below, which may move `f`)
    if (dump_scalar_or_open(out, member)) stack.push_back(Frame{&member, member.cbegin(), true});
  }
}

std::string py_json_dumps(const nlohmann::ordered_json& v) {
  std::string out;
  py_json_dump_to(out, v);
  return out;
}

}  // namespace dsv4
