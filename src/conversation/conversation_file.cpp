#include "conversation/conversation_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "conversation/message_json.h"
#include "core/fd_io.h"
#include "core/hash.h"

namespace dsv4 {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr char k_magic[8] = {'D', 'S', 'V', '4', 'C', 'O', 'N', 'V'};
constexpr size_t k_fixed_header = 8 + 4 + 4 + 8 + 8;
constexpr size_t k_digest_hex = 64;

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::vector<uint8_t> conversation_encode(const SavedConversation& c) {
  ordered_json h = ordered_json::object();
  h["format"] = "dsv4-conversation";
  h["version"] = k_conversation_file_version;
  h["model"] = ordered_json{{"name", c.model_name}, {"path", c.model_path}, {"n_vocab", c.n_vocab}};
  h["thinking"] = thinking_level_name(c.thinking);
  h["messages"] = messages_to_openai_json(c.messages);
  // Text typed into a terminal is not guaranteed to be UTF-8; ill-formed bytes
  // are stored as U+FFFD rather than failing the save.
  const std::string json = h.dump(1, ' ', false, ordered_json::error_handler_t::replace);

  std::vector<uint8_t> out;
  out.reserve(k_fixed_header + json.size() + c.session.size() + k_digest_hex);
  out.insert(out.end(), k_magic, k_magic + 8);
  put_u32(out, k_conversation_file_version);
  put_u32(out, 0);
  put_u64(out, json.size());
  put_u64(out, c.session.size());
  out.insert(out.end(), json.begin(), json.end());
  out.insert(out.end(), c.session.begin(), c.session.end());
  const std::string digest = sha256_hex(out.data(), out.size());
  DSV4_ASSERT(digest.size() == k_digest_hex, "SHA-256 hex digest has %zu characters", digest.size());
  out.insert(out.end(), digest.begin(), digest.end());
  return out;
}

expected<SavedConversation> conversation_decode(std::span<const uint8_t> b) {
  if (b.size() < 8 || std::memcmp(b.data(), k_magic, 8) != 0)
    return make_error("not a dsv4 conversation file (it does not start with \"DSV4CONV\"; files are written by /save)");
  if (b.size() < k_fixed_header + k_digest_hex)
    return make_error("truncated conversation file: %zu bytes, shorter than the %zu-byte header and checksum", b.size(),
                      k_fixed_header + k_digest_hex);
  const uint32_t version = get_u32(b.data() + 8);
  if (version != k_conversation_file_version)
    return make_error("conversation file version %u is not supported (this dsv4 reads version %u)", version,
                      k_conversation_file_version);
  const uint32_t flags = get_u32(b.data() + 12);
  if (flags != 0) return make_error("conversation file has unknown flags 0x%x (written by a newer dsv4?)", flags);
  const uint64_t json_bytes = get_u64(b.data() + 16);
  const uint64_t session_bytes = get_u64(b.data() + 24);
  const uint64_t body = b.size() - k_fixed_header - k_digest_hex;
  if (json_bytes > body || session_bytes > body - json_bytes || json_bytes + session_bytes != body)
    return make_error(
        "conversation file size mismatch: the header announces %llu + %llu bytes, the file holds %llu "
        "(truncated or damaged)",
        static_cast<unsigned long long>(json_bytes), static_cast<unsigned long long>(session_bytes),
        static_cast<unsigned long long>(body));
  const size_t payload = b.size() - k_digest_hex;
  const std::string want(reinterpret_cast<const char*>(b.data() + payload), k_digest_hex);
  if (sha256_hex(b.data(), payload) != want)
    return make_error("conversation file checksum mismatch (the file is damaged)");

  const auto* json_begin = reinterpret_cast<const char*>(b.data() + k_fixed_header);
  auto parsed = parse_json_text(std::string_view(json_begin, json_bytes));
  if (!parsed) return parsed.error().with_context("conversation file header");
  const ordered_json& h = *parsed;
  const auto format = h.is_object() ? h.find("format") : h.end();
  if (!h.is_object() || format == h.end() || !format->is_string() || *format != "dsv4-conversation")
    return make_error("conversation file header: missing \"format\": \"dsv4-conversation\"");
  SavedConversation c;
  auto thinking = h.find("thinking");
  if (thinking == h.end() || !thinking->is_string())
    return make_error("conversation file header: missing string \"thinking\"");
  auto level = thinking_level_from_string(thinking->get_ref<const std::string&>());
  if (!level) return level.error().with_context("conversation file header");
  c.thinking = *level;
  auto messages = h.find("messages");
  if (messages == h.end()) return make_error("conversation file header: missing \"messages\"");
  auto msgs = from_openai_json(*messages);
  if (!msgs) return msgs.error().with_context("conversation file header");
  c.messages = std::move(*msgs);
  if (auto model = h.find("model"); model != h.end() && model->is_object()) {
    if (auto it = model->find("name"); it != model->end() && it->is_string()) c.model_name = it->get<std::string>();
    if (auto it = model->find("path"); it != model->end() && it->is_string()) c.model_path = it->get<std::string>();
    if (auto it = model->find("n_vocab"); it != model->end() && it->is_number_unsigned())
      c.n_vocab = it->get<uint32_t>();
  }
  const uint8_t* snap = b.data() + k_fixed_header + json_bytes;
  c.session.assign(snap, snap + session_bytes);
  return c;
}

Status conversation_save_file(const std::string& path, const SavedConversation& c) {
  const std::vector<uint8_t> bytes = conversation_encode(c);
  return write_file_atomic(path, bytes.data(), bytes.size());
}

expected<SavedConversation> conversation_load_file(const std::string& path) {
  if (path.empty()) return make_error("no file name given");
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return make_error("cannot open %s: %s", path.c_str(), std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return make_error("cannot read %s (is it a directory?)", path.c_str());
  auto c = conversation_decode(bytes);
  if (!c) return c.error().with_context(path);
  return c;
}

}  // namespace dsv4
