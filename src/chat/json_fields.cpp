#include "chat/json_fields.h"

#include <cmath>

namespace dsv4 {

const ordered_json* JsonFields::get(std::string_view key) const {
  if (!obj_.is_object()) return nullptr;
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string JsonFields::path(std::string_view key) const {
  return where_.empty() ? std::string(key) : where_ + "." + std::string(key);
}

expected<std::optional<std::string>> JsonFields::string(std::string_view key) const {
  const ordered_json* v = get(key);
  if (!v) return std::optional<std::string>();
  if (!v->is_string()) return make_error("'%s' must be a string, got %s", path(key).c_str(), v->type_name());
  return std::optional<std::string>(v->get<std::string>());
}

expected<std::optional<bool>> JsonFields::boolean(std::string_view key) const {
  const ordered_json* v = get(key);
  if (!v) return std::optional<bool>();
  if (!v->is_boolean()) return make_error("'%s' must be a boolean, got %s", path(key).c_str(), v->type_name());
  return std::optional<bool>(v->get<bool>());
}

expected<std::optional<double>> JsonFields::number(std::string_view key, double lo, double hi) const {
  const ordered_json* v = get(key);
  if (!v) return std::optional<double>();
  if (!v->is_number()) return make_error("'%s' must be a number, got %s", path(key).c_str(), v->type_name());
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return make_error("'%s' must be between %g and %g, got %g", path(key).c_str(), lo, hi, d);
  return std::optional<double>(d);
}

expected<std::optional<int64_t>> JsonFields::integer(std::string_view key, int64_t lo, int64_t hi) const {
  const ordered_json* v = get(key);
  if (!v) return std::optional<int64_t>();
  const auto lo_ll = static_cast<long long>(lo), hi_ll = static_cast<long long>(hi);
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return make_error("'%s' must be between %lld and %lld, got %llu", path(key).c_str(), lo_ll, hi_ll,
                      static_cast<unsigned long long>(v->get<uint64_t>()));
  int64_t i = 0;
  if (v->is_number_integer()) {
    i = v->get<int64_t>();
  } else if (v->is_number_float()) {
    // 5.0 is an integer in JSON. An integral float converts exactly when -2^63 <= d < 2^63; outside that (1e308,
    // or a non-finite value built in code) it exceeds every int64_t bound, so it gets the range message.
    const double d = v->get<double>();
    if (std::isfinite(d) && d != std::floor(d))
      return make_error("'%s' must be an integer, got a fractional number", path(key).c_str());
    if (!(d >= -0x1p63 && d < 0x1p63))
      return make_error("'%s' must be between %lld and %lld, got %g", path(key).c_str(), lo_ll, hi_ll, d);
    i = static_cast<int64_t>(d);
  } else {
    return make_error("'%s' must be an integer, got %s", path(key).c_str(), v->type_name());
  }
  if (i < lo || i > hi)
    return make_error("'%s' must be between %lld and %lld, got %lld", path(key).c_str(), lo_ll, hi_ll,
                      static_cast<long long>(i));
  return std::optional<int64_t>(i);
}

expected<std::vector<std::string>> JsonFields::string_list(std::string_view key, size_t max_items) const {
  std::vector<std::string> out;
  const ordered_json* v = get(key);
  if (!v) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const auto& s : *v) {
      if (!s.is_string())
        return make_error("'%s' must be a string or an array of strings, got an array holding %s", path(key).c_str(),
                          s.type_name());
      out.push_back(s.get<std::string>());
    }
  } else {
    return make_error("'%s' must be a string or an array of strings, got %s", path(key).c_str(), v->type_name());
  }
  if (out.size() > max_items)
    return make_error("'%s' has %zu entries; at most %zu are allowed", path(key).c_str(), out.size(), max_items);
  for (const auto& s : out)
    if (s.empty()) return make_error("'%s' must not contain empty strings", path(key).c_str());
  return out;
}

expected<const ordered_json*> JsonFields::object(std::string_view key) const {
  const ordered_json* v = get(key);
  if (v && !v->is_object()) return make_error("'%s' must be an object, got %s", path(key).c_str(), v->type_name());
  return v;
}

expected<const ordered_json*> JsonFields::array(std::string_view key) const {
  const ordered_json* v = get(key);
  if (v && !v->is_array()) return make_error("'%s' must be an array, got %s", path(key).c_str(), v->type_name());
  return v;
}

}  // namespace dsv4
