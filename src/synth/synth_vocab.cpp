#include "synth/synth_vocab.h"

#include <set>

#include "core/assert.h"
#include "core/byte_unicode.h"
#include "core/error.h"
#include "core/utf8.h"

namespace dsv4 {

namespace {

std::string byte_token(uint8_t b) {
  std::string s;
  utf8_append(s, byte_to_unicode(b));
  return s;
}

// Builds merges left to right along each word ("Ġthe" -> Ġ+t, Ġt+h, Ġth+e), adding
// each new token once, until `limit` tokens exist.
struct MergeBuilder {
  SynthVocab& v;
  std::set<std::string> known;
  uint32_t limit;

  void add_word(const std::string& word_bytes) {
    std::vector<std::string> syms;
    for (unsigned char c : word_bytes) syms.push_back(byte_token(c));
    std::string acc = syms[0];
    for (size_t i = 1; i < syms.size(); ++i) {
      std::string next = acc + syms[i];
      if (!known.count(next)) {
        if (v.tokens.size() >= limit) return;
        v.merges.push_back(acc + " " + syms[i]);
        v.tokens.push_back(next);
        v.types.push_back(static_cast<int32_t>(TokenType::NORMAL));
        known.insert(next);
      }
      acc = next;
    }
  }
};

const char* const k_common_words[] = {
    "the",   "and",   "to",    "of",     "in",   "is",    "you",      "that",  "it",        "for",   "on",   "with",
    "as",    "are",   "this",  "be",     "at",   "have",  "or",       "from",  "an",        "by",    "not",  "we",
    "can",   "what",  "all",   "your",   "if",   "will",  "there",    "one",   "hello",     "world", "help", "code",
    "model", "token", "print", "return", "def",  "int",   "function", "class", "import",    "const", "let",  "true",
    "false", "null",  "tool",  "call",   "name", "value", "think",    "user",  "assistant",
};

}  // namespace

SynthVocab make_synth_vocab(uint32_t n_vocab) {
  SynthVocab v;
  const bool full = n_vocab >= 129280;
  DSV4_ASSERT(n_vocab >= 300, "synthetic vocabularies need at least 300 tokens");
  auto push = [&](std::string s, TokenType t) {
    v.tokens.push_back(std::move(s));
    v.types.push_back(static_cast<int32_t>(t));
  };
  push(special::BOS, TokenType::CONTROL);
  push(special::EOS, TokenType::CONTROL);
  push(special::PAD, TokenType::CONTROL);
  for (int b = 0; b < 256; ++b) push(byte_token(static_cast<uint8_t>(b)), TokenType::NORMAL);

  // Specials: published ids for a full-size vocabulary, packed after the bytes otherwise.
  struct Special {
    uint32_t id;
    const char* text;
  };
  const Special specials[] = {
      {128800,
       "<\xef\xbd\x9c"
       "fim\xe2\x96\x81hole\xef\xbd\x9c>"},
      {128801,
       "<\xef\xbd\x9c"
       "fim\xe2\x96\x81"
       "begin\xef\xbd\x9c>"},
      {128802,
       "<\xef\xbd\x9c"
       "fim\xe2\x96\x81"
       "end\xef\xbd\x9c>"},
      {128803, special::USER},
      {128804, special::ASSISTANT},
      {128805, "<|EOT|>"},
      {128806,
       "<\xef\xbd\x9ctool\xe2\x96\x81"
       "calls\xe2\x96\x81"
       "begin\xef\xbd\x9c>"},
      {128807,
       "<\xef\xbd\x9ctool\xe2\x96\x81"
       "calls\xe2\x96\x81"
       "end\xef\xbd\x9c>"},
      {128808,
       "<\xef\xbd\x9ctool\xe2\x96\x81"
       "call\xe2\x96\x81"
       "begin\xef\xbd\x9c>"},
      {128809,
       "<\xef\xbd\x9ctool\xe2\x96\x81"
       "call\xe2\x96\x81"
       "end\xef\xbd\x9c>"},
      {128810,
       "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"
       "begin\xef\xbd\x9c>"},
      {128811,
       "<\xef\xbd\x9ctool\xe2\x96\x81outputs\xe2\x96\x81"
       "end\xef\xbd\x9c>"},
      {128812,
       "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
       "begin\xef\xbd\x9c>"},
      {128813,
       "<\xef\xbd\x9ctool\xe2\x96\x81output\xe2\x96\x81"
       "end\xef\xbd\x9c>"},
      {128814, "<\xef\xbd\x9ctool\xe2\x96\x81sep\xef\xbd\x9c>"},
      {128821, special::THINK},
      {128822, special::THINK_END},
      {128825, special::DSML},
      {128828, special::LATEST_REMINDER},
      {128829,
       "<\xef\xbd\x9c"
       "action\xef\xbd\x9c>"},
      {128830, "<\xef\xbd\x9cquery\xef\xbd\x9c>"},
      {128831,
       "<\xef\xbd\x9c"
       "authority\xef\xbd\x9c>"},
      {128832,
       "<\xef\xbd\x9c"
       "domain\xef\xbd\x9c>"},
      {128836, "<\xef\xbd\x9ctitle\xef\xbd\x9c>"},
      {128845, "<\xef\xbd\x9cread_url\xef\xbd\x9c>"},
  };

  if (!full) {
    for (const auto& sp : specials) push(sp.text, TokenType::CONTROL);
    MergeBuilder mb{v, {}, n_vocab};
    for (const char* w : k_common_words) {
      mb.add_word(std::string(" ") + w);
      mb.add_word(w);
    }
    // Fill any rest with letter bigrams (reachable merges).
    for (char a = 'a'; a <= 'z' && v.tokens.size() < n_vocab; ++a)
      for (char b = 'a'; b <= 'z' && v.tokens.size() < n_vocab; ++b) mb.add_word(std::string{a, b});
    while (v.tokens.size() < n_vocab)
      push(strfmt("<\xef\xbd\x9c"
                  "unused\xe2\x96\x81%zu\xef\xbd\x9c>",
                  v.tokens.size()),
           TokenType::UNUSED);
    return v;
  }

  // Full size: merged n-gram tokens up to id 127999, then the special block.
  MergeBuilder mb{v, {}, 128000};
  for (const char* w : k_common_words) {
    mb.add_word(std::string(" ") + w);
    mb.add_word(w);
  }
  for (int len = 2; len <= 4 && v.tokens.size() < 128000; ++len) {
    // All lowercase n-grams of this length, with and without a leading space, in lexical order.
    std::string g(static_cast<size_t>(len), 'a');
    for (;;) {
      mb.add_word(g);
      mb.add_word(" " + g);
      if (v.tokens.size() >= 128000) break;
      int i = len - 1;
      while (i >= 0 && g[static_cast<size_t>(i)] == 'z') g[static_cast<size_t>(i--)] = 'a';
      if (i < 0) break;
      ++g[static_cast<size_t>(i)];
    }
  }
  DSV4_ASSERT(v.tokens.size() == 128000, "full-size synthetic vocab filled to %zu", v.tokens.size());
  v.tokens.resize(n_vocab);
  v.types.resize(n_vocab, static_cast<int32_t>(TokenType::UNUSED));
  for (uint32_t id = 128000; id < n_vocab; ++id)
    v.tokens[id] = strfmt("<\xef\xbd\x9cplace\xe2\x96\x81holder\xe2\x96\x81no\xe2\x96\x81%u\xef\xbd\x9c>", id - 128000);
  for (const auto& sp : specials) {
    v.tokens[sp.id] = sp.text;
    v.types[sp.id] = static_cast<int32_t>(TokenType::CONTROL);
  }
  return v;
}

}  // namespace dsv4
