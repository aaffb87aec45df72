// Leveled logging to stderr. One process-wide level, set once from options.
#pragma once

namespace dsv4 {

enum class LogLevel { DEBUG, INFO, WARN, ERROR, QUIET };

void log_set_level(LogLevel level);
LogLevel log_level();

[[gnu::format(printf, 1, 2)]] void log_debug(const char* fmt, ...);
[[gnu::format(printf, 1, 2)]] void log_info(const char* fmt, ...);
[[gnu::format(printf, 1, 2)]] void log_warn(const char* fmt, ...);
[[gnu::format(printf, 1, 2)]] void log_error(const char* fmt, ...);

}  // namespace dsv4
