// The DeepSeek V4 forward pass, written once over the op list (src/ops/ops.h)
// and run by any backend. `Model` owns the uploaded weights and the scratch
// buffers of one batch; `KvState` is the incremental state of one sequence
// (model-spec.md §10): per layer the raw-window ring, compressed rows,
// compressor frontiers, indexer rows and indexer frontiers.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/numerics.h"
#include "model/expert_stats.h"
#include "model/weights.h"
#include "ops/ops.h"

namespace dsv4 {

// Row storage: ring and comp are KV_FP8 and idx is KV_FP4 (core/kv_rows.h) in
// reference numerics — lossless, the stored values went through the FP8/FP4
// simulations — and F32 in plain numerics or with ModelOptions::compact_kv off.
// Frontiers are always F32.
struct LayerState {
  Tensor ring;            // [cap_w, hd] raw window KV, slot = pos % cap_w
  Tensor comp;            // [ctx/m + 1, hd] compressed rows (ratio > 0)
  Tensor comp_a, comp_g;  // compressor frontier [R, c*hd] f32
  Tensor idx;             // [ctx/4 + 1, d_I] indexer rows (ratio 4)
  Tensor idx_a, idx_g;    // indexer compressor frontier [8, 2*d_I] f32
};

// What Model::verify keeps so that Model::commit can keep a prefix of the verified rows without running the
// model again (model/speculate.cpp). Per compressed layer: the compressor frontiers as they were before the
// rows (snap_*), and the rows' compressor projections (kv, gate: [k_max_verify, w]; ikv, igate: the
// indexer's). Allocated at a state's first verify.
struct SpecLayer {
  Tensor snap_a, snap_g, snap_ia, snap_ig;
  Tensor kv, gate, ikv, igate;
};
struct SpecLog {
  std::vector<SpecLayer> layers;
  Tensor snap_hidden;  // [hc, D] last_hidden before the rows
  Tensor hidden;       // [k_max_verify, hc, D] final state of every verified row
  Tensor snap_feat;    // [T, D] dspark_feat before the rows (with a DSpark drafter)
  Tensor feat;         // [k_max_verify, T, D] every verified row's target features
  Tensor pos;          // [k_max_verify] i32: positions for commit's compressor steps
  int64_t p0 = -1;     // the open verify: rows at positions p0 .. p0 + n - 1 (p0 < 0: none)
  int64_t n = 0;
  bool logging = false;  // while its verify pass runs: the forward pass logs into this SpecLog
};

struct KvState {
  uint32_t ctx = 0;    // maximum tokens
  uint32_t cap_w = 0;  // ring rows = window + largest batch
  std::vector<LayerState> layers;
  Tensor last_hidden;  // [hc, D] final mHC state of the last token (MTP input)
  LayerState mtp;      // MTP block's window ring (when the model has an MTP block)
  Tensor mtp_hidden;   // [hc, D] the MTP block's output state of its last draft (the next chained draft's input)
  // DSpark (model/dspark.cpp): the last token's target features, the output state of each target
  // layer averaged over the hc streams ([T, D], T target layers), and each stage's KV rows of the
  // current drafting block (window-only rings).
  Tensor dspark_feat;
  std::vector<LayerState> dspark;
  SpecLog spec;
  uint64_t uid = 0;  // unique per new_state(): names the tensors a recorded decode step uses
  // A layer pipeline (Model::create_pipeline): the next stage's state (its own `next` holds the rest);
  // empty for a model on one backend. This state's layers of other stages are empty.
  std::vector<KvState> next;
};

struct ModelOptions {
  Numerics numerics = Numerics::REFERENCE;
  int max_batch = 512;  // tokens per forward batch (prefill chunk)
  // The activation format of `fast` numerics (core/numerics.h; ignored in the others). The engine always
  // uses the default; tests set FP8_128 (DeepSeek's own act_quant) to compare the two.
  ActQuant fast_act = ActQuant::INT8_32;
  // The inputs fast numerics quantises (FastSite bits; the others as in reference).
  unsigned fast_sites = FAST_DEFAULT_SITES;
  // The activation quantisation of the input(s) `site` (FastSite bits) these options give: fast_act in fast
  // numerics when fast_sites holds any of them, else NONE.
  ActQuant act_quant(unsigned site) const {
    return numerics == Numerics::FAST && (fast_sites & site) ? fast_act : ActQuant::NONE;
  }
  // Compact KV rows in reference numerics (see LayerState); off = f32 rows, for
  // tests that check the compact state changes nothing.
  bool compact_kv = true;
  // Backend memory the model may take (weights, its scratch, and reserve_bytes for sessions' states and the
  // backend's working memory); 0: no limit, every weight on the backend. Within a limit the dense weights go
  // first and the routed experts fill what is left, evenly over the layers; the others stay in host memory
  // where the weights are mapped, read in place (Backend::map_host_weight; MoeExpertsOp::slots).
  uint64_t memory_budget = 0;
  uint64_t reserve_bytes = 0;
  // Routing statistics of earlier runs (model/expert_stats.h; empty: none): within a memory budget the
  // most-used experts over all layers go to the backend first instead of an even spread.
  ExpertStats expert_priority;
  // Count every routed assignment (Model::routing_counts): one small device copy per layer and one read per
  // forward batch.
  bool count_routing = false;
  // One stage of a layer pipeline (Model::create_pipeline, model/pipeline.h): only layers [layer_first,
  // layer_end) live here (0, 0: every layer). The stage that starts at layer 0 embeds the tokens; the others
  // start each batch from the mHC state written to Model::stage_state(n) before it; only the stage that
  // ends at the last layer has the head (logits). A partial stage has no MTP block, DSpark drafter or
  // verify pass.
  uint32_t layer_first = 0, layer_end = 0;
};

// Where the weights went (Model::placement).
struct WeightPlacement {
  uint64_t dense_bytes = 0;                     // every weight but the routed experts, on the backend
  uint64_t scratch_bytes = 0;                   // the model's activation buffers
  uint64_t expert_bytes = 0;                    // routed experts on the backend
  uint64_t host_expert_bytes = 0;               // routed experts read from host memory
  uint64_t stage_bytes = 0;                     // of the reserve: a prefill batch's experts gathered from host memory
  uint32_t n_expert = 0;                        // per layer
  uint32_t min_resident = 0, max_resident = 0;  // routed experts on the backend per layer
  bool by_usage = false;                        // chosen by ModelOptions::expert_priority (else the first N)
};

// Storage types of a state's main KV rows (ring, comp) and indexer rows (see LayerState).
GgmlType kv_row_type(const ModelSpec& spec, const ModelOptions& options);
GgmlType indexer_row_type(const ModelSpec& spec, const ModelOptions& options);
// Bytes of the activation buffers Model::create allocates (WeightPlacement::scratch_bytes; the indexer's
// score rows, grown on demand, not counted).
uint64_t model_scratch_bytes(const ModelSpec& spec, const ModelOptions& options);
// Bytes of backend memory one state for ctx tokens takes (Model::new_state; the layers of
// options.layer_first .. layer_end only).
uint64_t kv_state_bytes(const ModelSpec& spec, const ModelOptions& options, bool mtp, uint32_t ctx);

// One sequence's part of a batched step (Model::step).
struct StepItem {
  KvState* state = nullptr;
  const int32_t* ids = nullptr;  // n tokens at positions p0 .. p0 + n - 1 (the state holds exactly p0 tokens)
  int64_t n = 0;
  int64_t p0 = 0;
  float* logits = nullptr;  // V floats: the logits after the item's last token; nullptr: not wanted
  // A verify item (Model::verify's contract within a step): the logits after every one of its n tokens
  // ([n][V]; then `logits` is unused), n <= k_max_verify; the step leaves its verify open for commit().
  float* all_logits = nullptr;
};

class StageTransport;  // model/pipeline.h

// One pipeline stage's memory (Model::create_pipeline): its ModelOptions::memory_budget and reserve_bytes
// (routed experts beyond the budget stay in host memory, as on one backend).
struct StageMemory {
  uint64_t budget = 0, reserve = 0;
};

class Model {
 public:
  // Uploads the weights to the backend. `mtp` may be null.
  static expected<std::unique_ptr<Model>> create(Backend& backend, const ModelWeights& weights, const MtpWeights* mtp,
                                                 ModelOptions options);
  // A layer pipeline (model/pipeline.h): stage k on backends[k] holds layers [first[k], first[k + 1])
  // (first[0] = 0, ascending, the last stage up to the last layer). The returned model is stage 0; its
  // forward() and step() run every stage (the batch's mHC state passed on through `transport`, default
  // DirectTransport), its states carry the later stages' (KvState::next), so callers use it as one model.
  // `options` applies to every stage; `memory` (empty, or one per stage) sets each stage's budget and reserve.
  // No MTP block, DSpark drafter or verify pass.
  static expected<std::unique_ptr<Model>> create_pipeline(std::span<Backend* const> backends,
                                                          const ModelWeights& weights,
                                                          const std::vector<uint32_t>& first,
                                                          const ModelOptions& options,
                                                          std::span<const StageMemory> memory = {},
                                                          std::shared_ptr<StageTransport> transport = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const { return spec_; }
  const ModelOptions& options() const { return options_; }
  Backend& backend() { return backend_; }
  bool has_mtp() const { return has_mtp_; }
  const WeightPlacement& placement() const { return placement_; }
  // The layers this model runs (ModelOptions::layer_first / layer_end): [layer_first(), layer_end()).
  uint32_t layer_first() const { return first_; }
  uint32_t layer_end() const { return end_; }
  bool has_head() const { return end_ == spec_.n_layer; }
  // The mHC state of a forward batch's n rows ([n, hc, D] f32, row r = the batch's r-th token; the view every
  // block works on): a stage that does not start at layer 0 reads its input there (written before each
  // forward batch of n <= max_batch tokens); after any forward batch it holds the state after this model's
  // last layer.
  Tensor stage_state(int64_t n) const;
  // Routed assignments counted since load (ModelOptions::count_routing; else empty), over every stage.
  ExpertStats routing_counts() const;
  // The next stage of a pipeline (nullptr: the last stage, or a model on one backend).
  Model* next_stage() const { return next_.get(); }

  // A zeroed state for up to ctx tokens (frontiers start empty).
  KvState new_state(uint32_t ctx);
  void free_state(KvState& s);
  void reset_state(KvState& s);  // back to position 0
  // Bytes of backend memory a state for ctx tokens takes.
  uint64_t state_bytes(uint32_t ctx) const { return kv_state_bytes(spec_, options_, has_mtp_, ctx); }

  // Feeds tokens ids[0..n) at positions p0..p0+n-1 (the state must hold exactly
  // p0 tokens), in batches of at most max_batch. Writes the logits of the last
  // token to `logits` (V floats), or of every token when all_logits ([n][V]).
  Status forward(KvState& s, const int32_t* ids, int64_t n, int64_t p0, float* logits, bool all_logits);

  // Several sequences in one forward pass: their tokens are the rows of one
  // batch (Σ n <= max_batch; each state at most once). The dense ops and the
  // routed experts run once over all rows; the ops on a sequence's state (KV
  // ring, compressors, indexer, attention) run per item on its rows, issued
  // as one Backend::*_seqs call over all items (CUDA: one launch). A row's
  // result does not depend on the other rows, so each item gets what
  // forward() alone gives it (bitwise on the CPU backend). A step of
  // single-token items (a batched decode step) runs in the order of the
  // states' uids whatever the items' order, and is recorded and replayed like
  // forward()'s single-token step (see batch_graphs_).
  Status step(std::span<const StepItem> items);

  // MTP draft (model-spec.md §8, the DeepSeek-V3 pairing): the final mHC state of the last
  // fed position p with the embedding of `token` (the token at p+1), run at
  // RoPE position p through the MTP block; logits of the token at p+2.
  // `chain`: the mHC state is instead the MTP block's own output of the previous call (a draft of
  // a draft: p one further, `token` that call's proposal).
  Status mtp_forward(KvState& s, int32_t token, int64_t p, float* logits, bool chain = false);
  // The MTP block's window rows of positions p0 .. p0 + n - 1 as mtp_forward would write them one by
  // one right after each position was fed: row r pairs the final state hidden[r] ([n, hc, D]) of
  // position p0 + r with the token that followed it, next[r] (hidden may hold more rows: the first n
  // are used). One batch; no logits. (After a verify
  // pass, so later drafts attend to the model's own states of the kept tokens, not to drafts.)
  Status mtp_fill(KvState& s, const int32_t* next, const Tensor& hidden, int64_t n, int64_t p0);

  // Speculative decoding (model/speculate.cpp). verify() feeds ids[0..n) at p0.. (the state holds
  // exactly p0 tokens) as one batch and writes the logits after every row ([n][V]); commit(a) then
  // keeps the first a rows (0 <= a <= n), as if only they had been fed: the compressor frontiers
  // go back to their state before the rows and take the kept rows' logged projections again, and
  // last_hidden becomes the last kept row's. Window-ring, compressed and indexer rows of dropped
  // positions need no undo: nothing reads a row before its position is fed again, which rewrites it.
  // The result equals feeding the a rows alone (bitwise on the CPU backend). Every verify is
  // followed by its commit before the state is used otherwise.
  static constexpr int64_t k_max_verify = 16;

  // DSpark drafting (model/dspark.cpp; ds4-variants-mtp-dspark.md §4). attach_dspark uploads a
  // support file's weights; states made afterwards carry what it needs. dspark_draft runs one
  // drafting pass after the state's last token t_L (at position L = tokens - 1): proposals for the
  // tokens at L + 1 .. L + block_size (the first duplicates the model's own next token), cut at the
  // first whose confidence sigmoid is below `confidence` (0: all).
  // What the drafter reads on the host: row `token` of the Markov table W1 as R floats, and the
  // confidence projection as D + R floats (the engine dequantises them; the model layer reads no
  // quantised bytes itself).
  struct DSparkHost {
    std::function<void(int32_t token, float* out)> markov_row;
    std::vector<float> confidence;
  };
  Status attach_dspark(const DSparkWeights& d, DSparkHost host);
  bool has_dspark() const { return has_dspark_; }
  const DSparkMeta& dspark_meta() const { return dspark_meta_; }
  expected<std::vector<int32_t>> dspark_draft(KvState& s, int32_t t_last, int64_t L, float confidence);
  Status verify(KvState& s, const int32_t* ids, int64_t n, int64_t p0, float* all_logits);
  // The checks and the snapshot a verify pass of n rows at p0 starts with (verify() and step()).
  Status begin_verify(KvState& s, int64_t n);
  Status commit(KvState& s, int64_t a);

 private:
  struct DeviceLayer {
    std::array<Tensor, static_cast<size_t>(LayerTensor::COUNT)> t;
    // Routed experts placed partly in host memory (MoeExpertsOp::slots; empty: all in t).
    Tensor slots, gate_host, up_host, down_host;
    const Tensor& operator[](LayerTensor s) const { return t[static_cast<size_t>(s)]; }
  };
  struct Scratch;

  Model(Backend& backend, const ModelSpec& spec, ModelOptions options);
  Status upload(const ModelWeights& w, const MtpWeights* mtp);
  // Layer il's routed experts: those of `resident` (ascending) on the backend, the others read from host memory.
  Status place_experts(const LayerWeights& w, DeviceLayer& dst, const std::vector<uint32_t>& resident);
  // Experts resident per layer (ascending ids) within options_.memory_budget (all without one).
  expected<std::vector<std::vector<uint32_t>>> choose_resident(const std::vector<uint64_t>& one);
  // Adds the assignments of the last forward batch of n rows (the route log) to routing_.
  void count_routing(int64_t n);
  void ensure_scores(int64_t rows);
  RopeParams rope_for_ratio(uint32_t ratio) const;
  CompressOp compress_op(const Tensor& rows, const Tensor& state_a, const Tensor& state_g, const Tensor& kv,
                         const Tensor& gate, const Tensor& ape, const Tensor& norm_w, const Tensor& pos, int ratio,
                         const RopeParams& rope, KvQuantSim sim, int n_quant, bool round_pooled_bf16) const;
  // A layer's compressor step over rows with projections kv/gate at positions pos: its main KV rows
  // (ratio > 0), and its indexer rows (ratio 4; projections ikv/igate).
  CompressOp main_compress(const DeviceLayer& L, LayerState& S, uint32_t ratio, const Tensor& kv, const Tensor& gate,
                           const Tensor& pos) const;
  CompressOp indexer_compress(const DeviceLayer& L, LayerState& S, const Tensor& ikv, const Tensor& igate,
                              const Tensor& pos) const;
  // Model::verify's tensors of a state (allocated at its first verify), and the copies between
  // layer il's compressor frontiers and their snapshot (either way).
  void alloc_spec(KvState& s);
  void copy_frontiers(KvState& s, size_t il, bool to_snapshot);
  // The activation quantisation of the input(s) `site` (FastSite bits; ActQuant::NONE but in fast numerics): the model
  // issues it inside the op that produces each input (RmsNormOp::quant, HcPreOp::norm_quant, SwigluOp::quant,
  // MoeExpertsOp::mid_quant) or consumes it (MatmulOp::x_quantise).
  ActQuant act_quant(unsigned site) const;
  // out = W x for each (out, W) pair: MatmulsOp per weight type (one launch each on a GPU for a decode token).
  // x_quant: MatmulsOp::x_quant (x is an activation quantiser's output).
  void project(const Tensor& x, const std::vector<std::pair<Tensor, Tensor>>& out_w, ActQuant x_quant = ActQuant::NONE);
  // The rows [row0, row0 + n) of a batch that belong to one sequence.
  struct Segment {
    KvState* state = nullptr;
    int64_t row0 = 0, n = 0;
  };
  // `layer`: the state's layer index, -1 for the MTP block's window, -2 - S for DSpark stage S (its
  // block's rows attend to each other, non-causally: model/dspark.cpp).
  void attention_block(const DeviceLayer& L, std::span<const Segment> segs, int layer, uint32_t ratio, int64_t n);
  // One block over the rows of `segs` (model-spec.md §4): mHC around attention and the FFN. `layer` as for
  // attention_block; `ffn_index` picks the SwiGLU clamp; `hash`: the router is the token-id table.
  void block(const DeviceLayer& L, std::span<const Segment> segs, int layer, uint32_t ratio, uint32_t ffn_index,
             bool hash, int64_t n);
  // Returns the shared expert's output still to be added to y (a decode
  // branch's: the caller passes it to hc_post as HcPostOp::y2), or an empty tensor.
  Tensor ffn_block(const DeviceLayer& L, int64_t n, uint32_t il, bool hash);
  void run_batch(KvState& s, const int32_t* ids, int64_t n, int64_t p0, float* logits, bool all_logits);
  void batch_ops(KvState& s, int64_t n, bool logits, bool all_logits);
  // The layers over the rows of every segment (positions and ids already written); each segment's
  // last row's final state goes to its state's last_hidden. Returns the final state [n, hc, D].
  Tensor layer_ops(std::span<const Segment> segs, int64_t n);
  // hc_head -> RMSNorm -> logits of `cnt` rows of final state into s.logits.
  void head_ops(const Tensor& state_rows, int64_t cnt);
  // The ops of a step (positions and ids already written): the layers over
  // every segment, then the head over the last heads[k] rows of each segment k
  // (0: none; 1: its last row; its n: every row), into logits rows 0, 1, ... in order.
  void step_ops(std::span<const Segment> segs, int64_t total, const std::vector<int64_t>& heads);
  LayerState alloc_layer_state(uint32_t ratio, uint32_t ctx, uint32_t cap_w, bool with_compressor);

  Backend& backend_;
  ModelSpec spec_;
  ModelOptions options_;
  uint32_t first_ = 0, end_ = 0;  // the layers this model runs
  bool has_mtp_ = false;
  bool has_dspark_ = false;
  std::array<Tensor, static_cast<size_t>(GlobalTensor::COUNT)> global_;
  std::vector<DeviceLayer> layers_;
  DeviceLayer mtp_block_;
  std::array<Tensor, static_cast<size_t>(MtpTensor::COUNT)> mtp_head_;
  // DSpark: stage blocks, head tensors, the host bytes of the Markov table and the confidence head
  // (read row by row on the host), and the drafting pass's own tensors.
  DSparkMeta dspark_meta_;
  std::vector<DeviceLayer> dspark_stages_;
  std::array<Tensor, static_cast<size_t>(DSparkTensor::COUNT)> dspark_head_;
  DSparkHost dspark_host_;
  Tensor dspark_x_, dspark_pos_, dspark_state_, dspark_logit_;  // [D], [2 * rows] i32, [R], [V]
  // Layer il's index in the DSpark target layers, or -1.
  int dspark_target(uint32_t il) const;
  // The target features of rows of `state` ([n, hc, D]): row r's hc streams averaged into dst row j.
  void average_streams(const Tensor& state, int64_t r, const Tensor& dst_row);
  std::unique_ptr<Scratch> sc_;
  std::unique_ptr<Model> next_;                // the pipeline's next stage
  std::shared_ptr<StageTransport> transport_;  // shared by the stages
  WeightPlacement placement_;
  ExpertStats routing_;
  // The recorded single-token step (Backend::capture_begin): recorded on the
  // second consecutive single-token batch with the same key (the first one
  // sizes every buffer), replayed while the key stays the same.
  struct StepKey {
    uint64_t state = 0;
    bool logits = false;
    bool operator==(const StepKey&) const = default;
  };
  StepKey step_seen_, step_key_;
  uint64_t step_graph_ = 0;
  // Recorded batched decode steps, by key (per item in uid order: uid * 2 +
  // wants logits): recorded on the second consecutive step with one key,
  // replayed while it recurs; the least recently used goes beyond
  // k_batch_graphs. Steps of up to k_batch_graph_rows items. (Verify passes
  // run eagerly: recorded per session and length, 32 flash-q2 passes took
  // longer, the recording included; replays alone are not measured yet:
  // PERFORMANCE.md.)
  static constexpr size_t k_batch_graphs = 8;
  static constexpr size_t k_batch_graph_rows = 64;
  struct BatchGraph {
    std::vector<uint64_t> key;
    uint64_t id = 0;
    uint64_t used = 0;  // batch_clock_ at the last replay
  };
  std::vector<BatchGraph> batch_graphs_;
  std::vector<uint64_t> batch_seen_;
  uint64_t batch_clock_ = 0;
  uint64_t next_state_uid_ = 0;
};

}  // namespace dsv4
