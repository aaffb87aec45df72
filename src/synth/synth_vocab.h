// A usable byte-level BPE vocabulary for synthetic models: the 256 byte tokens,
// the DeepSeek V4 special tokens (at their published ids when the vocabulary is
// full-size), and merged tokens that BPE can really reach (letter n-grams and
// common words), so that tokenisation, chat rendering and decoding all work on
// a synthetic model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/token_type.h"

namespace dsv4 {

struct SynthVocab {
  std::vector<std::string> tokens;  // index = id, byte-to-unicode form
  std::vector<std::string> merges;  // "left right", rank order
  std::vector<int32_t> types;       // TokenType values
};

// n_vocab >= 129280: published special-token ids; otherwise a compact layout
// (BOS 0, EOS 1, pad 2, bytes, specials, merges) that needs n_vocab >= 300.
SynthVocab make_synth_vocab(uint32_t n_vocab);

// The special-token strings (formats.md §3.2).
namespace special {
inline constexpr const char* BOS =
    "<\xef\xbd\x9c"
    "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
inline constexpr const char* EOS =
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>";
inline constexpr const char* PAD = "<\xef\xbd\x9c\xe2\x96\x81pad\xe2\x96\x81\xef\xbd\x9c>";
inline constexpr const char* USER = "<\xef\xbd\x9cUser\xef\xbd\x9c>";
inline constexpr const char* ASSISTANT =
    "<\xef\xbd\x9c"
    "Assistant\xef\xbd\x9c>";
inline constexpr const char* THINK = "<think>";
inline constexpr const char* THINK_END = "</think>";
inline constexpr const char* DSML =
    "\xef\xbd\x9c"
    "DSML\xef\xbd\x9c";
inline constexpr const char* LATEST_REMINDER = "<\xef\xbd\x9clatest_reminder\xef\xbd\x9c>";
}  // namespace special

}  // namespace dsv4
