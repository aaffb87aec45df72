// The production Backend: a loaded Engine and its one live Session, driven by
// the shared generation loop (generate/generate.h).
#pragma once

#include <memory>

#include "dsv4/engine.h"
#include "server/backend.h"

namespace dsv4::server {

class EngineBackend final : public Backend {
 public:
  // Creates the live session with context `ctx` (0: the engine default).
  static expected<std::unique_ptr<EngineBackend>> create(std::unique_ptr<Engine> engine, uint32_t ctx);

  const Tokenizer& tokenizer() const override { return engine_->tokenizer(); }
  uint32_t context_size() const override { return session_->ctx(); }
  std::string describe() const override;
  const std::vector<int32_t>& session_tokens() const override { return session_->tokens(); }
  expected<GenerateResult> generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                    const GenerateCallbacks& callbacks) override;

 private:
  EngineBackend(std::unique_ptr<Engine> engine, std::unique_ptr<Session> session)
      : engine_(std::move(engine)), session_(std::move(session)) {}
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Session> session_;
};

}  // namespace dsv4::server
