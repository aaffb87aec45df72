#include "chat/json_limits.h"

#include <vector>

namespace dsv4 {

namespace {

// nlohmann reports the position of a syntax error only through its exception;
// it is caught here and never crosses these functions.
template <class Json>
expected<Json> parse_limited(std::string_view text) {
  DSV4_TRY(check_json_text_depth(text));
  try {
    return Json::parse(text.begin(), text.end());
  } catch (const typename Json::exception& e) {
    return make_error("invalid JSON: %s", e.what());
  }
}

}  // namespace

Status check_json_text_depth(std::string_view text, size_t max_depth) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped byte ('"', '\\', 'u', ...) neither ends the string nor nests
      else if (c == '"')
        in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (++depth > max_depth)
          return make_error("the JSON nests deeper than %zu levels (the server's limit) at byte %zu", max_depth, i);
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // (an unmatched closer is a syntax error the parser reports)
        break;
      default: break;
    }
  }
  return {};
}

Status check_json_depth(const nlohmann::ordered_json& v, size_t max_depth) {
  if (!v.is_structured()) return {};
  auto too_deep = [&] { return make_error("the JSON nests deeper than %zu levels (the server's limit)", max_depth); };
  if (max_depth == 0) return too_deep();
  // stack[k] iterates the open container at depth k + 1.
  struct Frame {
    const nlohmann::ordered_json* container;
    nlohmann::ordered_json::const_iterator next;
  };
  std::vector<Frame> stack;
  stack.push_back(Frame{&v, v.cbegin()});
  while (!stack.empty()) {
    Frame& f = stack.back();
    if (f.next == f.container->cend()) {
      stack.pop_back();
      continue;
    }
    const nlohmann::ordered_json& member = *f.next;
    ++f.next;
    if (!member.is_structured()) continue;
    if (stack.size() + 1 > max_depth) return too_deep();  // member is at depth stack.size() + 1
    stack.push_back(Frame{&member, member.cbegin()});
  }
  return {};
}

expected<nlohmann::ordered_json> parse_json_text(std::string_view text) {
  return parse_limited<nlohmann::ordered_json>(text);
}

expected<nlohmann::json> parse_json_text_unordered(std::string_view text) {
  return parse_limited<nlohmann::json>(text);
}

bool json_text_equivalent(std::string_view a, std::string_view b) {
  // Depth-limited parses: == recurses once per level.
  const auto ja = parse_json_text_unordered(a);
  const auto jb = parse_json_text_unordered(b);
  return ja && jb && *ja == *jb;
}

}  // namespace dsv4
