// What the scheduler's worker thread drives: a model with one live session.
// The real implementation wraps Engine + Session + generate()
// (engine_backend.h); ScriptedBackend (scripted_backend.h) replays scripted
// completions through the same event types, for tests and client
// integration work without a model.
//
// Threading: tokenizer(), context_size() and describe() may be called from
// any thread (the tokenizer is immutable); session_tokens() and generate()
// only from the worker thread that owns the backend.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "generate/generate.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const Tokenizer& tokenizer() const = 0;
  // Tokens the live session holds at most (prompt + completion).
  virtual uint32_t context_size() const = 0;
  // One line for the start banner and /health.
  virtual std::string describe() const = 0;

  // The live session's tokens (what the next prompt can reuse).
  virtual const std::vector<int32_t>& session_tokens() const = 0;
  // generate() semantics (generate/generate.h): reuse the longest common
  // prefix of the live session, prefill the rest, sample; the session ends at
  // prompt + completion.
  virtual expected<GenerateResult> generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                            const GenerateCallbacks& callbacks) = 0;
};

}  // namespace dsv4::server
