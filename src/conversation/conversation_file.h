// The saved-conversation file of `dsv4 run` (/save F, /load F): the chat
// history, the thinking level and, optionally, the exact session state
// (Session::save), so that a loaded conversation continues without prefilling
// its history again.
//
// Layout (little-endian), version 1:
//   u8[8]   magic "DSV4CONV"
//   u32     version (1)
//   u32     flags (0; no flags are defined yet, readers reject unknown bits)
//   u64     J: bytes of the JSON header
//   u64     S: bytes of the session snapshot (0: none saved)
//   u8[J]   JSON header, UTF-8:
//             {"format": "dsv4-conversation", "version": 1,
//              "model": {"name", "path", "n_vocab"},   (informational)
//              "thinking": "none" | "high" | "max",
//              "messages": [OpenAI-style messages, message_json.h]}
//   u8[S]   session snapshot (src/kv/snapshot.h; checks its own model
//           fingerprint and checksum when loaded into a session)
//   u8[64]  SHA-256 of everything above, lowercase hex
//
// Readers check the magic, the version, the sizes against the file size and
// the checksum before parsing anything, and say which check failed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_message.h"
#include "chat/thinking.h"
#include "core/error.h"

namespace dsv4 {

inline constexpr uint32_t k_conversation_file_version = 1;

struct SavedConversation {
  ThinkingLevel thinking = ThinkingLevel::HIGH;
  std::vector<ChatMessage> messages;
  // Informational: which model the conversation ran on.
  std::string model_name;
  std::string model_path;
  uint32_t n_vocab = 0;
  std::vector<uint8_t> session;  // Session::save() bytes; empty: the history is prefilled again on load
};

std::vector<uint8_t> conversation_encode(const SavedConversation& c);
expected<SavedConversation> conversation_decode(std::span<const uint8_t> bytes);

// Writes `path` atomically (a temporary file in the same folder, then rename),
// so a failed save never leaves a half-written file behind.
Status conversation_save_file(const std::string& path, const SavedConversation& c);
expected<SavedConversation> conversation_load_file(const std::string& path);

}  // namespace dsv4
