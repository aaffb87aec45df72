#include "kv/kv_file.h"

#include <algorithm>
#include <cstring>

#include "kv/snapshot.h"

namespace dsv4 {

namespace {

// Header field offsets (docs/kv-cache-format.md §2).
constexpr size_t k_off_version = 8;
constexpr size_t k_off_header_bytes = 12;
constexpr size_t k_off_model = 16;
constexpr size_t k_off_numerics = 48;
constexpr size_t k_off_gate_up_type = 52;
constexpr size_t k_off_down_type = 56;
constexpr size_t k_off_dense_type = 60;
constexpr size_t k_off_routed_bits = 64;
constexpr size_t k_off_reason = 68;
constexpr size_t k_off_flags = 72;
constexpr size_t k_off_ctx = 76;
constexpr size_t k_off_n_tokens = 80;
constexpr size_t k_off_created = 88;
constexpr size_t k_off_text_bytes = 96;
constexpr size_t k_off_payload_bytes = 104;
constexpr size_t k_off_tool_map_bytes = 112;
constexpr size_t k_off_text_sha = 120;
constexpr size_t k_off_token_sha = 152;
constexpr size_t k_off_tool_map_sha = 184;
constexpr size_t k_off_reserved = 216;  // 8 bytes, zero
constexpr size_t k_off_header_sha = 224;
// Usage block, relative to k_kv_usage_offset.
constexpr size_t k_usage_last_used = 0;
constexpr size_t k_usage_hits = 8;
constexpr size_t k_usage_reserved = 12;
constexpr size_t k_usage_check = 16;  // first 16 bytes of SHA-256 of the block's first 16 bytes

template <class T>
void put(uint8_t* p, size_t off, T v) {
  std::memcpy(p + off, &v, sizeof v);
}
template <class T>
T get(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof v);
  return v;
}
void put_digest(uint8_t* p, size_t off, const Digest& d) { std::memcpy(p + off, d.data(), d.size()); }
Digest get_digest(const uint8_t* p, size_t off) {
  Digest d;
  std::memcpy(d.data(), p + off, d.size());
  return d;
}
bool digest_at(const uint8_t* p, const Digest& d) { return std::memcmp(p, d.data(), d.size()) == 0; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

const char* save_reason_name(SaveReason r) {
  switch (r) {
    case SaveReason::OTHER: return "other";
    case SaveReason::COLD: return "cold";
    case SaveReason::FRONTIER: return "frontier";
    case SaveReason::DISPLACED: return "displaced";
    case SaveReason::SHUTDOWN: return "shutdown";
    case SaveReason::EXPLICIT: return "explicit";
  }
  return "?";
}

Digest sha256_digest(const void* data, size_t size) {
  std::optional<Digest> d = digest_from_hex(sha256_hex(data, size));
  DSV4_ASSERT(d.has_value());
  return *d;
}

std::string digest_hex(const Digest& d) {
  static const char* k_hex = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = k_hex[d[i] >> 4];
    s[2 * i + 1] = k_hex[d[i] & 15];
  }
  return s;
}

std::optional<Digest> digest_from_hex(std::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  Digest d;
  for (size_t i = 0; i < 32; ++i) {
    int hi = hex_value(hex[2 * i]), lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    d[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return d;
}

std::array<uint8_t, k_kv_header_bytes> kv_encode_header(const KvHeader& h) {
  std::array<uint8_t, k_kv_header_bytes> b{};
  uint8_t* p = b.data();
  std::memcpy(p, k_kv_magic, 8);
  put<uint32_t>(p, k_off_version, h.version);
  put<uint32_t>(p, k_off_header_bytes, static_cast<uint32_t>(k_kv_header_bytes));
  put_digest(p, k_off_model, h.identity.model);
  put<uint32_t>(p, k_off_numerics, h.identity.numerics);
  put<uint32_t>(p, k_off_gate_up_type, h.identity.expert_gate_up_type);
  put<uint32_t>(p, k_off_down_type, h.identity.expert_down_type);
  put<uint32_t>(p, k_off_dense_type, h.identity.dense_type);
  put<uint32_t>(p, k_off_routed_bits, h.identity.routed_bits);
  put<uint32_t>(p, k_off_reason, static_cast<uint32_t>(h.reason));
  put<uint32_t>(p, k_off_flags, h.flags);
  put<uint32_t>(p, k_off_ctx, h.ctx);
  put<uint64_t>(p, k_off_n_tokens, h.n_tokens);
  put<uint64_t>(p, k_off_created, h.created);
  put<uint64_t>(p, k_off_text_bytes, h.text_bytes);
  put<uint64_t>(p, k_off_payload_bytes, h.payload_bytes);
  put<uint64_t>(p, k_off_tool_map_bytes, h.tool_map_bytes);
  put_digest(p, k_off_text_sha, h.text_sha);
  put_digest(p, k_off_token_sha, h.token_sha);
  put_digest(p, k_off_tool_map_sha, h.tool_map_sha);
  put_digest(p, k_off_header_sha, sha256_digest(p, k_kv_header_hashed_bytes));
  return b;
}

expected<KvHeader> kv_parse_header(std::span<const uint8_t> bytes, uint64_t file_bytes) {
  if (file_bytes < k_kv_text_offset || bytes.size() < k_kv_text_offset)
    return make_error("truncated: %llu bytes, shorter than the %zu-byte header",
                      static_cast<unsigned long long>(file_bytes), k_kv_text_offset);
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, k_kv_magic, 8) != 0) return make_error("not a dsv4 KV-cache file (bad magic)");
  KvHeader h;
  h.version = get<uint32_t>(p, k_off_version);
  if (h.version != k_kv_version)
    return make_error("wrong version: format version %u, this build reads version %u", h.version, k_kv_version);
  if (!digest_at(p + k_off_header_sha, sha256_digest(p, k_kv_header_hashed_bytes)))
    return make_error("corrupt header (header checksum mismatch)");
  if (get<uint32_t>(p, k_off_header_bytes) != k_kv_header_bytes) return make_error("corrupt header (header size)");
  for (size_t i = 0; i < 8; ++i)
    if (p[k_off_reserved + i] != 0) return make_error("corrupt header (reserved bytes are not zero)");
  h.identity.model = get_digest(p, k_off_model);
  h.identity.numerics = get<uint32_t>(p, k_off_numerics);
  h.identity.expert_gate_up_type = get<uint32_t>(p, k_off_gate_up_type);
  h.identity.expert_down_type = get<uint32_t>(p, k_off_down_type);
  h.identity.dense_type = get<uint32_t>(p, k_off_dense_type);
  h.identity.routed_bits = get<uint32_t>(p, k_off_routed_bits);
  const uint32_t reason = get<uint32_t>(p, k_off_reason);
  if (reason > k_kv_max_reason) return make_error("corrupt header (save reason %u)", reason);
  h.reason = static_cast<SaveReason>(reason);
  h.flags = get<uint32_t>(p, k_off_flags);
  if (h.flags & ~k_kv_known_flags) return make_error("corrupt header (unknown flags 0x%x)", h.flags);
  h.ctx = get<uint32_t>(p, k_off_ctx);
  h.n_tokens = get<uint64_t>(p, k_off_n_tokens);
  h.created = get<uint64_t>(p, k_off_created);
  h.text_bytes = get<uint64_t>(p, k_off_text_bytes);
  h.payload_bytes = get<uint64_t>(p, k_off_payload_bytes);
  h.tool_map_bytes = get<uint64_t>(p, k_off_tool_map_bytes);
  h.text_sha = get_digest(p, k_off_text_sha);
  h.token_sha = get_digest(p, k_off_token_sha);
  h.tool_map_sha = get_digest(p, k_off_tool_map_sha);
  if (h.n_tokens == 0 || h.n_tokens > k_kv_max_tokens)
    return make_error("corrupt header (token count %llu)", static_cast<unsigned long long>(h.n_tokens));
  if (h.ctx < h.n_tokens) return make_error("corrupt header (context %u is below the token count)", h.ctx);
  if (h.text_bytes > k_kv_max_text_bytes || h.payload_bytes == 0 || h.payload_bytes > k_kv_max_payload_bytes ||
      h.tool_map_bytes > k_kv_max_tool_map_bytes)
    return make_error("corrupt header (section sizes)");
  if (((h.flags & k_kv_flag_tool_map) != 0) != (h.tool_map_bytes > 0))
    return make_error("corrupt header (tool map flag and size disagree)");
  if (h.tool_map_bytes == 0 && h.tool_map_sha != Digest{})
    return make_error("corrupt header (tool map hash without a tool map)");
  // Each size is bounded above, so the sum cannot overflow.
  const uint64_t want = h.file_bytes();
  if (file_bytes < want)
    return make_error("truncated: %llu bytes, the header describes %llu", static_cast<unsigned long long>(file_bytes),
                      static_cast<unsigned long long>(want));
  if (file_bytes > want)
    return make_error("corrupt: %llu bytes, the header describes %llu (trailing bytes)",
                      static_cast<unsigned long long>(file_bytes), static_cast<unsigned long long>(want));
  return h;
}

Status kv_check_identity(const KvHeader& h, const KvIdentity& id) {
  if (h.identity.model != id.model)
    return make_error("foreign model: made by model %s, this engine is %s",
                      digest_hex(h.identity.model).substr(0, 16).c_str(), digest_hex(id.model).substr(0, 16).c_str());
  if (!(h.identity == id)) return make_error("foreign model: same weights but different numerics or quant description");
  return {};
}

std::array<uint8_t, k_kv_usage_bytes> kv_encode_usage(const KvUsage& u) {
  std::array<uint8_t, k_kv_usage_bytes> b{};
  put<uint64_t>(b.data(), k_usage_last_used, u.last_used);
  put<uint32_t>(b.data(), k_usage_hits, u.hits);
  put<uint32_t>(b.data(), k_usage_reserved, 0);
  Digest d = sha256_digest(b.data(), k_usage_check);
  std::memcpy(b.data() + k_usage_check, d.data(), k_kv_usage_bytes - k_usage_check);
  return b;
}

std::optional<KvUsage> kv_parse_usage(std::span<const uint8_t> block) {
  if (block.size() < k_kv_usage_bytes) return std::nullopt;
  Digest d = sha256_digest(block.data(), k_usage_check);
  if (std::memcmp(block.data() + k_usage_check, d.data(), k_kv_usage_bytes - k_usage_check) != 0) return std::nullopt;
  if (get<uint32_t>(block.data(), k_usage_reserved) != 0) return std::nullopt;
  KvUsage u;
  u.last_used = get<uint64_t>(block.data(), k_usage_last_used);
  u.hits = get<uint32_t>(block.data(), k_usage_hits);
  return u;
}

bool kv_tool_entry_valid(const std::string& id, const std::string& dsml) {
  return !id.empty() && id.size() <= k_kv_max_tool_id_bytes && !dsml.empty() && dsml.size() <= k_kv_max_tool_dsml_bytes;
}

std::vector<uint8_t> kv_encode_tool_map(const ToolDsmlMap& m) {
  std::vector<uint8_t> b;
  if (m.empty()) return b;
  auto u32 = [&](uint32_t v) {
    uint8_t x[4];
    std::memcpy(x, &v, 4);
    b.insert(b.end(), x, x + 4);
  };
  u32(static_cast<uint32_t>(m.size()));
  for (const auto& [id, dsml] : m) {  // std::map: ids strictly ascending
    DSV4_ASSERT(kv_tool_entry_valid(id, dsml), "tool map entry out of range (id %zu bytes, dsml %zu bytes)", id.size(),
                dsml.size());
    u32(static_cast<uint32_t>(id.size()));
    u32(static_cast<uint32_t>(dsml.size()));
    b.insert(b.end(), id.begin(), id.end());
    b.insert(b.end(), dsml.begin(), dsml.end());
  }
  return b;
}

expected<ToolDsmlMap> kv_parse_tool_map(std::span<const uint8_t> bytes) {
  size_t pos = 0;
  auto u32 = [&](uint32_t& v) {
    if (bytes.size() - pos < 4) return false;
    std::memcpy(&v, bytes.data() + pos, 4);
    pos += 4;
    return true;
  };
  uint32_t count = 0;
  if (!u32(count) || count == 0) return make_error("corrupt tool map (entry count)");
  // Every entry takes at least 10 bytes, which bounds the count by the size.
  if (count > bytes.size() / 10) return make_error("corrupt tool map (entry count %u)", count);
  ToolDsmlMap m;
  const std::string* prev = nullptr;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t id_len = 0, dsml_len = 0;
    if (!u32(id_len) || !u32(dsml_len)) return make_error("corrupt tool map (truncated entry %u)", i);
    if (id_len == 0 || id_len > k_kv_max_tool_id_bytes || dsml_len == 0 || dsml_len > k_kv_max_tool_dsml_bytes)
      return make_error("corrupt tool map (entry %u sizes)", i);
    if (bytes.size() - pos < uint64_t{id_len} + dsml_len) return make_error("corrupt tool map (truncated entry %u)", i);
    std::string id(reinterpret_cast<const char*>(bytes.data() + pos), id_len);
    pos += id_len;
    std::string dsml(reinterpret_cast<const char*>(bytes.data() + pos), dsml_len);
    pos += dsml_len;
    if (prev && !(*prev < id)) return make_error("corrupt tool map (ids not strictly ascending)");
    auto it = m.emplace_hint(m.end(), std::move(id), std::move(dsml));
    prev = &it->first;
  }
  if (pos != bytes.size()) return make_error("corrupt tool map (trailing bytes)");
  return m;
}

void KvChecksum::update(const uint8_t* data, size_t size) {
  // Skip the part of [pos_, pos_ + size) that lies in the usage block.
  const uint64_t a = k_kv_usage_offset, z = k_kv_usage_offset + k_kv_usage_bytes;
  const uint64_t begin = pos_, end = pos_ + size;
  if (end <= a || begin >= z) {
    hasher_.update(data, size);
  } else {
    if (begin < a) hasher_.update(data, a - begin);
    if (end > z) hasher_.update(data + (z - begin), end - z);
  }
  pos_ = end;
}

Digest KvChecksum::finish() {
  std::optional<Digest> d = digest_from_hex(hasher_.hex_digest());
  DSV4_ASSERT(d.has_value());
  return *d;
}

expected<KvFileView> kv_parse_file(std::span<const uint8_t> image) {
  KvFileView v;
  DSV4_TRY_ASSIGN(v.header, kv_parse_header(image, image.size()));
  const KvHeader& h = v.header;
  KvChecksum sum;
  sum.update(image.data(), h.checksum_offset());
  if (!digest_at(image.data() + h.checksum_offset(), sum.finish()))
    return make_error("corrupt: file checksum mismatch");
  // The checksum matched, so what follows can only fail for a file that a
  // faulty writer sealed; it is still checked rather than trusted.
  const uint8_t* text = image.data() + k_kv_text_offset;
  if (sha256_digest(text, h.text_bytes) != h.text_sha)
    return make_error("corrupt: the key text does not match its hash");
  const uint8_t* toks = image.data() + h.tokens_offset();
  if (sha256_digest(toks, 4 * h.n_tokens) != h.token_sha)
    return make_error("corrupt: the token ids do not match their hash");
  v.text = std::string_view(reinterpret_cast<const char*>(text), h.text_bytes);
  v.tokens.resize(h.n_tokens);
  std::memcpy(v.tokens.data(), toks, 4 * h.n_tokens);
  for (int32_t t : v.tokens)
    if (t < 0) return make_error("corrupt: negative token id %d", t);
  v.payload = image.subspan(h.payload_offset(), h.payload_bytes);
  if (h.tool_map_bytes > 0) {
    auto section = image.subspan(h.tool_map_offset(), h.tool_map_bytes);
    if (sha256_digest(section.data(), section.size()) != h.tool_map_sha)
      return make_error("corrupt: the tool map does not match its hash");
    DSV4_TRY_ASSIGN(v.tools, kv_parse_tool_map(section));
  }
  auto snap = snapshot_peek(v.payload);
  if (!snap) return make_error("corrupt payload: %s", snap.error().message.c_str());
  if (!snap->with_rows) return make_error("corrupt payload: a light checkpoint, not a full session snapshot");
  if (snap->n_tokens != h.n_tokens)
    return make_error("corrupt payload: holds %llu tokens, the header says %llu",
                      static_cast<unsigned long long>(snap->n_tokens), static_cast<unsigned long long>(h.n_tokens));
  if (static_cast<uint32_t>(snap->numerics) != h.identity.numerics)
    return make_error("corrupt payload: numerics differ from the header");
  v.usage = kv_parse_usage(image.subspan(k_kv_usage_offset, k_kv_usage_bytes)).value_or(KvUsage{0, h.created});
  return v;
}

KvHeader kv_make_header(const KvFileContent& c, const std::vector<uint8_t>& tool_section) {
  KvHeader h;
  h.identity = c.identity;
  h.reason = c.reason;
  h.flags = (c.decoded_key ? k_kv_flag_decoded_key : 0) | (tool_section.empty() ? 0 : k_kv_flag_tool_map);
  h.ctx = c.ctx;
  h.n_tokens = c.tokens.size();
  h.created = c.created;
  h.text_bytes = c.text.size();
  h.payload_bytes = c.payload.size();
  h.tool_map_bytes = tool_section.size();
  h.text_sha = sha256_digest(c.text.data(), c.text.size());
  h.token_sha = sha256_digest(c.tokens.data(), 4 * c.tokens.size());
  if (!tool_section.empty()) h.tool_map_sha = sha256_digest(tool_section.data(), tool_section.size());
  return h;
}

std::vector<uint8_t> kv_build_image(const KvFileContent& c, const KvUsage& usage) {
  std::vector<uint8_t> tools = c.tools ? kv_encode_tool_map(*c.tools) : std::vector<uint8_t>{};
  KvHeader h = kv_make_header(c, tools);
  std::vector<uint8_t> b;
  b.reserve(h.file_bytes());
  auto hdr = kv_encode_header(h);
  b.insert(b.end(), hdr.begin(), hdr.end());
  auto use = kv_encode_usage(usage);
  b.insert(b.end(), use.begin(), use.end());
  b.insert(b.end(), c.text.begin(), c.text.end());
  const uint8_t* tp = reinterpret_cast<const uint8_t*>(c.tokens.data());
  b.insert(b.end(), tp, tp + 4 * c.tokens.size());
  b.insert(b.end(), c.payload.begin(), c.payload.end());
  b.insert(b.end(), tools.begin(), tools.end());
  KvChecksum sum;
  sum.update(b.data(), b.size());
  Digest d = sum.finish();
  b.insert(b.end(), d.begin(), d.end());
  return b;
}

void kv_seal(std::vector<uint8_t>& image) {
  if (image.size() < k_kv_text_offset + k_kv_checksum_bytes) return;
  uint8_t* p = image.data();
  // The tool map hash, when the declared sections fit inside the image.
  const uint64_t text = get<uint64_t>(p, k_off_text_bytes), n = get<uint64_t>(p, k_off_n_tokens);
  const uint64_t payload = get<uint64_t>(p, k_off_payload_bytes), tools = get<uint64_t>(p, k_off_tool_map_bytes);
  const uint64_t limit = image.size() - k_kv_checksum_bytes;
  if (text <= limit && n <= limit && payload <= limit && tools <= limit && tools > 0) {
    const uint64_t off = k_kv_text_offset + text + 4 * n + payload;
    if (off <= limit && tools <= limit - off) put_digest(p, k_off_tool_map_sha, sha256_digest(p + off, tools));
  }
  put_digest(p, k_off_header_sha, sha256_digest(p, k_kv_header_hashed_bytes));
  Digest u = sha256_digest(p + k_kv_usage_offset, k_usage_check);
  std::memcpy(p + k_kv_usage_offset + k_usage_check, u.data(), k_kv_usage_bytes - k_usage_check);
  KvChecksum sum;
  sum.update(p, image.size() - k_kv_checksum_bytes);
  put_digest(p, image.size() - k_kv_checksum_bytes, sum.finish());
}

std::string kv_file_name(const Digest& text_sha) { return digest_hex(text_sha) + ".kv"; }

std::optional<Digest> kv_parse_file_name(std::string_view name) {
  if (name.size() != 67 || name.substr(64) != ".kv") return std::nullopt;
  return digest_from_hex(name.substr(0, 64));
}

}  // namespace dsv4
