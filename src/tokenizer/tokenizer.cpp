#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/utf8.h"
#include "tokenizer/pretokenize.h"

namespace dsv4 {
namespace {

// Far above any real vocabulary (DeepSeek V4: 129280 tokens, 127741 merges);
// a count beyond these is a corrupt file, not a tokenizer.
constexpr size_t k_max_vocab = size_t{1} << 22;
constexpr size_t k_max_merges = size_t{1} << 22;

constexpr std::string_view k_key_tokens = "tokenizer.ggml.tokens";
constexpr std::string_view k_key_merges = "tokenizer.ggml.merges";
constexpr std::string_view k_key_types = "tokenizer.ggml.token_type";
constexpr std::string_view k_key_model = "tokenizer.ggml.model";
constexpr std::string_view k_key_pre = "tokenizer.ggml.pre";

bool is_special_type(TokenType t) { return t == TokenType::CONTROL || t == TokenType::USER_DEFINED; }

std::string kv_type_string(const GgufKV& kv) {
  if (kv.type != GgufType::ARRAY) return gguf_type_name(kv.type);
  return std::string("array of ") + gguf_type_name(kv.elem_type);
}

expected<std::vector<std::string>> read_string_array(const GgufFile& f, std::string_view key) {
  const GgufKV* kv = f.find(key);
  if (!kv)
    return make_error("missing metadata key \"%.*s\" (the GGUF carries no byte-level BPE tokenizer)",
                      static_cast<int>(key.size()), key.data());
  if (kv->type != GgufType::ARRAY || (kv->count > 0 && kv->elem_type != GgufType::STRING))
    return make_error("metadata key \"%.*s\" is a %s, expected an array of strings", static_cast<int>(key.size()),
                      key.data(), kv_type_string(*kv).c_str());
  DSV4_TRY_ASSIGN(std::vector<GgufScalar> values, GgufFile::array(*kv));
  std::vector<std::string> out;
  out.reserve(values.size());
  for (const GgufScalar& v : values) out.emplace_back(v.s);
  return out;
}

expected<std::vector<int32_t>> read_token_types(const GgufFile& f) {
  const std::string_view key = k_key_types;
  const GgufKV* kv = f.find(key);
  if (!kv) return make_error("missing metadata key \"%.*s\"", static_cast<int>(key.size()), key.data());
  DSV4_TRY_ASSIGN(std::vector<GgufScalar> values, GgufFile::array(*kv));
  std::vector<int32_t> out;
  out.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const GgufScalar& v = values[i];
    if (!v.is_integer())
      return make_error("metadata key \"%.*s\" is a %s, expected an array of integers", static_cast<int>(key.size()),
                        key.data(), kv_type_string(*kv).c_str());
    const std::optional<uint64_t> u = v.as_u64();
    if (!u || *u > static_cast<uint64_t>(TokenType::BYTE))
      return make_error("%.*s[%zu] = %lld is not a token type (0..6)", static_cast<int>(key.size()), key.data(), i,
                        static_cast<long long>(u ? static_cast<int64_t>(*u) : v.i));
    out.push_back(static_cast<int32_t>(*u));
  }
  return out;
}

}  // namespace

expected<std::unique_ptr<Tokenizer>> Tokenizer::from_gguf(const GgufFile& f) {
  auto ctx = [&](const Error& e) { return e.with_context("tokenizer in " + f.path()); };
  if (const GgufKV* kv = f.find(k_key_model)) {
    if (kv->type != GgufType::STRING || GgufFile::scalar(*kv).s != "gpt2")
      return ctx(make_error("%s is %s, expected \"gpt2\" (byte-level BPE)", std::string(k_key_model).c_str(),
                            gguf_value_to_string(*kv).c_str()));
  }
  if (const GgufKV* kv = f.find(k_key_pre)) {
    const std::string_view pre = kv->type == GgufType::STRING ? GgufFile::scalar(*kv).s : std::string_view();
    if (pre != "joyai-llm" && pre != "deepseek-v3")
      return ctx(
          make_error("%s is %s; dsv4 implements only the DeepSeek V3/V4 pre-tokenizer (\"joyai-llm\" or "
                     "\"deepseek-v3\")",
                     std::string(k_key_pre).c_str(), gguf_value_to_string(*kv).c_str()));
  }
  auto tokens = read_string_array(f, k_key_tokens);
  if (!tokens) return ctx(tokens.error());
  auto merges = read_string_array(f, k_key_merges);
  if (!merges) return ctx(merges.error());
  auto types = read_token_types(f);
  if (!types) return ctx(types.error());
  auto tok = from_vocab(std::move(*tokens), std::move(*merges), std::move(*types));
  if (!tok) return ctx(tok.error());
  return tok;
}

expected<std::unique_ptr<Tokenizer>> Tokenizer::from_vocab(std::vector<std::string> tokens,
                                                           std::vector<std::string> merges,
                                                           std::vector<int32_t> token_types) {
  if (tokens.empty()) return make_error("the vocabulary is empty");
  if (tokens.size() > k_max_vocab)
    return make_error("vocabulary of %zu tokens is larger than the supported %zu", tokens.size(), k_max_vocab);
  if (merges.size() > k_max_merges)
    return make_error("%zu merges is more than the supported %zu", merges.size(), k_max_merges);
  if (token_types.size() != tokens.size())
    return make_error("%zu token types for %zu tokens", token_types.size(), tokens.size());
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->types_.reserve(token_types.size());
  for (size_t i = 0; i < token_types.size(); ++i) {
    if (token_types[i] < 0 || token_types[i] > static_cast<int32_t>(TokenType::BYTE))
      return make_error("token %zu has type %d, not a token type (0..6)", i, token_types[i]);
    t->types_.push_back(static_cast<TokenType>(token_types[i]));
  }
  t->tokens_ = std::move(tokens);

  // Text -> id. A non-special token wins a shared text here; find() consults
  // the special tokens first.
  t->by_text_.reserve(t->tokens_.size());
  for (size_t i = 0; i < t->tokens_.size(); ++i) {
    auto [it, inserted] = t->by_text_.emplace(t->tokens_[i], static_cast<int32_t>(i));
    if (!inserted && is_special_type(t->types_[it->second]) && !is_special_type(t->types_[i]))
      it->second = static_cast<int32_t>(i);
  }
  // BPE sees only non-special tokens, so plain text can never come out as a
  // control or user-defined token (a merge that would produce one is
  // reported as producing a token that is not in the vocabulary).
  auto lookup = [&t](std::string_view s) -> std::optional<int32_t> {
    auto it = t->by_text_.find(s);
    if (it == t->by_text_.end() || is_special_type(t->types_[it->second])) return std::nullopt;
    return it->second;
  };
  DSV4_TRY_ASSIGN(t->bpe_, BpeModel::build(lookup, merges));
  DSV4_TRY(t->init());
  return t;
}

Status Tokenizer::init() {
  // Decoded bytes of every token (formats.md §3.6, HF ByteLevel decoder).
  decoded_off_.reserve(tokens_.size() + 1);
  for (const std::string& text : tokens_) {
    decoded_off_.push_back(static_cast<uint32_t>(decoded_.size()));
    std::string bytes;
    bool in_alphabet = utf8_valid(text);
    for (size_t pos = 0; in_alphabet && pos < text.size();) {
      const int b = unicode_to_byte(utf8_decode(text, &pos));
      if (b >= 0)
        bytes.push_back(static_cast<char>(b));
      else
        in_alphabet = false;
    }
    decoded_ += in_alphabet ? bytes : text;
    if (decoded_.size() > UINT32_MAX) return make_error("token texts add up to more than 4 GiB");
  }
  decoded_off_.push_back(static_cast<uint32_t>(decoded_.size()));
  for (size_t i = 0; i + 1 < decoded_off_.size(); ++i)
    max_token_bytes_ = std::max<size_t>(max_token_bytes_, decoded_off_[i + 1] - decoded_off_[i]);

  // Trie of the special-token texts.
  trie_.assign(1, TrieNode{});
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& text = tokens_[id];
    if (!is_special_type(types_[id]) || text.empty()) continue;
    special_first_byte_[static_cast<uint8_t>(text[0])] = true;
    int32_t node = 0;
    for (char ch : text) {
      const auto byte = static_cast<uint8_t>(ch);
      int32_t child = -1;
      for (const auto& [b, idx] : trie_[node].children)
        if (b == byte) child = idx;
      if (child < 0) {
        child = static_cast<int32_t>(trie_.size());
        trie_[node].children.emplace_back(byte, child);
        trie_.emplace_back();
      }
      node = child;
    }
    if (trie_[node].token < 0) trie_[node].token = static_cast<int32_t>(id);
  }

  struct Required {
    std::string_view text;
    const char* what;
    int32_t* id;
  };
  const Required required[] = {
      {k_token_bos, "BOS", &bos_},
      {k_token_eos, "EOS", &eos_},
      {k_token_user, "User marker", &user_},
      {k_token_assistant, "Assistant marker", &assistant_},
      {k_token_think_begin, "thinking start", &think_begin_},
      {k_token_think_end, "thinking end", &think_end_},
      {k_token_dsml, "DSML marker", &dsml_},
  };
  for (const Required& r : required) {
    const std::optional<int32_t> id = find(r.text);
    if (!id)
      return make_error("the vocabulary has no token \"%.*s\" (%s); not a DeepSeek V4 tokenizer",
                        static_cast<int>(r.text.size()), r.text.data(), r.what);
    *r.id = *id;
  }
  return {};
}

std::optional<int32_t> Tokenizer::find(std::string_view token) const {
  if (!token.empty() && special_first_byte_[static_cast<uint8_t>(token[0])]) {
    const auto [id, len] = match_special(token, 0);
    if (len == token.size()) return id;
  }
  auto it = by_text_.find(token);
  if (it == by_text_.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return empty;
  return tokens_[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= types_.size()) return TokenType::UNDEFINED;
  return types_[id];
}

bool Tokenizer::is_special(int32_t id) const { return is_special_type(token_type(id)); }

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return {};
  return std::string_view(decoded_).substr(decoded_off_[id], decoded_off_[id + 1] - decoded_off_[id]);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

std::pair<int32_t, size_t> Tokenizer::match_special(std::string_view text, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto byte = static_cast<uint8_t>(text[i]);
    int32_t child = -1;
    for (const auto& [b, idx] : trie_[node].children)
      if (b == byte) child = idx;
    if (child < 0) break;
    node = child;
    if (trie_[node].token >= 0) best = {trie_[node].token, i + 1 - pos};
  }
  return best;
}

void Tokenizer::encode_plain_into(std::string_view text, std::vector<int32_t>* out, size_t stop_after) const {
  if (text.empty() || out->size() > stop_after) return;
  std::vector<std::string_view> pieces;
  pretokenize(text, &pieces);
  out->reserve(out->size() + std::min(text.size() / 3, stop_after));
  BpeWorkspace ws;
  for (std::string_view piece : pieces) {
    bpe_.encode_piece(piece, out, &ws);
    if (out->size() > stop_after) return;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_plain_into(text, &out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_with_specials(std::string_view text, size_t stop_after) const {
  std::vector<int32_t> out;
  size_t plain_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (special_first_byte_[static_cast<uint8_t>(text[pos])]) {
      const auto [id, len] = match_special(text, pos);
      if (len > 0) {
        encode_plain_into(text.substr(plain_begin, pos - plain_begin), &out, stop_after);
        if (out.size() > stop_after) return out;
        out.push_back(id);
        pos += len;
        plain_begin = pos;
        continue;
      }
    }
    ++pos;
  }
  encode_plain_into(text.substr(plain_begin), &out, stop_after);
  return out;
}

expected<std::vector<int32_t>> Tokenizer::encode_prompt(const RenderedPrompt& p, size_t stop_after) const {
  std::vector<int32_t> out;
  std::string text;  // consecutive text pieces, joined
  for (size_t i = 0; i < p.size(); ++i) {
    const TextPiece& piece = p[i];
    if (!piece.control) {
      text += piece.text;
      continue;
    }
    encode_plain_into(text, &out, stop_after);
    if (out.size() > stop_after) return out;
    text.clear();
    if (piece.text.empty()) return make_error("rendered prompt piece %zu is an empty control marker", i);
    const std::optional<int32_t> id = find(piece.text);
    if (!id)
      return make_error("rendered prompt piece %zu is a control marker \"%s\" that is not a single vocabulary token", i,
                        piece.text.c_str());
    out.push_back(*id);
  }
  encode_plain_into(text, &out, stop_after);
  return out;
}

}  // namespace dsv4
