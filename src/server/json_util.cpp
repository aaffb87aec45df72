#include "server/json_util.h"

#include <chrono>

namespace dsv4::server {

// nlohmann's dump() recurses once per level. Its callers pass replies the
// server builds, which embed request and model JSON only as values parsed by
// parse_json_text or checked by check_json_depth (at most k_max_json_depth
// levels, json_limits.h) under a few levels of envelope.
std::string json_dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace dsv4::server
