#include "server/engine_backend.h"

namespace dsv4::server {

expected<std::unique_ptr<EngineBackend>> EngineBackend::create(std::unique_ptr<Engine> engine, uint32_t ctx) {
  DSV4_TRY_ASSIGN(auto session, engine->new_session(ctx));
  return std::unique_ptr<EngineBackend>(new EngineBackend(std::move(engine), std::move(session)));
}

std::string EngineBackend::describe() const {
  const EngineInfo& i = engine_->info();
  return strfmt("%s (%s, %s backend, %s numerics, ctx %u)", i.model_name.c_str(), i.quant.c_str(), i.backend.c_str(),
                i.numerics.c_str(), session_->ctx());
}

expected<GenerateResult> EngineBackend::generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                                 const GenerateCallbacks& callbacks) {
  return dsv4::generate(*session_, engine_->tokenizer(), prompt, options, callbacks);
}

}  // namespace dsv4::server
