// Small helpers shared by the dialect adapters: typed, exception-free access
// to request fields, compact JSON output that never throws, random ids.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4::server {

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

// Compact JSON; invalid UTF-8 in strings (which parsing never lets in, and
// the model's output never contains) would be replaced instead of throwing.
std::string json_dump(const ordered_json& j);

// `n_bytes` random bytes (OpenSSL RAND_bytes) as 2*n_bytes lowercase hex characters.
std::string random_hex(size_t n_bytes);
// A random 64-bit value (OpenSSL RAND_bytes), e.g. for sampling seeds.
uint64_t random_u64();

// Seconds since the Unix epoch.
int64_t unix_time();

// Whether a and b are the same JSON text up to formatting and object key
// order (both must parse, within k_max_json_depth; numbers compare by value).
bool json_text_equivalent(std::string_view a, std::string_view b);

}  // namespace dsv4::server
