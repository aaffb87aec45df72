// Typed, exception-free access to the fields of a JSON object (API
// requests, the scripted-replies file).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

using ordered_json = nlohmann::ordered_json;

// Typed access to the fields of one JSON object of a request. An absent field
// and a null field both read as "not given" (std::nullopt); a field of the
// wrong type or out of range is an Error naming the field by its path.
class JsonFields {
 public:
  // `where` prefixes field names in errors ("messages[2]" -> "messages[2].content").
  JsonFields(const ordered_json& obj, std::string where = "") : obj_(obj), where_(std::move(where)) {}

  // The field's value, or nullptr when absent or null.
  const ordered_json* get(std::string_view key) const;
  // "where.key" (or "key" at the top level).
  std::string path(std::string_view key) const;

  expected<std::optional<std::string>> string(std::string_view key) const;
  expected<std::optional<bool>> boolean(std::string_view key) const;
  expected<std::optional<double>> number(std::string_view key, double lo, double hi) const;
  expected<std::optional<int64_t>> integer(std::string_view key, int64_t lo, int64_t hi) const;
  // A string, or an array of strings (OpenAI `stop`); absent/null: empty.
  expected<std::vector<std::string>> string_list(std::string_view key, size_t max_items) const;
  // An object / array field (absent or null: nullptr); another type is an error.
  expected<const ordered_json*> object(std::string_view key) const;
  expected<const ordered_json*> array(std::string_view key) const;

 private:
  const ordered_json& obj_;
  std::string where_;
};

}  // namespace dsv4
