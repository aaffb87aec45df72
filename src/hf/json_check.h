// Strict JSON parsing for the hf layer: syntax errors report the byte offset, and a key that
// appears twice in one object is an error (nlohmann's DOM parser would silently keep the last
// one, which for a safetensors header means a tensor described twice). Never throws.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

expected<nlohmann::json> json_parse_checked(std::string_view text);

}  // namespace dsv4
