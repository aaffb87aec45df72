// Small helpers shared by the dialect adapters: compact JSON output that
// never throws, timestamps; typed request fields (chat/json_fields.h) and
// random ids (core/random.h) come with it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/json_fields.h"
#include "chat/json_limits.h"
#include "core/error.h"
#include "core/random.h"

namespace dsv4::server {

// Compact JSON; invalid UTF-8 in strings (which parsing never lets in, and
// the model's output never contains) would be replaced instead of throwing.
std::string json_dump(const ordered_json& j);

// Seconds since the Unix epoch.
int64_t unix_time();

}  // namespace dsv4::server
