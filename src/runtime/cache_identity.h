// The identity an engine writes into and demands from KV-cache files
// (docs/kv-cache-format.md §4): the model's content identity
// (Engine::content_identity), the numerics and the quant description. The
// content identity reads the whole model file, so a server resolves it
// through the cache directory's remembered identities
// (kv/model_identity_store.h) and hashes only when they do not know the file.
#pragma once

#include "dsv4/engine.h"
#include "kv/kv_file.h"
#include "kv/model_identity_store.h"

namespace dsv4::runtime {

// With Engine::content_identity (computed at the first call on this engine).
KvIdentity cache_identity(const Engine& engine);

enum class IdentityOrigin {
  REMEMBERED,  // read from the directory's store: no byte of the model was read
  COMPUTED,    // Engine::content_identity
};
const char* identity_origin_name(IdentityOrigin o);

struct ResolvedIdentity {
  KvIdentity identity;
  IdentityOrigin origin = IdentityOrigin::COMPUTED;
};

// cache_identity(engine) through `store`: REMEMBERED when the model file on
// disk still has the stamp it had when the engine mapped it and the store
// holds an entry for that path and stamp; otherwise COMPUTED and, when the
// file still has that stamp after hashing, remembered in the store (a failed
// write is a warning). A synthetic model (no file) is always computed and
// never remembered.
ResolvedIdentity cache_identity(const Engine& engine, ModelIdentityStore& store);

}  // namespace dsv4::runtime
