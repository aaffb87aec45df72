// The nesting limit of every JSON text the engine reads from outside (HTTP
// request bodies, tool-call arguments, conversation and script files) and of
// the JSON values built from them.
//
// Depth: a scalar is depth 0; an array or an object is one more than the
// deepest of its members ("[]", "{}" and "[1]" are depth 1, "[[1]]" and
// {"a": {}} depth 2). Arrays and objects count alike.
//
// Why: nlohmann's parser is iterative, but copying, comparing and dumping a
// value, and the schema walkers downstream, recurse once per level. Text that
// nests tens of thousands of levels would overflow an HTTP thread's stack and
// kill the process. Text is checked once, where it is parsed (parse_json_text,
// a linear scan before nlohmann builds anything); values handed to the request
// adapters by other means are checked by check_json_depth, iteratively. Past
// that point every value nests at most k_max_json_depth levels, so the
// recursion of nlohmann's copy / == / dump() is at most that deep.
#pragma once

#include <cstddef>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

inline constexpr size_t k_max_json_depth = 128;

// Whether JSON text nests at most `max_depth` levels: one pass counting '[' '{'
// against ']' '}' outside strings (inside a string a backslash escapes the
// next byte). For text that nlohmann accepts this is exactly the depth of the
// parsed value; other text is over-counted at worst (unbalanced brackets), and
// is invalid anyway. The error names the limit and the byte offset of the
// first bracket past it: "the JSON nests deeper than 128 levels (the server's
// limit) at byte 128".
Status check_json_text_depth(std::string_view text, size_t max_depth = k_max_json_depth);

// The same limit for a value, without recursion (an explicit stack of at most
// max_depth + 1 iterators); stops at the first member past the limit.
Status check_json_depth(const nlohmann::ordered_json& v, size_t max_depth = k_max_json_depth);

// Parses JSON text without exceptions, depth-limited by check_json_text_depth
// first; the error says where parsing failed ("invalid JSON: ...") or names
// the depth limit. Every parse of outside JSON text goes through these two.
expected<nlohmann::ordered_json> parse_json_text(std::string_view text);
// The same, into nlohmann::json (objects keyed by sorted keys: comparing two
// such values ignores key order).
expected<nlohmann::json> parse_json_text_unordered(std::string_view text);

// Whether a and b are the same JSON text up to formatting and object key
// order (both must parse, within k_max_json_depth; numbers compare by value).
bool json_text_equivalent(std::string_view a, std::string_view b);

}  // namespace dsv4
