#include "hf/json_check.h"

#include <set>
#include <string>
#include <vector>

namespace dsv4 {

namespace {

// SAX pass that only validates: one key set per open object (arrays open none).
class CheckingSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  std::string error;

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    objects_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (objects_.empty() || !objects_.back().insert(k).second) {
      error = "duplicate key \"" + k + "\" in one JSON object";
      return false;
    }
    return true;
  }
  bool end_object() override {
    if (!objects_.empty()) objects_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) override {
    error = strfmt("JSON syntax error at byte %zu (near '%s'): %s", position, last_token.c_str(), ex.what());
    return false;
  }

 private:
  std::vector<std::set<std::string>> objects_;
};

}  // namespace

expected<nlohmann::json> json_parse_checked(std::string_view text) {
  CheckingSax sax;
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &sax))
    return make_error("%s", sax.error.empty() ? "invalid JSON" : sax.error.c_str());
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error("invalid JSON");
  return j;
}

}  // namespace dsv4
