// The vocabulary of a model file for the text tools (`dsv4 tokenize`,
// `dsv4 render --tokens`): only the GGUF metadata is read, not the weights.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::tools {

// Errors say what to do: a missing file gets the "how to get a model" hint.
expected<std::unique_ptr<Tokenizer>> load_vocabulary(const std::string& model_path);

// A token's bytes for display: double-quoted, with \n, \r, \t, \", \\ and
// other control characters escaped, and bytes that are not part of valid
// UTF-8 (a token can end inside a character) written as \xNN.
std::string display_piece(std::string_view bytes);

}  // namespace dsv4::tools
