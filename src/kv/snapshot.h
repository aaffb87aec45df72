// Session snapshots: the exact incremental state of one sequence as bytes
// (model-spec.md §10.1): tokens, next-token logits, per layer the raw window
// rows, compressed rows, compressor frontiers, indexer rows and frontiers, and
// the final mHC state. Loading a snapshot and continuing gives bitwise the same
// logits as continuing the live session (CPU).
//
// Layout (little-endian), version 2:
//   u8[8]  magic "DSV4SNAP"        u32 version           u32 flags (bit0: rows included)
//   u8[32] model fingerprint (SHA-256, see model_fingerprint)
//   u32 numerics  u32 n_layer  u32 head_dim  u32 indexer_head_dim  u32 hc  u32 n_embd
//   u32 n_vocab   u32 window   u32 ctx       u64 n_tokens T
//   i32 tokens[T] (flag bit0 only)        f32 logits[V]
//   per layer: kv raw[min(T, W)] in position order (positions T-min(T,W) .. T-1)
//     ratio m > 0: [rows: kv comp[T/m]] f32 frontier_a[R][w] f32 frontier_g[R][w]
//     ratio 4:     [rows: ix idx[T/4]]  f32 idx_a[8][2dI]  f32 idx_g[8][2dI]
//   f32 last_hidden[hc][D]
//   u8[32] SHA-256 of everything above
// where a "kv" row is one row of the state's storage format: KV_FP8
// (kv_fp8_row_bytes(hd) bytes, core/kv_rows.h) in reference and fast numerics, f32[hd]
// in plain; an "ix" row is KV_FP4 (kv_fp4_row_bytes(dI)) or f32[dI]. Version 1
// (f32 rows in both numerics) is not read: such files are refused and the
// disk cache rebuilds them.
// A "light" snapshot (no rows, no tokens) restores a session to an earlier
// point of its own timeline: compressed and indexer rows are append-only, so
// the live buffers still hold the right prefix.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/forward.h"

namespace dsv4 {

constexpr uint32_t k_snapshot_version = 2;

// SHA-256 over the hyperparameters and the tensor directory (names, types, dims):
// a snapshot never loads into a different model or quantisation.
std::string model_fingerprint(const ModelSpec& spec, const ModelWeights& w);

struct SnapshotHeader {
  uint32_t version = 0;
  bool with_rows = false;
  std::string fingerprint;  // 32 raw bytes
  Numerics numerics = Numerics::REFERENCE;
  uint32_t ctx = 0;
  uint64_t n_tokens = 0;
};

// Serialises state `s` holding `tokens.size()` tokens.
std::vector<uint8_t> snapshot_save(Model& model, const KvState& s, const std::string& fingerprint,
                                   const std::vector<int32_t>& tokens, const std::vector<float>& logits,
                                   bool with_rows);

// Restores into `s` (which must have ctx >= the saved token count). For a light
// snapshot, `tokens` must already hold at least header.n_tokens tokens of the
// same timeline; on return tokens/logits hold the snapshot's values.
Status snapshot_load(Model& model, KvState& s, const std::string& fingerprint, std::span<const uint8_t> bytes,
                     std::vector<int32_t>& tokens, std::vector<float>& logits);

expected<SnapshotHeader> snapshot_peek(std::span<const uint8_t> bytes);

}  // namespace dsv4
