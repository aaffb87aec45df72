#include "runtime/cache_identity.h"

#include "core/assert.h"
#include "core/log.h"
#include "model/forward.h"

namespace dsv4::runtime {

namespace {

KvIdentity identity_of(const EngineInfo& info, const Digest& model) {
  KvIdentity id;
  id.model = model;
  auto numerics = numerics_from_name(info.numerics);
  DSV4_ASSERT(numerics.has_value(), "EngineInfo::numerics \"%s\" is not a numerics name", info.numerics.c_str());
  id.numerics = static_cast<uint32_t>(*numerics);
  id.expert_gate_up_type = info.expert_gate_up_type;
  id.expert_down_type = info.expert_down_type;
  id.dense_type = info.dense_type;
  id.routed_bits = static_cast<uint32_t>(info.routed_bits);
  return id;
}

Digest computed_identity(const Engine& engine) {
  std::optional<Digest> d = digest_from_hex(engine.content_identity());
  DSV4_ASSERT(d.has_value(), "Engine::content_identity is not 64 hex characters");
  return *d;
}

}  // namespace

const char* identity_origin_name(IdentityOrigin o) {
  switch (o) {
    case IdentityOrigin::REMEMBERED: return "remembered";
    case IdentityOrigin::COMPUTED: return "computed";
  }
  return "?";
}

KvIdentity cache_identity(const Engine& engine) { return identity_of(engine.info(), computed_identity(engine)); }

ResolvedIdentity cache_identity(const Engine& engine, ModelIdentityStore& store) {
  ResolvedIdentity r;
  std::optional<ModelFileKey> key;
  if (std::optional<ModelFileStamp> file = engine.model_file()) {
    auto now = file_stamp_of(file->path);
    if (now && *now == file->stamp) {
      key = ModelFileKey{file->path, file->stamp};
    } else {
      log_warn(
          "KV disk cache: %s changed since it was loaded; the identity of the loaded model is computed and not "
          "remembered",
          file->path.c_str());
    }
  }
  if (key) {
    if (std::optional<Digest> d = store.find(*key)) {
      log_info("KV disk cache: model identity from cache (%s, for %s)", store.path().c_str(), key->path.c_str());
      r.identity = identity_of(engine.info(), *d);
      r.origin = IdentityOrigin::REMEMBERED;
      return r;
    }
  }
  const Digest model = computed_identity(engine);
  r.identity = identity_of(engine.info(), model);
  r.origin = IdentityOrigin::COMPUTED;
  if (!key) return r;
  auto after = file_stamp_of(key->path);
  if (!after || *after != key->stamp) {
    log_warn("KV disk cache: %s changed while it was hashed; its identity is not remembered", key->path.c_str());
  } else if (Status st = store.remember(*key, model); !st) {
    log_warn("KV disk cache: %s; the model will be hashed again at the next start", st.error().message.c_str());
  } else {
    log_debug("KV disk cache: model identity remembered in %s", store.path().c_str());
  }
  return r;
}

}  // namespace dsv4::runtime
