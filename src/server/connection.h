// Per-connection helpers of the transport: finding the socket a request
// arrived on (to notice a client that went away while its request waits,
// prefills or decodes), and constant-time API-key comparison.
#pragma once

#include <string>
#include <string_view>

namespace dsv4::server {

// The descriptor of the connected socket whose local port is `local_port` and
// whose peer is remote_addr:remote_port (numeric host, as cpp-httplib reports
// it), found among this process's open descriptors; -1 when there is none.
// The HTTP worker thread serving the request owns that socket until the
// response is written, so the descriptor stays valid meanwhile.
int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port);

// True when the peer has closed or reset the connection (POLLRDHUP, POLLHUP
// or POLLERR; pending pipelined input alone is not a close). fd < 0: false.
bool connection_closed(int fd);

// `given` == `expected`, in time independent of where they differ (SHA-256
// of both, compared with CRYPTO_memcmp; lengths leak nothing either).
bool api_key_matches(std::string_view given, std::string_view expected);

}  // namespace dsv4::server
