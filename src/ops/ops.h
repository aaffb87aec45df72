// The op list: the contract every backend implements (CPU reference, CUDA).
//
// The forward pass (src/model/forward.cpp) is written once as a sequence of
// these ops. Each op is described by a parameter struct whose comments give
// the maths and the tensor shapes; the CPU backend implements each in plain
// fp32 and is the oracle the CUDA kernels are tested against (one harness
// case per op). Shapes use [outer, ..., inner] order with the innermost
// dimension = Tensor::ne[0]; `n` is the number of tokens in the batch.
//
// Graph-friendliness: everything that changes from one decode step to the
// next (positions, row counts, selections) lives in tensors, never in host
// scalars, so a backend can capture the decode step once and replay it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/act_quant.h"
#include "core/error.h"
#include "ops/tensor.h"

namespace dsv4 {

// Simulated quantisation applied to stored vectors (model-spec.md §9.2).
enum class KvQuantSim {
  NONE,          // plain fp32 (what transformers computes)
  FP8_BF16,      // main KV: FP8 e4m3 round trip of the non-RoPE dims in blocks of 64, then every value to bf16
  HADAMARD_FP4,  // indexer K/q: orthonormal Hadamard rotation, FP4 e2m1 round trip in blocks of 32, then bf16
};

// RoPE table of a layer (model-spec.md §5.3): pairs (2j, 2j+1) of the last
// `n_rot` dims rotate by angle pos * omega_j with omega_j = theta^(-2j/n_rot),
// blended with omega_j / factor by the YaRN ramp when `yarn` is set.
struct RopeParams {
  int n_rot = 64;
  float theta = 10000.0f;
  bool yarn = false;
  float factor = 1.0f;
  uint64_t orig_ctx = 0;
  float beta_fast = 32.0f, beta_slow = 1.0f;
};

// Frequencies omega_j (n_rot/2 values) of a RoPE table.
void rope_frequencies(const RopeParams& p, float* omega);

// ---------------------------------------------------------------------------
// Op parameter structs.

// out[t, s, :] = table[ids[t], :] for every stream s (embedding + mHC expansion).
struct EmbedOp {
  Tensor out;    // [n, hc, D] f32
  Tensor table;  // [V, D] weight (F16/F32)
  Tensor ids;    // [n] i32
};

// mHC pre-mix (model-spec.md §4.2). Per token: rho = rsqrt(mean(x̄^2) + eps_norm)
// over the hc*D state; mu = rho * (fn · x̄) (mix values); pre = sigmoid(s0 mu_pre + b) + eps;
// post = 2 sigmoid(s1 mu_post + b); comb = Sinkhorn(s2 mu_comb + b);
// u = sum_i pre_i X_i.
struct HcPreOp {
  Tensor u;                // [n, D] f32 out
  Tensor post;             // [n, hc] f32 out
  Tensor comb;             // [n, hc, hc] f32 out (row = source stream, col = destination)
  Tensor state;            // [n, hc, D] f32 in
  Tensor fn;               // [mix, hc*D] weight, mix = (2 + hc) * hc
  Tensor scale;            // [3] f32
  Tensor base;             // [mix] f32
  float norm_eps = 1e-6f;  // RMS epsilon of the state normalisation
  float hc_eps = 1e-6f;
  int sinkhorn_iters = 20;
  // Optional (norm_out set): also norm_out = RMSNorm(u; norm_w, norm_rms_eps),
  // the sublayer's input norm fused into the op (one kernel less per sublayer).
  Tensor norm_out;  // [n, D] f32 out
  Tensor norm_w;    // [D] f32, or empty: no weight
  float norm_rms_eps = 1e-6f;
  // Optional (norm_quant != NONE, with norm_out): also norm_q = norm_out quantised like
  // ActQuantOp{norm_q, norm_out, norm_quant} (the sublayer's linear layers' input in `fast` numerics).
  Tensor norm_q;  // [n, D] f32 out
  ActQuant norm_quant = ActQuant::NONE;
};

// mHC post-mix (§4.3): X'_j = post_j * y + sum_i comb[i][j] X_i; optional bf16
// rounding of the new state (reference numerics keep X in bf16).
struct HcPostOp {
  Tensor state;  // [n, hc, D] f32 in/out
  Tensor y;      // [n, D] f32
  Tensor post;   // [n, hc]
  Tensor comb;   // [n, hc, hc]
  bool round_bf16 = false;
  // Optional: y is taken as y + y2 (one f32 addition per element, the AddOp
  // it replaces: the shared expert's output of a decode branch).
  Tensor y2;  // [n, D] f32, or empty
};

// mHC head (§4.4): w_i = sigmoid(s * rho * (fn · x̄)_i + b_i) + eps; h = sum_i w_i X_i.
struct HcHeadOp {
  Tensor h;      // [n, D] f32 out
  Tensor state;  // [n, hc, D]
  Tensor fn;     // [hc, hc*D] weight
  Tensor scale;  // [1] f32
  Tensor base;   // [hc] f32
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
};

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w or 1); rows of length ne0.
// With rope_pos set, RoPE then rotates out in place exactly as RopeOp{out as
// [n, rope_rows_per_token, d], rope_pos, rope, forward} would (the norm and
// the rotation of a row in one pass: one kernel per call on a GPU). With quant
// set, the result (normed, then rotated) is then quantised exactly as
// ActQuantOp{q, out, quant} would: into q, or into out itself when q is empty
// (a linear layer's input in `fast` numerics; a GPU fuses it into the norm
// where the format allows).
struct RmsNormOp {
  Tensor out;  // [rows, d] f32 (may alias x)
  Tensor x;    // [rows, d] f32
  Tensor w;    // [d] f32 weight (constant: a GPU may read it before the previous op ends), or empty
  float eps = 1e-6f;
  Tensor rope_pos;  // [rows / rope_rows_per_token] i32, or empty: no RoPE
  RopeParams rope;
  int64_t rope_rows_per_token = 1;
  ActQuant quant = ActQuant::NONE;
  Tensor q;  // [rows, d] f32 (may alias out or x), or empty: out quantised in place
};

// out[t, r] = sum_c W[r, c] x[t, c]. With groups G > 1 the weight is
// block-diagonal: row r belongs to group g = r / (rows/G) and reads the input
// slice x[t, g*cols : (g+1)*cols] (grouped output projection, §5.8).
// accumulate: out[t, r] += (the sum), the float addition AddOp makes.
struct MatmulOp {
  Tensor out;  // [n, rows] f32
  Tensor w;    // [rows, cols] weight (any weight type)
  Tensor x;    // [n, cols * groups] f32
  int groups = 1;
  bool accumulate = false;
  // x is an ActQuantOp's output of this format (NONE: any f32). A promise a backend may use, changing no
  // result beyond f32 rounding: every value is q 2^k with at most 8 significant bits, so a split of x
  // into f16 hi + lo under a power-of-two scale has lo = 0 (but for values more than 2^21 below their row's
  // largest, whose lo a backend may drop).
  ActQuant x_quant = ActQuant::NONE;
  // x is not yet quantised: the product is W act_quant(x) (ActQuantOp{x, x, x_quantise} first, then the
  // x_quant promise). x is quantised in place, or left as it was where a backend quantises it while reading
  // it (CUDA's int8 decode matvec): the caller must not read x afterwards. (`fast` numerics' wo_b input.)
  ActQuant x_quantise = ActQuant::NONE;
};

// Matmuls of one input: out[i] = W[i] x for i < count, each exactly
// MatmulOp{out[i], w[i], x} (ungrouped, not accumulating). A GPU backend runs
// them as one kernel for a single token when the weights share type and width
// (the layer's projections of its normed input: fewer, fuller launches).
struct MatmulsOp {
  static constexpr int k_max = 6;
  Tensor x;  // [n, cols] f32
  Tensor out[k_max];
  Tensor w[k_max];
  int count = 0;
  ActQuant x_quant = ActQuant::NONE;  // as MatmulOp::x_quant
};

// Rotates the last n_rot dims of every row of x in place by angle pos*omega_j
// (inverse: -pos*omega_j). Row r of token t uses pos[t] (rows_per_token rows per token).
struct RopeOp {
  Tensor x;    // [n, rows_per_token, d] f32 in/out
  Tensor pos;  // [n] i32
  RopeParams rope;
  bool inverse = false;
};

// Simulated storage quantisation of vectors (see KvQuantSim); in place.
// FP8_BF16 touches dims [0, n_quant) with 64-blocks, then rounds all dims to bf16.
// HADAMARD_FP4 rotates each row (ne0 must be a power of two) then FP4-rounds it in 32-blocks.
struct QuantSimOp {
  Tensor x;  // [rows, d] f32
  KvQuantSim sim = KvQuantSim::NONE;
  int n_quant = 0;  // FP8: non-RoPE dims
};

// out = x with every row's activations quantised by `quant` (ActQuant); out may alias x.
struct ActQuantOp {
  Tensor out;  // [rows, d] f32
  Tensor x;    // [rows, d] f32
  ActQuant quant = ActQuant::FP8_128;
};

// ring[pos[t] % cap, :] = rows[t, :] (the raw sliding-window KV of a layer).
struct StoreRowsOp {
  Tensor ring;  // [cap, d] f32
  Tensor rows;  // [n, d] f32
  Tensor pos;   // [n] i32
};

// KV compressor step (§5.5/§5.6) for n consecutive tokens. For each token t
// (in order) at position p = pos[t]: a = kv[t], g = gate[t] + ape[p mod m] go
// into frontier slot (overlap ? m : 0) + p mod m; when (p+1) mod m == 0 the
// window is pooled (per-channel softmax of g over the window's candidates,
// weighting a; overlap: lane A of the previous window + lane B of the
// current), then RMS-normed with norm_w, RoPE'd at position p+1-m, sim'd, and
// written as row k = p div m of `rows`; with overlap, the current window then
// becomes the previous one. Row counts are implied by positions.
struct CompressOp {
  Tensor rows;     // [cap_rows, d] f32 out (row k = window k)
  Tensor state_a;  // [R, w] f32 frontier values, R = 2m (overlap) or m, w = c*d
  Tensor state_g;  // [R, w] f32 frontier scores (-inf = empty)
  Tensor kv;       // [n, w] f32 projections
  Tensor gate;     // [n, w] f32 projections (APE not yet added)
  Tensor ape;      // [m, w] weight (F16/F32)
  Tensor norm_w;   // [d] f32
  Tensor pos;      // [n] i32
  int ratio = 4;
  bool overlap = true;
  float eps = 1e-6f;
  RopeParams rope;
  KvQuantSim sim = KvQuantSim::NONE;
  int n_quant = 0;
  bool round_pooled_bf16 = false;  // reference: pooled row cast to bf16 before its norm
};

// Lightning-indexer scores (§5.6): for every query t and every row k with
// k < (pos[t]+1) / 4: score[t, k] = sum_h w[t, h] * relu(q[t, h, :] · rows[k, :]).
// Rows not visible to t get -inf.
struct IndexerScoresOp {
  Tensor scores;  // [n, cap_rows] f32 out
  Tensor q;       // [n, H_I, d_I] f32
  Tensor w;       // [n, H_I] f32 head weights (already scaled)
  Tensor rows;    // [cap_rows, d_I] f32
  Tensor pos;     // [n] i32
  int ratio = 4;
  // q and rows hold bf16-exact values (reference numerics: the Hadamard + FP4
  // simulation): a backend may use bf16 tensor cores without rounding them.
  bool inputs_bf16 = false;
};

// Top-k of each row of scores among the visible rows (k < (pos[t]+1)/ratio):
// sel[t, :] = indices of the min(k, visible) largest scores, ties to the lower
// index, in ascending index order, padded with -1.
struct TopKOp {
  Tensor sel;     // [n, k] i32 out
  Tensor scores;  // [n, cap_rows] f32
  Tensor pos;     // [n] i32
  int ratio = 4;
};

// Core attention (§5.7). For query t at position p, heads h:
// keys = window rows at positions max(0, p-W+1) .. p (ring slot = position % cap)
//      ∪ compressed rows: all k < (p+1)/ratio (sel empty) or the listed sel[t, :] (>= 0);
// l_s = (q_h · K_s) * scale; o_h = sum_s softmax_s(l; sink_h) K_s where the
// sink adds exp(sink_h - max) to the denominator only. K = V.
struct AttentionOp {
  Tensor out;    // [n, H, d] f32
  Tensor q;      // [n, H, d] f32
  Tensor ring;   // [cap_w, d] f32 window KV
  Tensor comp;   // [cap_rows, d] f32 compressed rows (empty for window-only layers)
  Tensor sel;    // [n, k] i32 selected compressed rows (empty: all visible rows)
  Tensor sinks;  // [H] f32
  Tensor pos;    // [n] i32
  int window = 128;
  int ratio = 0;  // compression ratio of `comp` (0: none)
  float scale = 0;
  // Every value of ring and comp is exactly a bf16 (reference numerics: FP8
  // simulation of the nope dims and a bf16 RoPE tail; KV_FP8 rows always are):
  // a backend may feed the keys to bf16 tensor cores without rounding them.
  bool keys_bf16 = false;
  // `fast` numerics (a tolerance, not f32 rounding): a backend may round q and the softmax weights to fewer
  // bits on tensor cores (CUDA: CudaOptions::fast_attention_terms).
  bool fast = false;
};

// Router (§6.1–§6.3): s = sqrt(softplus(logits)); experts = hash table row of
// the token (hash layers) or top-k of s + bias; weights = s[e] / sum s[sel] * alpha.
struct MoeRouteOp {
  Tensor experts;  // [n, k] i32 out
  Tensor weights;  // [n, k] f32 out
  Tensor logits;   // [n, E] f32 router logits
  Tensor bias;     // [E] f32 or empty
  Tensor hash;     // [V, k] i32 table (hash layers) or empty
  Tensor ids;      // [n] i32 token ids (hash layers)
  float alpha = 1.5f;
  bool normalize = true;
};

// Routed experts (§6.4): out[t] = sum_i weights[t,i] * down_e(silu(min(gate_e x, c)) * clamp(up_e x, -c, c))
// with e = experts[t, i]; `accumulate` adds into out instead of overwriting.
struct MoeExpertsOp {
  Tensor out;      // [n, D] f32
  Tensor x;        // [n, D] f32
  Tensor gate;     // [E, F, D] weight (stacked)
  Tensor up;       // [E, F, D]
  Tensor down;     // [E, D, F]
  Tensor experts;  // [n, k] i32
  Tensor weights;  // [n, k] f32
  float clamp = 10.0f;
  bool accumulate = false;
  // The mid vector (the SwiGLU times the routing weight, the down projection's input) quantised like
  // ActQuantOp before the down projection (`fast` numerics); NONE: kept f32.
  ActQuant mid_quant = ActQuant::NONE;
  ActQuant x_quant = ActQuant::NONE;  // x is an ActQuantOp's output (the promise of MatmulOp::x_quant)
  // Experts partly in host memory (empty: all in gate/up/down as above). slots [E] i32: expert e's
  // index in gate/up/down, which then hold only the resident experts ([E_dev, ...], E_dev may be 0),
  // or -1: its rows are expert e of gate_host/up_host/down_host ([E, ...], Backend::map_host_weight:
  // read in place). The results do not depend on where an expert's bytes are.
  Tensor slots;
  Tensor gate_host, up_host, down_host;
};

// Notice of a layer's coming moe_experts op whose experts are partly in host memory (its slots and host
// stacks), for a batch of n tokens with k experts each, issued before the layer's attention: a backend may
// start copying the host experts the batch will use into device memory meanwhile (CUDA: every host expert of
// the layer, by the copy engine, for batches large enough to use nearly all of them). Changes no result.
struct MoePrefetchOp {
  Tensor slots;
  Tensor gate_host, up_host, down_host;
  int64_t n = 0, k = 0;
};

// h = silu(min(gate, c)) * clamp(up, -c, c), elementwise (shared expert); with
// quant set, each row of h then quantised exactly as ActQuantOp{out, out, quant}
// would (the down projection's input in `fast` numerics; one kernel on a GPU
// where the format allows).
struct SwigluOp {
  Tensor out;   // [n, F] f32
  Tensor gate;  // [n, F]
  Tensor up;    // [n, F]
  float clamp = 10.0f;
  ActQuant quant = ActQuant::NONE;
};

// out += x (elementwise), or out = x * s when `scale` is set instead.
struct AddOp {
  Tensor out;
  Tensor x;
};
struct ScaleOp {
  Tensor x;  // in place
  float s = 1.0f;
};

// ---------------------------------------------------------------------------

enum class BackendKind { CPU, CUDA };

// Accumulated time of one kind of op call (bench --profile).
struct OpTiming {
  std::string key;  // op name plus shape details, e.g. "matmul Q8_0 32768x1024 n=1"
  uint64_t calls = 0;
  double seconds = 0;
};

// The profile key of an op call: its name, and for matmul the weight type and shape.
std::string op_profile_key(const char* op, const MatmulOp* mm = nullptr, int64_t n_tokens = 0);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string name() const = 0;

  // Memory: zero-initialised activation/state buffers owned by the backend.
  virtual Tensor alloc(GgmlType type, int64_t n0, int64_t n1 = 1, int64_t n2 = 1, int64_t n3 = 1) = 0;
  virtual void free(Tensor& t) = 0;
  // A weight the backend can read: CPU returns a view of host bytes, CUDA copies them to the device.
  virtual expected<Tensor> upload_weight(const void* host, GgmlType type, const int64_t ne[4]) = 0;
  // A weight left where it is in host memory that the backend's ops read in place (CPU: a view of the
  // bytes; CUDA: the pages registered with the driver, read-only, and read over the bus). The bytes must
  // stay mapped while the backend lives, and no buffer that is written (a read's destination) may share
  // their pages (a file mapping, or page-aligned memory of its own).
  virtual expected<Tensor> map_host_weight(const void* host, GgmlType type, const int64_t ne[4]) {
    return make_tensor(const_cast<void*>(host), type, ne[0], ne[1], ne[2], ne[3]);
  }
  virtual void write(const Tensor& dst, const void* host, size_t bytes, size_t offset = 0) = 0;
  virtual void read(const Tensor& src, void* host, size_t bytes, size_t offset = 0) = 0;
  // F32 tensors; value 0 also zeroes the compact KV row formats (all-zero bytes read as zeros).
  virtual void fill(const Tensor& dst, float value) = 0;
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // same byte size
  // src (this backend's) into dst, a tensor of the same byte size on backend `to`, without a trip through
  // host memory where the two can (CPU to CPU: a memory copy; CUDA to CUDA: a device-to-device copy that
  // `to`'s later work waits for). false: not between these two (the caller copies through host memory).
  virtual bool copy_to(const Tensor& src, Backend& to, const Tensor& dst) {
    (void)src;
    (void)to;
    (void)dst;
    return false;
  }
  virtual void synchronize() = 0;
  // Bytes alloc() can still get where the backend knows (CUDA: the device's
  // free memory plus what it would release for an allocation); nullopt where
  // it does not (CPU: host memory, left to the OS).
  virtual std::optional<uint64_t> free_memory() { return std::nullopt; }

  // Per-op timing: while enabled, every op's time (device time on GPUs) is
  // accumulated by op_profile_key. take_profile() returns the totals (largest
  // first) and clears them; it synchronises.
  virtual void set_profiling(bool on) = 0;
  virtual std::vector<OpTiming> take_profile() = 0;

  // Replay of a repeated op sequence (the decode step: CUDA graphs). After
  // capture_begin() returns true, ops and copies are recorded instead of run,
  // until capture_end() returns the recording's id (> 0). replay(id) runs the
  // recorded ops again, on the same tensors, reading whatever they hold now;
  // it returns false when memory the recording uses may have moved since (a
  // free, a regrown scratch buffer) or while profiling (ops must run eagerly):
  // drop it and record again then.
  // Never record read/write/synchronize/alloc/free. Backends that cannot
  // record return false from capture_begin (the default) and the caller runs
  // the ops directly.
  virtual bool capture_begin() { return false; }
  virtual uint64_t capture_end() { return 0; }
  virtual bool replay(uint64_t id) {
    (void)id;
    return false;
  }
  virtual void drop_replay(uint64_t id) { (void)id; }

  // Concurrent op sequences. Ops issued between branch_begin() and
  // branch_end() (the branch) may run concurrently with the ops issued after
  // branch_end() until branch_join(); the branch still runs after every op
  // issued before branch_begin(), and the ops after branch_join() run after
  // both. The caller keeps the two sequences independent: neither reads what
  // the other writes. No nesting. Backends that run ops one after another
  // ignore them (the default): results are the same. concurrent_branches():
  // whether they actually overlap (a caller may restructure its ops for it).
  virtual bool concurrent_branches() const { return false; }
  virtual void branch_begin() {}
  virtual void branch_end() {}
  virtual void branch_join() {}

  // Ops.
  virtual void embed(const EmbedOp& op) = 0;
  virtual void hc_pre(const HcPreOp& op) = 0;
  virtual void hc_post(const HcPostOp& op) = 0;
  virtual void hc_head(const HcHeadOp& op) = 0;
  virtual void rms_norm(const RmsNormOp& op) = 0;
  virtual void matmul(const MatmulOp& op) = 0;
  virtual void matmuls(const MatmulsOp& op) {  // default: one matmul each
    for (int i = 0; i < op.count; ++i) matmul({.out = op.out[i], .w = op.w[i], .x = op.x, .x_quant = op.x_quant});
  }
  virtual void rope(const RopeOp& op) = 0;
  virtual void quant_sim(const QuantSimOp& op) = 0;
  virtual void act_quant(const ActQuantOp& op) = 0;
  virtual void store_rows(const StoreRowsOp& op) = 0;
  virtual void compress(const CompressOp& op) = 0;
  virtual void indexer_scores(const IndexerScoresOp& op) = 0;
  virtual void topk(const TopKOp& op) = 0;
  virtual void attention(const AttentionOp& op) = 0;
  // The per-sequence ops of several sequences in one step (Model::step). Op k
  // reads and writes its own sequence's state; the ops' per-token tensors
  // (rows, kv, gate, q, w, out, pos, sel) are consecutive row ranges of one
  // batch, in op order (op k + 1's rows follow op k's); indexer scores and
  // top-k each have their own scores. Same results as one call per op (the
  // defaults); a backend may launch the ops of single-token sequences (a
  // batched decode step) together.
  virtual void store_rows_seqs(std::span<const StoreRowsOp> ops) {
    for (const StoreRowsOp& op : ops) store_rows(op);
  }
  virtual void compress_seqs(std::span<const CompressOp> ops) {
    for (const CompressOp& op : ops) compress(op);
  }
  virtual void indexer_scores_seqs(std::span<const IndexerScoresOp> ops) {
    for (const IndexerScoresOp& op : ops) indexer_scores(op);
  }
  virtual void topk_seqs(std::span<const TopKOp> ops) {
    for (const TopKOp& op : ops) topk(op);
  }
  virtual void attention_seqs(std::span<const AttentionOp> ops) {
    for (const AttentionOp& op : ops) attention(op);
  }
  virtual void moe_route(const MoeRouteOp& op) = 0;
  virtual void moe_experts(const MoeExpertsOp& op) = 0;
  virtual void moe_prefetch(const MoePrefetchOp& op) { (void)op; }  // a hint (MoePrefetchOp); default: none
  virtual void swiglu(const SwigluOp& op) = 0;
  virtual void add(const AddOp& op) = 0;
  virtual void scale(const ScaleOp& op) = 0;
};

}  // namespace dsv4
