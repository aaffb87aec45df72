// Fuzz target: the KV-cache file reader (kv/kv_file.h) must reject or accept
// any byte string without crashing, reading out of bounds or allocating
// beyond the input. Checksums stop random inputs at the first check, so every
// input is also tried "sealed" (all checksums recomputed, kv_seal): that
// reaches the field and section validation behind them. An accepted sealed
// image must re-encode to the same bytes (the format has one encoding).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kv/kv_file.h"

namespace {

void walk(const dsv4::KvFileView& v) {
  size_t sum = v.text.size() + v.payload.size();
  for (int32_t t : v.tokens) sum += static_cast<size_t>(t);
  for (const auto& [id, dsml] : v.tools) sum += id.size() + dsml.size();
  volatile size_t sink = sum;
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> in(data, size);
  if (auto v = dsv4::kv_parse_file(in)) walk(*v);
  (void)dsv4::kv_parse_header(in, size);
  (void)dsv4::kv_parse_usage(in);
  (void)dsv4::kv_parse_tool_map(in);

  std::vector<uint8_t> sealed(data, data + size);
  dsv4::kv_seal(sealed);
  auto v = dsv4::kv_parse_file(sealed);
  if (!v) return 0;
  walk(*v);
  dsv4::KvFileContent c;
  c.identity = v->header.identity;
  c.reason = v->header.reason;
  c.decoded_key = v->header.decoded_key();
  c.ctx = v->header.ctx;
  c.created = v->header.created;
  c.text = v->text;
  c.tokens = v->tokens;
  c.payload = v->payload;
  c.tools = &v->tools;
  std::vector<uint8_t> again = dsv4::kv_build_image(c, v->usage);
  // Equal except the usage block, which the parser replaces when its check fails.
  if (again.size() != sealed.size() || std::memcmp(again.data(), sealed.data(), dsv4::k_kv_usage_offset) != 0 ||
      std::memcmp(again.data() + dsv4::k_kv_text_offset, sealed.data() + dsv4::k_kv_text_offset,
                  sealed.size() - dsv4::k_kv_text_offset) != 0)
    std::abort();
  return 0;
}
