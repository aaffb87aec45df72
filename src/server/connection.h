// Per-connection helpers of the transport: noticing a client that went away
// while its request waits, prefills or decodes, and constant-time API-key
// comparison.
#pragma once

#include <string>
#include <string_view>

namespace dsv4::server {

// True when the peer has closed or reset the connection (POLLRDHUP, POLLHUP
// or POLLERR; pending pipelined input alone is not a close). fd < 0: false.
bool connection_closed(int fd);

// `given` == `expected`, in time independent of where they differ (SHA-256
// of both, compared with CRYPTO_memcmp; lengths leak nothing either).
bool api_key_matches(std::string_view given, std::string_view expected);

}  // namespace dsv4::server
