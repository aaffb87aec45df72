#include "server/server_options.h"

#include "core/error.h"

namespace dsv4::server {

std::string ServerOptions::describe() const {
  std::string aliases_text;
  for (const auto& a : aliases) aliases_text += (aliases_text.empty() ? "" : ",") + a;
  std::string hosts_text;
  for (const auto& h : allowed_hosts) hosts_text += (hosts_text.empty() ? "" : ",") + h;
  return strfmt(
      "http://%s:%d model-id=%s%s%s auth=%s cors=%s%s%s queue=%zu body-limit=%zu MiB http-threads=%d "
      "read-timeout=%gs connections=%zu per client, %zu in all keepalive=%gs shutdown-grace=%gs",
      host.c_str(), port, model_id.c_str(), aliases.empty() ? "" : " aliases=", aliases_text.c_str(),
      api_key.empty() ? "off" : "on", cors_origin.empty() ? "off" : cors_origin.c_str(),
      allowed_hosts.empty() ? "" : " allowed-hosts=", hosts_text.c_str(), max_queue, max_body_bytes >> 20,
      effective_http_threads(), read_timeout_seconds, max_client_connections, max_connections, keepalive_seconds,
      shutdown_grace_seconds);
}

}  // namespace dsv4::server
