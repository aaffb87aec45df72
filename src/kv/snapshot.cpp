#include "kv/snapshot.h"

#include <cstring>

#include "core/hash.h"

namespace dsv4 {

namespace {

constexpr char k_magic[8] = {'D', 'S', 'V', '4', 'S', 'N', 'A', 'P'};

struct Writer {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    uint8_t x[sizeof(T)];
    std::memcpy(x, &v, sizeof v);
    b.insert(b.end(), x, x + sizeof v);
  }
  void bytes(const void* p, size_t n) {
    const uint8_t* q = static_cast<const uint8_t*>(p);
    b.insert(b.end(), q, q + n);
  }
  // Appends `rows` rows of tensor t starting at row r0 (read from the backend).
  void rows(Backend& be, const Tensor& t, int64_t r0, int64_t rows) {
    if (rows <= 0) return;
    size_t off = b.size();
    b.resize(off + static_cast<size_t>(rows) * t.row_bytes());
    be.read(t, b.data() + off, static_cast<size_t>(rows) * t.row_bytes(), static_cast<size_t>(r0) * t.row_bytes());
  }
};

struct Reader {
  std::span<const uint8_t> b;
  size_t pos = 0;
  Status need(size_t n) const {
    if (n > b.size() - pos) return make_error("snapshot truncated at byte %zu (needs %zu more)", pos, n);
    return {};
  }
  template <class T>
  expected<T> get() {
    DSV4_TRY(need(sizeof(T)));
    T v;
    std::memcpy(&v, b.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  Status rows(Backend& be, const Tensor& t, int64_t r0, int64_t rows) {
    if (rows <= 0) return {};
    size_t n = static_cast<size_t>(rows) * t.row_bytes();
    DSV4_TRY(need(n));
    be.write(t, b.data() + pos, n, static_cast<size_t>(r0) * t.row_bytes());
    pos += n;
    return {};
  }
};

// Visits the per-layer state in serialisation order. `fn(backend, tensor, first_row, n_rows)`: a layer
// pipeline's layers are in the states of the stages that hold them (KvState::next), on those stages'
// backends, and last_hidden is the last stage's; the bytes are the same as one model's.
template <class Fn>
void walk_layers(Model& model, const KvState& s, uint64_t T, bool with_rows, Fn&& fn_be) {
  const ModelSpec& spec = model.spec();
  const uint64_t W = spec.sliding_window;
  const uint64_t n_raw = std::min<uint64_t>(T, W);
  Model* stage = &model;
  const KvState* st = &s;
  auto fn = [&](const Tensor& t, int64_t r0, int64_t n) { fn_be(stage->backend(), t, r0, n); };
  for (uint32_t il = 0; il < spec.n_layer; ++il) {
    while (il >= stage->layer_end()) {
      stage = stage->next_stage();
      st = &st->next.at(0);
    }
    const LayerState& L = st->layers[il];
    // Raw window rows in position order; each maps to ring slot pos % cap_w.
    for (uint64_t p = T - n_raw; p < T; ++p) fn(L.ring, static_cast<int64_t>(p % s.cap_w), 1);
    const uint32_t m = spec.ratio(il);
    if (m == 0) continue;
    if (with_rows) fn(L.comp, 0, static_cast<int64_t>(T / m));
    fn(L.comp_a, 0, L.comp_a.n_rows());
    fn(L.comp_g, 0, L.comp_g.n_rows());
    if (m != 4) continue;
    if (with_rows) fn(L.idx, 0, static_cast<int64_t>(T / 4));
    fn(L.idx_a, 0, L.idx_a.n_rows());
    fn(L.idx_g, 0, L.idx_g.n_rows());
  }
  fn(st->last_hidden, 0, st->last_hidden.n_rows());
}

// Waits for every stage's backend.
void synchronize_stages(Model& model) {
  for (Model* m = &model; m; m = m->next_stage()) m->backend().synchronize();
}

}  // namespace

std::string model_fingerprint(const ModelSpec& spec, const ModelWeights& w) {
  Hasher h(HashKind::SHA256);
  auto u32 = [&](uint32_t v) { h.update(&v, 4); };
  auto f32 = [&](float v) { h.update(&v, 4); };
  for (uint32_t v :
       {spec.n_layer,       spec.n_embd,           spec.n_vocab,       spec.n_head,        spec.head_dim,
        spec.rope_dim,      spec.q_lora_rank,      spec.o_lora_rank,   spec.o_groups,      spec.n_expert,
        spec.n_expert_used, spec.n_expert_shared,  spec.expert_ff,     spec.n_hash_layers, spec.sliding_window,
        spec.indexer_heads, spec.indexer_head_dim, spec.indexer_top_k, spec.hc_count,      spec.hc_sinkhorn_iters})
    u32(v);
  for (uint32_t il = 0; il < spec.n_layer; ++il) u32(spec.ratio(il));
  for (float v :
       {spec.rope_theta, spec.compress_rope_theta, spec.rope_scale_factor, spec.expert_weights_scale, spec.rms_eps})
    f32(v);
  auto tensor = [&](const TensorRef& t) {
    if (!t) return;
    h.update(t.name);
    u32(static_cast<uint32_t>(t.type));
    for (uint64_t d : t.ne) h.update(&d, 8);
  };
  for (const auto& t : w.global) tensor(t);
  for (const auto& l : w.layers)
    for (const auto& t : l.t) tensor(t);
  std::string hex = h.hex_digest();
  std::string raw(32, '\0');
  for (size_t i = 0; i < 32; ++i) raw[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return raw;
}

std::vector<uint8_t> snapshot_save(Model& model, const KvState& s, const std::string& fingerprint,
                                   const std::vector<int32_t>& tokens, const std::vector<float>& logits,
                                   bool with_rows) {
  const ModelSpec& spec = model.spec();
  const uint64_t T = tokens.size();
  Writer w;
  w.bytes(k_magic, 8);
  w.put<uint32_t>(k_snapshot_version);
  w.put<uint32_t>(with_rows ? 1 : 0);
  DSV4_ASSERT(fingerprint.size() == 32, "fingerprint must be 32 bytes");
  w.bytes(fingerprint.data(), 32);
  w.put<uint32_t>(static_cast<uint32_t>(model.options().numerics));
  for (uint32_t v : {spec.n_layer, spec.head_dim, spec.indexer_head_dim, spec.hc_count, spec.n_embd, spec.n_vocab,
                     spec.sliding_window, s.ctx})
    w.put<uint32_t>(v);
  w.put<uint64_t>(T);
  if (with_rows) w.bytes(tokens.data(), T * 4);
  std::vector<float> lg(logits);
  lg.resize(spec.n_vocab, 0.0f);
  w.bytes(lg.data(), lg.size() * 4);
  synchronize_stages(model);
  walk_layers(model, s, T, with_rows,
              [&](Backend& be, const Tensor& t, int64_t r0, int64_t n) { w.rows(be, t, r0, n); });
  std::string digest = sha256_hex(w.b.data(), w.b.size());
  for (size_t i = 0; i < 32; ++i) w.put<uint8_t>(static_cast<uint8_t>(std::stoi(digest.substr(2 * i, 2), nullptr, 16)));
  return std::move(w.b);
}

expected<SnapshotHeader> snapshot_peek(std::span<const uint8_t> bytes) {
  Reader r{bytes};
  DSV4_TRY(r.need(8));
  if (std::memcmp(bytes.data(), k_magic, 8) != 0) return make_error("not a dsv4 session snapshot (bad magic)");
  r.pos = 8;
  SnapshotHeader h;
  DSV4_TRY_ASSIGN(h.version, r.get<uint32_t>());
  if (h.version != k_snapshot_version)
    return make_error("snapshot version %u is not supported (this build reads %u)", h.version, k_snapshot_version);
  DSV4_TRY_ASSIGN(uint32_t flags, r.get<uint32_t>());
  h.with_rows = flags & 1;
  DSV4_TRY(r.need(32));
  h.fingerprint.assign(reinterpret_cast<const char*>(bytes.data() + r.pos), 32);
  r.pos += 32;
  DSV4_TRY_ASSIGN(uint32_t num, r.get<uint32_t>());
  if (num > static_cast<uint32_t>(Numerics::FAST)) return make_error("snapshot has unknown numerics %u", num);
  h.numerics = static_cast<Numerics>(num);
  r.pos += 7 * 4;
  DSV4_TRY_ASSIGN(h.ctx, r.get<uint32_t>());
  DSV4_TRY_ASSIGN(h.n_tokens, r.get<uint64_t>());
  return h;
}

Status snapshot_load(Model& model, KvState& s, const std::string& fingerprint, std::span<const uint8_t> bytes,
                     std::vector<int32_t>& tokens, std::vector<float>& logits) {
  const ModelSpec& spec = model.spec();
  if (bytes.size() < 8 + 32) return make_error("snapshot truncated (%zu bytes)", bytes.size());
  std::string digest = sha256_hex(bytes.data(), bytes.size() - 32);
  for (size_t i = 0; i < 32; ++i)
    if (static_cast<uint8_t>(std::stoi(digest.substr(2 * i, 2), nullptr, 16)) != bytes[bytes.size() - 32 + i])
      return make_error("snapshot checksum mismatch: the data is corrupt");
  DSV4_TRY_ASSIGN(SnapshotHeader h, snapshot_peek(bytes));
  if (h.fingerprint != fingerprint) return make_error("snapshot was made with a different model or quantisation");
  if (h.numerics != model.options().numerics)
    return make_error("snapshot was made with %s numerics, the engine runs %s", numerics_name(h.numerics),
                      numerics_name(model.options().numerics));
  Reader r{bytes.first(bytes.size() - 32)};
  r.pos = 8 + 4 + 4 + 32 + 4;
  const uint32_t want[] = {spec.n_layer, spec.head_dim, spec.indexer_head_dim, spec.hc_count,
                           spec.n_embd,  spec.n_vocab,  spec.sliding_window};
  for (uint32_t v : want) {
    DSV4_TRY_ASSIGN(uint32_t got, r.get<uint32_t>());
    if (got != v) return make_error("snapshot shape does not match the model");
  }
  r.pos += 4 + 8;  // ctx, T (from the header)
  const uint64_t T = h.n_tokens;
  if (T > s.ctx)
    return make_error("snapshot holds %llu tokens but the session context is %u", static_cast<unsigned long long>(T),
                      s.ctx);
  std::vector<int32_t> new_tokens;
  if (h.with_rows) {
    DSV4_TRY(r.need(T * 4));
    new_tokens.resize(T);
    std::memcpy(new_tokens.data(), bytes.data() + r.pos, T * 4);
    r.pos += T * 4;
    for (int32_t t : new_tokens)
      if (t < 0 || static_cast<uint32_t>(t) >= spec.n_vocab)
        return make_error("snapshot holds an out-of-vocabulary token %d", t);
  } else {
    if (tokens.size() < T) return make_error("light snapshot is ahead of the session");
    new_tokens.assign(tokens.begin(), tokens.begin() + static_cast<long>(T));
  }
  std::vector<float> new_logits(spec.n_vocab);
  DSV4_TRY(r.need(spec.n_vocab * 4ull));
  std::memcpy(new_logits.data(), bytes.data() + r.pos, spec.n_vocab * 4ull);
  r.pos += spec.n_vocab * 4ull;
  // Check the exact size before touching the state.
  uint64_t need = 0;
  walk_layers(model, s, T, h.with_rows,
              [&](Backend&, const Tensor& t, int64_t, int64_t n) { need += static_cast<uint64_t>(n) * t.row_bytes(); });
  if (r.b.size() - r.pos != need)
    return make_error("snapshot payload is %zu bytes, expected %llu", r.b.size() - r.pos,
                      static_cast<unsigned long long>(need));
  if (h.with_rows) model.reset_state(s);
  Status st;
  walk_layers(model, s, T, h.with_rows, [&](Backend& be, const Tensor& t, int64_t r0, int64_t n) {
    if (st) st = r.rows(be, t, r0, n);
  });
  DSV4_TRY(st);
  tokens = std::move(new_tokens);
  logits = std::move(new_logits);
  return {};
}

}  // namespace dsv4
