#include "vocab.h"

#include <sys/stat.h>

#include "core/utf8.h"
#include "gguf/gguf.h"
#include "model/model_file.h"

namespace dsv4::tools {

expected<std::unique_ptr<Tokenizer>> load_vocabulary(const std::string& model_path) {
  struct stat st {};
  if (::stat(model_path.c_str(), &st) != 0)
    return make_error("model file '%s' not found: %s", model_path.c_str(), k_model_help);
  DSV4_TRY_ASSIGN(auto gguf, GgufFile::open(model_path));
  auto tok = Tokenizer::from_gguf(*gguf);
  if (!tok) return tok.error().with_context("reading the vocabulary of " + model_path);
  return std::move(*tok);
}

std::string display_piece(std::string_view b) {
  std::string out = "\"";
  size_t i = 0;
  while (i < b.size()) {
    const unsigned char c = static_cast<unsigned char>(b[i]);
    if (c < 0x80) {
      switch (c) {
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        default:
          if (c < 0x20 || c == 0x7f)
            out += strfmt("\\x%02x", c);
          else
            out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(b.substr(i));
    if (n == 0) {
      out += strfmt("\\x%02x", c);
      ++i;
    } else {
      out.append(b.substr(i, n));
      i += n;
    }
  }
  return out + "\"";
}

}  // namespace dsv4::tools
