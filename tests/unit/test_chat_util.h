// Shared helpers of the chat tests: fixture loading.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv4::test {

inline std::string chat_fixture_dir() { return std::string(DSV4_TEST_DATA_DIR) + "/chat"; }

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every fixture file whose name starts with `prefix`, sorted, parsed.
inline std::vector<std::pair<std::string, nlohmann::ordered_json>> load_chat_fixtures(const std::string& prefix) {
  std::vector<std::pair<std::string, nlohmann::ordered_json>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(chat_fixture_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || e.path().extension() != ".json") continue;
    auto j = nlohmann::ordered_json::parse(read_text_file(e.path().string()), nullptr, false);
    out.emplace_back(name, j);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

}  // namespace dsv4::test
