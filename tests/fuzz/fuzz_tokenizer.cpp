// Fuzz target: the tokenizer on arbitrary bytes, with the HF-trained vocabulary and merges of the golden
// fixture (tests/fixtures/tokenizer/golden.json; DSV4_TOKENIZER_GOLDEN). For any input s:
//   * decode(encode(s)) == s and encode never yields a special token (byte-level BPE covers every byte
//     string; user text cannot forge markers);
//   * decode(encode_with_specials(s)) == s (specials spelled in s become their token, decoded literally);
//   * a StreamDecoder fed encode(s) token by token, then flushed, gives utf8_lossy(s): the streamed text
//     equals the whole reply decoded at once, whatever token boundaries split its characters.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/utf8.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace {

const dsv4::Tokenizer& tokenizer() {
  static const std::unique_ptr<dsv4::Tokenizer> tok = [] {
    std::ifstream in(DSV4_TOKENIZER_GOLDEN, std::ios::binary);
    if (!in) std::abort();  // the fixture is part of the repository
    const nlohmann::json j = nlohmann::json::parse(in);
    auto t = dsv4::Tokenizer::from_vocab(j.at("vocab").get<std::vector<std::string>>(),
                                         j.at("merges").get<std::vector<std::string>>(),
                                         j.at("token_types").get<std::vector<int32_t>>());
    if (!t) std::abort();
    return std::move(*t);
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;  // long inputs only repeat what short ones cover
  const dsv4::Tokenizer& tok = tokenizer();
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = tok.encode(s);
  if (tok.decode(ids) != s) std::abort();
  for (int32_t id : ids)
    if (tok.is_special(id)) std::abort();
  if (tok.decode(tok.encode_with_specials(s)) != s) std::abort();
  dsv4::StreamDecoder sd(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  if (streamed != dsv4::utf8_lossy(s)) std::abort();
  return 0;
}
