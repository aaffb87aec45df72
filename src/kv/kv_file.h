// KV-cache files (docs/kv-cache-format.md): one cached prompt prefix per file —
// the key text, the exact token ids, the engine's session snapshot
// (kv/snapshot.h) and an optional tool-id -> DSML map — behind a versioned,
// checksummed header. This file is the format only: building, parsing and
// validating byte images; the directory store is kv/disk_cache.h.
//
// Layout, version 2 (all integers little-endian):
//   [0, 256)    immutable header; its last 32 bytes are SHA-256 of [0, 224)
//   [256, 288)  usage block (hits, last use), rewritten in place with pwrite;
//               its own 16-byte check, never part of the file checksum
//   [288, ...)  key text | i32 tokens[n] | snapshot payload | tool map
//   last 32     SHA-256 of [0, 256) ++ [288, end - 32)
// The file size is exactly the sum of the parts; anything else is corrupt.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/hash.h"

namespace dsv4 {

static_assert(std::endian::native == std::endian::little, "KV-cache files are written in host order = little-endian");

inline constexpr char k_kv_magic[8] = {'D', 'S', 'V', '4', 'K', 'V', 'C', '\0'};
inline constexpr uint32_t k_kv_version = 2;
inline constexpr size_t k_kv_header_bytes = 256;
inline constexpr size_t k_kv_header_hashed_bytes = 224;  // the header checksum covers [0, 224)
inline constexpr size_t k_kv_usage_offset = 256;
inline constexpr size_t k_kv_usage_bytes = 32;
inline constexpr size_t k_kv_text_offset = 288;
inline constexpr size_t k_kv_checksum_bytes = 32;

// Reader limits (a file beyond them is corrupt).
inline constexpr uint64_t k_kv_max_tokens = uint64_t{1} << 24;
inline constexpr uint64_t k_kv_max_text_bytes = uint64_t{1} << 30;
inline constexpr uint64_t k_kv_max_payload_bytes = uint64_t{1} << 42;
inline constexpr uint64_t k_kv_max_tool_map_bytes = uint64_t{1} << 30;
inline constexpr size_t k_kv_max_tool_id_bytes = 256;
inline constexpr size_t k_kv_max_tool_dsml_bytes = size_t{64} << 20;

// Header flags; every other bit must be 0.
inline constexpr uint32_t k_kv_flag_decoded_key = 1u << 0;  // key text == the decoded bytes of the tokens
inline constexpr uint32_t k_kv_flag_tool_map = 1u << 1;     // a tool map section is present
inline constexpr uint32_t k_kv_known_flags = k_kv_flag_decoded_key | k_kv_flag_tool_map;

// Why a file was written (informational; eviction does not read it).
enum class SaveReason : uint32_t {
  OTHER = 0,
  COLD = 1,       // the trimmed, aligned prefix of a long first prompt
  FRONTIER = 2,   // an aligned frontier during a long prefill or generation
  DISPLACED = 3,  // a live session about to be replaced by an unrelated request
  SHUTDOWN = 4,   // a live session at clean shutdown
  EXPLICIT = 5,   // asked for by a user or API call
};
inline constexpr uint32_t k_kv_max_reason = 5;
const char* save_reason_name(SaveReason r);

using Digest = std::array<uint8_t, 32>;
Digest sha256_digest(const void* data, size_t size);
std::string digest_hex(const Digest& d);
std::optional<Digest> digest_from_hex(std::string_view hex);  // 64 hex characters, either case

// Which engine may read a file. A file whose identity differs is foreign.
struct KvIdentity {
  Digest model{};                    // Engine::content_identity (kv/model_identity.h): every byte of the model file
  uint32_t numerics = 0;             // Numerics value (0 reference, 1 plain, 2 fast)
  uint32_t expert_gate_up_type = 0;  // ggml type ids of the quant mix (covered by `model`,
  uint32_t expert_down_type = 0;     // stored so a file can be described without the model)
  uint32_t dense_type = 0;
  uint32_t routed_bits = 0;
  bool operator==(const KvIdentity&) const = default;
};

struct KvHeader {
  uint32_t version = k_kv_version;
  KvIdentity identity;
  SaveReason reason = SaveReason::OTHER;
  uint32_t flags = 0;
  uint32_t ctx = 0;  // context of the session that wrote the file
  uint64_t n_tokens = 0;
  uint64_t created = 0;  // Unix seconds
  uint64_t text_bytes = 0;
  uint64_t payload_bytes = 0;
  uint64_t tool_map_bytes = 0;
  Digest text_sha{};      // SHA-256 of the key text (also the file name)
  Digest token_sha{};     // SHA-256 of the token ids as i32 little-endian
  Digest tool_map_sha{};  // SHA-256 of the tool map section (zeros when absent)

  uint64_t tokens_offset() const { return k_kv_text_offset + text_bytes; }
  uint64_t payload_offset() const { return tokens_offset() + 4 * n_tokens; }
  uint64_t tool_map_offset() const { return payload_offset() + payload_bytes; }
  uint64_t checksum_offset() const { return tool_map_offset() + tool_map_bytes; }
  uint64_t file_bytes() const { return checksum_offset() + k_kv_checksum_bytes; }
  bool decoded_key() const { return flags & k_kv_flag_decoded_key; }
};

struct KvUsage {
  uint32_t hits = 0;
  uint64_t last_used = 0;  // Unix seconds
};

// Tool-call id -> the exact DSML block the model sampled (formats.md §4.6).
using ToolDsmlMap = std::map<std::string, std::string>;

// Header bytes with the header checksum filled in.
std::array<uint8_t, k_kv_header_bytes> kv_encode_header(const KvHeader& h);
// Validates a header against the size of the file it came from: magic,
// version, header checksum, field ranges, and file_bytes == the sum of the
// parts. `bytes` holds at least the first k_kv_text_offset bytes (fewer: truncated).
expected<KvHeader> kv_parse_header(std::span<const uint8_t> bytes, uint64_t file_bytes);
// A file belongs to `id` only when every identity field matches.
Status kv_check_identity(const KvHeader& h, const KvIdentity& id);

std::array<uint8_t, k_kv_usage_bytes> kv_encode_usage(const KvUsage& u);
// nullopt when the block's check fails (a torn in-place update): callers fall
// back to {0 hits, last use = created}; the rest of the file stays valid.
std::optional<KvUsage> kv_parse_usage(std::span<const uint8_t> block);

// Section: u32 count, then per entry (ids strictly ascending) u32 id_len,
// u32 dsml_len, id bytes, dsml bytes. Empty map: no section at all.
std::vector<uint8_t> kv_encode_tool_map(const ToolDsmlMap& m);
expected<ToolDsmlMap> kv_parse_tool_map(std::span<const uint8_t> bytes);
// Entries a file may carry: 1..256-byte ids, 1 byte..64 MiB DSML.
bool kv_tool_entry_valid(const std::string& id, const std::string& dsml);

// A whole file, fully validated.
struct KvFileView {
  KvHeader header;
  KvUsage usage;  // {0, created} when the usage block is torn
  std::string_view text;
  std::vector<int32_t> tokens;
  std::span<const uint8_t> payload;
  ToolDsmlMap tools;
};
// Checks, in order: the header (kv_parse_header against image.size()), the
// file checksum, the text / token / tool-map hashes, token ids >= 0, the
// tool map, and that the payload is a full session snapshot of exactly
// n_tokens tokens with the header's numerics. Spans point into `image`, which must outlive the view (a
// temporary buffer would leave them dangling: that overload is deleted).
expected<KvFileView> kv_parse_file(std::span<const uint8_t> image);
expected<KvFileView> kv_parse_file(std::vector<uint8_t>&& image) = delete;

// Streaming file checksum: feed the image in order; bytes of the usage block
// are skipped by position.
class KvChecksum {
 public:
  void update(const uint8_t* data, size_t size);
  Digest finish();  // the checksum is then spent

 private:
  Hasher hasher_{HashKind::SHA256};
  uint64_t pos_ = 0;
};

// Everything a writer supplies; sizes, hashes and flags are derived.
struct KvFileContent {
  KvIdentity identity;
  SaveReason reason = SaveReason::OTHER;
  bool decoded_key = true;
  uint32_t ctx = 0;
  uint64_t created = 0;
  std::string_view text;
  std::span<const int32_t> tokens;
  std::span<const uint8_t> payload;
  const ToolDsmlMap* tools = nullptr;  // entries must satisfy kv_tool_entry_valid
};
// The header of `c` (hashes computed) and its tool map section.
KvHeader kv_make_header(const KvFileContent& c, const std::vector<uint8_t>& tool_section);
// A whole image in memory (tests, fuzz seeds; the store streams instead).
std::vector<uint8_t> kv_build_image(const KvFileContent& c, const KvUsage& usage);
// Recomputes the header checksum, the usage check, the tool map hash (when
// the header's sizes fit the image) and the file checksum in place, so a test
// or a fuzzer can make images whose only faults are the ones it planted.
void kv_seal(std::vector<uint8_t>& image);

// "<64 lowercase hex of text_sha>.kv"; the parser accepts hex of either case.
std::string kv_file_name(const Digest& text_sha);
std::optional<Digest> kv_parse_file_name(std::string_view name);

}  // namespace dsv4
