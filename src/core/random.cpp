#include "core/random.h"

#include <openssl/rand.h>

#include <vector>

#include "core/assert.h"

namespace dsv4 {

std::string random_hex(size_t n_bytes) {
  std::vector<unsigned char> buf(n_bytes);
  const int ok = RAND_bytes(buf.data(), static_cast<int>(buf.size()));
  DSV4_ASSERT(ok == 1, "RAND_bytes failed");
  static constexpr char HEX[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n_bytes);
  for (unsigned char c : buf) {
    out.push_back(HEX[c >> 4]);
    out.push_back(HEX[c & 15]);
  }
  return out;
}

uint64_t random_u64() {
  unsigned char buf[8];
  const int ok = RAND_bytes(buf, sizeof buf);
  DSV4_ASSERT(ok == 1, "RAND_bytes failed");
  uint64_t v = 0;
  for (unsigned char c : buf) v = (v << 8) | c;
  return v;
}

}  // namespace dsv4
