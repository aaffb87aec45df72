// JSON text exactly as Python's `json.dumps(v, ensure_ascii=False)` writes it,
// which is what DeepSeek's official encoder embeds in prompts (tool schemas,
// DSML argument values, response formats) and what its parser produces for
// tool-call arguments.
//
// Rules (CPython 3 `json` module, default arguments except ensure_ascii):
//   * separators ", " between items and ": " after keys; no newlines;
//     "{}" / "[]" when empty; object keys in their stored order;
//   * strings: `"` and `\` escaped, \b \f \n \r \t by name, every other byte
//     below 0x20 as \u00XX with lowercase hex; everything else (DEL, non-ASCII
//     UTF-8, U+2028) is copied byte for byte;
//   * true / false / null;
//   * integers in decimal; floats as `repr(float)`: the shortest digit string
//     that round-trips, written positionally when the decimal exponent e of
//     d.ddd×10^e satisfies -5 < e < 16 (always with a fractional part, "1.0"),
//     and as d.ddde±XX otherwise ("1e-05", "1e+16", "1.5e+300");
//     non-finite values as Infinity / -Infinity / NaN.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsv4 {

// json.dumps(v, ensure_ascii=False). Iterative: no nesting depth exhausts the stack.
std::string py_json_dumps(const nlohmann::ordered_json& v);
void py_json_dump_to(std::string& out, const nlohmann::ordered_json& v);

// json.dumps(s, ensure_ascii=False) for a string: the quoted, escaped form.
std::string py_json_quote(std::string_view s);

// The escaped body of a JSON string, without the surrounding quotes. Escaping
// is byte-wise, so escaping the pieces of a string and concatenating equals
// escaping the whole (what streaming tool-call arguments rely on).
void py_json_escape_to(std::string& out, std::string_view s);

// repr(float(d)).
std::string py_float_repr(double d);

}  // namespace dsv4
