// The DeepSeek V4 tokenizer: byte-level BPE loaded from the GGUF
// (formats.md §3), with the official pre-tokenizer (pretokenize.h).
//
// Three ways in, differing only in how special tokens are treated:
//  * encode(text): plain text. Never produces a control or user-defined token,
//    even when the text spells one (`<｜Assistant｜>` becomes ordinary BPE
//    tokens), so user content cannot forge markers.
//  * encode_prompt(pieces): a rendered chat prompt; text pieces as plain text
//    (adjacent text pieces are joined first, so the result equals tokenizing
//    the rendered string), each control piece as exactly one token.
//  * encode_with_specials(text): control and user-defined tokens spelled in
//    the text are recognised (leftmost, then longest match, like HF's added
//    vocabulary); the text between them is plain text. For raw completion
//    prompts and CLI token dumps only.
//
// Decoding follows formats.md §3.6 / HF's ByteLevel decoder: a token whose
// text lies entirely in the byte-level alphabet is mapped back to bytes;
// any other token (every token containing U+FF5C, e.g. `<｜User｜>`) is
// emitted literally. decode() returns raw bytes (a token may end inside a
// UTF-8 character); StreamDecoder / utf8_lossy give display text.
//
// A Tokenizer is immutable after loading; all methods are safe to call from
// several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/text_piece.h"
#include "core/token_type.h"
#include "gguf/gguf.h"
#include "tokenizer/bpe.h"

namespace dsv4 {

// The marker texts the engine needs (formats.md §3.2; U+FF5C and U+2581).
inline constexpr std::string_view k_token_bos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view k_token_eos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view k_token_user = "<｜User｜>";
inline constexpr std::string_view k_token_assistant = "<｜Assistant｜>";
inline constexpr std::string_view k_token_think_begin = "<think>";
inline constexpr std::string_view k_token_think_end = "</think>";
inline constexpr std::string_view k_token_dsml = "｜DSML｜";

class Tokenizer {
 public:
  // Reads tokenizer.ggml.tokens / .merges / .token_type; checks
  // tokenizer.ggml.model ("gpt2") and tokenizer.ggml.pre (a DeepSeek V3/V4
  // pre-tokenizer name) when present.
  static expected<std::unique_ptr<Tokenizer>> from_gguf(const GgufFile& f);
  // tokens[id]: byte-level text for normal tokens, literal text for
  // control/user-defined ones; merges[rank] = "<left> <right>";
  // token_types[id]: TokenType values.
  static expected<std::unique_ptr<Tokenizer>> from_vocab(std::vector<std::string> tokens,
                                                         std::vector<std::string> merges,
                                                         std::vector<int32_t> token_types);

  std::vector<int32_t> encode(std::string_view text) const;
  // `stop_after`: stop once more than this many tokens were produced (the
  // result is then a prefix longer than stop_after, enough to refuse a
  // prompt that cannot fit a context without tokenising all of it).
  std::vector<int32_t> encode_with_specials(std::string_view text, size_t stop_after = SIZE_MAX) const;
  expected<std::vector<int32_t>> encode_prompt(const RenderedPrompt& p, size_t stop_after = SIZE_MAX) const;
  // Bytes of the longest token: a text of n bytes is at least
  // n / max_token_bytes() tokens.
  size_t max_token_bytes() const { return max_token_bytes_; }

  // Bytes of one token ("" for an id outside the vocabulary).
  std::string decode(int32_t id) const { return std::string(token_bytes(id)); }
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string_view token_bytes(int32_t id) const;

  size_t n_vocab() const { return tokens_.size(); }
  size_t n_merges() const { return bpe_.n_merges(); }
  // Stored text of a token ("" for an id outside the vocabulary).
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  // True for control and user-defined tokens (the ones encode_with_specials
  // recognises).
  bool is_special(int32_t id) const;
  // Id of the token with exactly this stored text. If several tokens share
  // it, a control/user-defined one wins over others, then the lowest id.
  std::optional<int32_t> find(std::string_view token) const;

  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t user() const { return user_; }
  int32_t assistant() const { return assistant_; }
  int32_t think_begin() const { return think_begin_; }
  int32_t think_end() const { return think_end_; }
  int32_t dsml() const { return dsml_; }

 private:
  Tokenizer() = default;
  Status init();
  void encode_plain_into(std::string_view text, std::vector<int32_t>* out, size_t stop_after = SIZE_MAX) const;
  // Longest special token spelled at text[pos...]: (id, length), or length 0.
  std::pair<int32_t, size_t> match_special(std::string_view text, size_t pos) const;

  struct TrieNode {
    int32_t token = -1;                                 // special token ending here
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node index)
  };

  std::vector<std::string> tokens_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string_view, int32_t> by_text_;  // views into tokens_
  BpeModel bpe_;
  std::string decoded_;                // every token's bytes, concatenated
  std::vector<uint32_t> decoded_off_;  // token id -> offset in decoded_ (n_vocab + 1 entries)
  size_t max_token_bytes_ = 1;
  std::vector<TrieNode> trie_;         // special-token texts; node 0 is the root
  bool special_first_byte_[256] = {};  // quick filter for match_special

  int32_t bos_ = -1, eos_ = -1, user_ = -1, assistant_ = -1, think_begin_ = -1, think_end_ = -1, dsml_ = -1;
};

}  // namespace dsv4
