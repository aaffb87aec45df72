#include "runtime/cache_identity.h"

#include "core/assert.h"
#include "core/log.h"

namespace dsv4::runtime {

namespace {

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

KvIdentity cache_identity(const Engine& engine) { return engine.kv_identity(computed_identity(engine)); }

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
      r.identity = engine.kv_identity(*d);
      r.origin = IdentityOrigin::REMEMBERED;
      return r;
    }
  }
  const Digest model = computed_identity(engine);
  r.identity = engine.kv_identity(model);
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
