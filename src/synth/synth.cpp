#include "synth/synth.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/float_conv.h"
#include "core/thread_pool.h"
#include "gguf/gguf.h"
#include "synth/synth_gen.h"
#include "synth/synth_vocab.h"

namespace dsv4 {

ModelSpec tiny_spec() {
  // Every layer kind at test size: 2 window-only layers, ratio-4 layers with an
  // indexer whose top-k (16) is below the 75 compressed rows of a 300-token
  // prompt, ratio-128 layers, 3 hash-routed layers, a shared expert, 4 mHC
  // streams. Widths are multiples of 256 so IQ2_XXS/Q2_K experts fit.
  ModelSpec s = ModelSpec::flash();
  s.name = "dsv4 tiny";
  s.n_layer = 6;
  s.n_embd = 256;
  s.n_vocab = 512;
  s.n_head = 4;
  s.head_dim = 128;
  s.rope_dim = 64;
  s.q_lora_rank = 64;
  s.o_groups = 2;
  s.o_lora_rank = 64;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.expert_ff = 256;
  s.indexer_heads = 4;
  s.indexer_head_dim = 128;
  s.indexer_top_k = 16;
  s.compress_ratios = {0, 0, 4, 128, 4, 128, 0};
  s.swiglu_clamp.assign(7, 10.0f);
  s.context_length = 65536;
  return s;
}

std::vector<Preset> synth_presets() {
  return {
      {"tiny", "every layer kind at test size (6 layers, 256 wide), q2 quant mix", tiny_spec(), QuantRecipe::Q2},
      {"tiny-f32", "the tiny shape with every matrix in F32", tiny_spec(), QuantRecipe::F32},
      {"flash-q2", "DeepSeek V4 Flash, published q2 layout (80.76 GiB)", ModelSpec::flash(), QuantRecipe::Q2},
      {"flash-q2-q4", "DeepSeek V4 Flash, published q2-q4 layout (layers 37-42's experts Q4_K; 90.9 GiB)",
       ModelSpec::flash(), QuantRecipe::Q2_Q4},
      {"flash-q4", "DeepSeek V4 Flash, published q4 layout (153.3 GiB)", ModelSpec::flash(), QuantRecipe::Q4},
      {"flash-mxfp4", "DeepSeek V4 Flash, published mxfp4 layout (routed experts MXFP4; 145.3 GiB)", ModelSpec::flash(),
       QuantRecipe::MXFP4},
      {"tiny-mxfp4", "the tiny shape with the mxfp4 quant mix (routed experts MXFP4)", tiny_spec(), QuantRecipe::MXFP4},
      {"pro-q2", "DeepSeek V4 Pro shapes, q2 quant mix", ModelSpec::pro(), QuantRecipe::Q2},
  };
}

expected<Preset> find_preset(const std::string& name) {
  std::string names;
  for (auto& p : synth_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  return make_error("unknown preset \"%s\" (available: %s)", name.c_str(), names.c_str());
}

SynthPlan synth_plan(const Preset& preset, uint64_t seed) {
  SynthPlan plan;
  plan.preset = preset;
  plan.seed = seed;
  for (auto& spec : main_tensor_table(preset.spec)) {
    GgmlType type = recipe_type(preset.recipe, spec, preset.spec.n_layer);
    uint64_t bytes = ggml_type_bytes(type, spec.n_elements());
    plan.tensor_bytes += bytes;
    plan.tensors.push_back({std::move(spec), type, bytes});
  }
  return plan;
}

SynthPlan synth_mtp_plan(const Preset& preset, uint64_t seed) {
  SynthPlan plan;
  plan.preset = preset;
  plan.seed = seed;
  plan.mtp = true;
  for (auto& spec : mtp_tensor_table(preset.spec)) {
    GgmlType type = recipe_type(preset.recipe, spec, preset.spec.n_layer);
    uint64_t bytes = ggml_type_bytes(type, spec.n_elements());
    plan.tensor_bytes += bytes;
    plan.tensors.push_back({std::move(spec), type, bytes});
  }
  return plan;
}

SynthPlan synth_dspark_plan(const Preset& preset, uint64_t seed) {
  SynthPlan plan;
  plan.preset = preset;
  plan.seed = seed;
  plan.dspark = true;
  const ModelSpec& s = preset.spec;
  DSparkMeta& m = plan.dspark_meta;
  m.markov_rank = s.n_embd >= 4096 ? 256 : 32;
  m.noise_token_id = s.n_vocab > 128799 ? 128799 : s.n_vocab - 1;
  m.target_layers.clear();
  for (uint32_t l = s.n_layer >= 3 ? s.n_layer - 3 : 0; l < s.n_layer; ++l) m.target_layers.push_back(l);
  const QuantRecipe recipe =
      preset.recipe == QuantRecipe::F16 || preset.recipe == QuantRecipe::F32 ? preset.recipe : QuantRecipe::Q2;
  for (auto& spec : dspark_tensor_table(s, m)) {
    const GgmlType type = recipe_type(recipe, spec, s.n_layer);
    const uint64_t bytes = ggml_type_bytes(type, spec.n_elements());
    plan.tensor_bytes += bytes;
    plan.tensors.push_back({std::move(spec), type, bytes});
  }
  return plan;
}

namespace {

enum class Dist { NORMAL, NEAR_ONE, UNIFORM_SCALE, HASH_TABLE };

struct GenParams {
  Dist dist = Dist::NORMAL;
  float rms = 1.0f;  // NORMAL: standard deviation
};

// What each tensor's values look like (see synth_gen.h for the scaling rule).
GenParams gen_params(const TensorSpec& t) {
  GenParams p;
  p.rms = 1.0f / std::sqrt(static_cast<float>(t.ne[0]));  // matrices: 1/sqrt(input width)
  if (t.cls == TypeClass::I32_TABLE) return {Dist::HASH_TABLE, 0};
  if (t.scope == TensorScope::GLOBAL) {
    switch (static_cast<GlobalTensor>(t.slot)) {
      case GlobalTensor::TOKEN_EMBD: return {Dist::NORMAL, 1.0f};
      case GlobalTensor::OUTPUT_HC_BASE: return {Dist::NORMAL, 0.5f};
      case GlobalTensor::OUTPUT_HC_SCALE: return {Dist::UNIFORM_SCALE, 0};
      case GlobalTensor::OUTPUT_NORM: return {Dist::NEAR_ONE, 0};
      case GlobalTensor::OUTPUT_HC_FN:
      case GlobalTensor::OUTPUT: return p;
      case GlobalTensor::COUNT: break;
    }
    return p;
  }
  if (t.scope == TensorScope::DSPARK_HEAD) {
    switch (static_cast<DSparkTensor>(t.slot)) {
      case DSparkTensor::HC_HEAD_BASE: return {Dist::NORMAL, 0.5f};
      case DSparkTensor::HC_HEAD_SCALE: return {Dist::UNIFORM_SCALE, 0};
      case DSparkTensor::MAIN_NORM:
      case DSparkTensor::NORM: return {Dist::NEAR_ONE, 0};
      case DSparkTensor::MAIN_PROJ:
      case DSparkTensor::HC_HEAD_FN:
      case DSparkTensor::MARKOV_W1:
      case DSparkTensor::MARKOV_W2:
      case DSparkTensor::CONFIDENCE: return p;
      case DSparkTensor::COUNT: break;
    }
    return p;
  }
  if (t.scope == TensorScope::MTP_HEAD) {
    switch (static_cast<MtpTensor>(t.slot)) {
      case MtpTensor::HC_HEAD_BASE: return {Dist::NORMAL, 0.5f};
      case MtpTensor::HC_HEAD_SCALE: return {Dist::UNIFORM_SCALE, 0};
      case MtpTensor::ENORM:
      case MtpTensor::HNORM:
      case MtpTensor::NORM: return {Dist::NEAR_ONE, 0};
      case MtpTensor::HC_HEAD_FN:
      case MtpTensor::E_PROJ:
      case MtpTensor::H_PROJ: return p;
      case MtpTensor::COUNT: break;
    }
    return p;
  }
  using LT = LayerTensor;
  switch (static_cast<LT>(t.slot)) {
    case LT::ATTN_NORM:
    case LT::FFN_NORM:
    case LT::ATTN_Q_A_NORM:
    case LT::ATTN_KV_A_NORM:
    case LT::ATTN_COMPRESSOR_NORM:
    case LT::INDEXER_COMPRESSOR_NORM: return {Dist::NEAR_ONE, 0};
    case LT::HC_ATTN_SCALE:
    case LT::HC_FFN_SCALE: return {Dist::UNIFORM_SCALE, 0};
    case LT::HC_ATTN_BASE:
    case LT::HC_FFN_BASE: return {Dist::NORMAL, 0.5f};
    case LT::ATTN_SINKS: return {Dist::NORMAL, 1.0f};
    case LT::EXP_PROBS_B: return {Dist::NORMAL, 0.1f};
    case LT::ATTN_COMPRESSOR_APE:
    case LT::INDEXER_COMPRESSOR_APE: return {Dist::NORMAL, 0.5f};
    case LT::FFN_GATE_TID2EID: return {Dist::HASH_TABLE, 0};
    case LT::HC_ATTN_FN:
    case LT::HC_FFN_FN:
    case LT::ATTN_Q_A:
    case LT::ATTN_Q_B:
    case LT::ATTN_KV:
    case LT::ATTN_OUTPUT_A:
    case LT::ATTN_OUTPUT_B:
    case LT::FFN_GATE_INP:
    case LT::FFN_GATE_EXPS:
    case LT::FFN_UP_EXPS:
    case LT::FFN_DOWN_EXPS:
    case LT::FFN_GATE_SHEXP:
    case LT::FFN_UP_SHEXP:
    case LT::FFN_DOWN_SHEXP:
    case LT::ATTN_COMPRESSOR_KV:
    case LT::ATTN_COMPRESSOR_GATE:
    case LT::INDEXER_ATTN_Q_B:
    case LT::INDEXER_PROJ:
    case LT::INDEXER_COMPRESSOR_KV:
    case LT::INDEXER_COMPRESSOR_GATE: return p;
    case LT::COUNT: break;
  }
  return p;
}

float gen_value(Dist d, float rms, synth::BlockRng& r) {
  switch (d) {
    case Dist::NORMAL: return r.normal() * rms;
    case Dist::NEAR_ONE: return 1.0f + r.normal() * 0.05f;
    case Dist::UNIFORM_SCALE: return 0.5f + static_cast<float>(r.below(1u << 16)) * (1.0f / 65536.0f);
    case Dist::HASH_TABLE: break;
  }
  return 0.0f;
}

// SynthPlan::router_skew's addition to a layer's exp_probs_b ([E]; empty when none applies).
std::vector<float> router_skew_bias(const SynthPlan& plan, const SynthTensor& t) {
  if (plan.router_skew <= 0 || t.spec.scope != TensorScope::LAYER ||
      t.spec.slot != static_cast<int>(LayerTensor::EXP_PROBS_B))
    return {};
  const auto E = static_cast<uint32_t>(t.spec.ne[0]);
  std::vector<uint32_t> rank(E);
  for (uint32_t e = 0; e < E; ++e) rank[e] = e;
  synth::BlockRng rng(plan.seed, synth::name_stream(t.spec.name.c_str()) ^ 0x5eed5eedull, 0);
  for (uint32_t j = E; j > 1; --j) std::swap(rank[j - 1], rank[rng.below(j)]);
  std::vector<float> bias(E);
  for (uint32_t e = 0; e < E; ++e)
    bias[e] = static_cast<float>(-0.05 * plan.router_skew * std::log1p(static_cast<double>(rank[e])));
  return bias;
}

}  // namespace

void synth_fill_rows(const SynthPlan& plan, const SynthTensor& t, uint64_t row_begin, uint64_t n_rows, uint8_t* dst) {
  const uint64_t seed = plan.seed;
  const uint64_t stream = synth::name_stream(t.spec.name.c_str());
  const uint64_t ne0 = t.spec.ne[0];
  const GenParams gp = gen_params(t.spec);
  const uint64_t row_bytes = ggml_row_bytes(t.type, ne0);

  if (gp.dist == Dist::HASH_TABLE) {
    // Row = token id, ne0 = k distinct experts (partial Fisher-Yates over E).
    const uint32_t E = plan.preset.spec.n_expert;
    std::vector<int32_t> perm(E);
    for (uint64_t r = 0; r < n_rows; ++r) {
      synth::BlockRng rng(seed, stream, row_begin + r);
      for (uint32_t e = 0; e < E; ++e) perm[e] = static_cast<int32_t>(e);
      int32_t* out = reinterpret_cast<int32_t*>(dst + r * row_bytes);
      for (uint64_t j = 0; j < ne0; ++j) {
        uint32_t k = static_cast<uint32_t>(j) + rng.below(E - static_cast<uint32_t>(j));
        std::swap(perm[j], perm[k]);
        out[j] = perm[j];
      }
    }
    return;
  }

  switch (t.type) {
    case GgmlType::F32:
    case GgmlType::F16: {
      const std::vector<float> skew = router_skew_bias(plan, t);  // once per call, not per row
      for (uint64_t r = 0; r < n_rows; ++r) {
        synth::BlockRng rng(seed, stream, row_begin + r);
        uint8_t* out = dst + r * row_bytes;
        for (uint64_t i = 0; i < ne0; ++i) {
          float v = gen_value(gp.dist, gp.rms, rng);
          if (!skew.empty()) v += skew[i];
          if (t.type == GgmlType::F32) {
            std::memcpy(out + 4 * i, &v, 4);
          } else {
            uint16_t h = f32_to_f16(v);
            std::memcpy(out + 2 * i, &h, 2);
          }
        }
      }
      return;
    }
    default: break;
  }

  // Quantised matrices: one generator call per block.
  const auto& info = ggml_type_info(t.type);
  const uint64_t blocks_per_row = ne0 / info.block_elems;
  float per_d = 1;
  switch (t.type) {
    case GgmlType::Q8_0: per_d = synth::k_q8_0_rms_per_d; break;
    case GgmlType::Q2_K: per_d = synth::k_q2_k_rms_per_d; break;
    case GgmlType::Q4_K: per_d = synth::k_q4_k_rms_per_d; break;
    case GgmlType::IQ2_XXS: per_d = synth::k_iq2_xxs_rms_per_d; break;
    case GgmlType::MXFP4: break;
    default: DSV4_ASSERT(false, "synth: no generator for %s", info.name);
  }
  // MXFP4's power-of-two scale nearest the target RMS.
  const uint8_t mx_e =
      static_cast<uint8_t>(std::clamp(127 + std::lround(std::log2(gp.rms / synth::k_mxfp4_rms_per_scale)), 1L, 254L));
  const uint16_t d_bits = f32_to_f16(gp.rms / per_d);
  const uint16_t dmin_bits = f32_to_f16(8.0f * gp.rms / per_d);
  for (uint64_t r = 0; r < n_rows; ++r) {
    for (uint64_t b = 0; b < blocks_per_row; ++b) {
      uint64_t block = (row_begin + r) * blocks_per_row + b;
      synth::BlockRng rng(seed, stream, block);
      uint8_t* out = dst + r * row_bytes + b * info.block_bytes;
      switch (t.type) {
        case GgmlType::Q8_0: synth::gen_q8_0(rng, d_bits, out); break;
        case GgmlType::Q2_K: synth::gen_q2_k(rng, d_bits, out); break;
        case GgmlType::Q4_K: synth::gen_q4_k(rng, d_bits, dmin_bits, out); break;
        case GgmlType::IQ2_XXS: synth::gen_iq2_xxs(rng, d_bits, out); break;
        case GgmlType::MXFP4: synth::gen_mxfp4(rng, mx_e, out); break;
        default: DSV4_UNREACHABLE();
      }
    }
  }
}

GgufWriter synth_writer(const SynthPlan& plan, ThreadPool& pool) {
  const ModelSpec& spec = plan.preset.spec;
  GgufWriter w;
  if (plan.dspark) {
    const DSparkMeta& m = plan.dspark_meta;
    w.set_string("general.architecture", "deepseek4-dspark");
    w.set_string("general.name", spec.name + " DSpark support (synthetic, " + plan.preset.name + ")");
    w.set_u32("general.alignment", 32);
    w.set_u32("dspark.block_size", m.block_size);
    w.set_u32("dspark.markov_rank", m.markov_rank);
    w.set_u32("dspark.noise_token_id", m.noise_token_id);
    w.set_array_u32("dspark.target_layer_ids", m.target_layers);
    w.set_u32("dspark.stage_count", m.stage_count);
    w.set_u32("dspark.n_layers", m.stage_count);
    w.set_u64("dsv4.synth.seed", plan.seed);
  } else if (plan.mtp) {
    w.set_string("general.architecture", "deepseek4");
    w.set_string("general.name", spec.name + " MTP block (synthetic, " + plan.preset.name + ")");
    w.set_u64("dsv4.synth.seed", plan.seed);
  } else {
    spec.write_gguf(w);
    w.set_string("general.name", spec.name + " (synthetic, " + plan.preset.name + ")");
    w.set_u32("general.quantization_version", 2);
    w.set_string("dsv4.synth.preset", plan.preset.name);
    w.set_u64("dsv4.synth.seed", plan.seed);
    SynthVocab vocab = make_synth_vocab(spec.n_vocab);
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "joyai-llm");
    w.set_array_string("tokenizer.ggml.tokens", vocab.tokens);
    w.set_array_i32("tokenizer.ggml.token_type", vocab.types);
    w.set_array_string("tokenizer.ggml.merges", vocab.merges);
    w.set_u32("tokenizer.ggml.bos_token_id", 0);
    w.set_u32("tokenizer.ggml.eos_token_id", 1);
    w.set_u32("tokenizer.ggml.padding_token_id", 2);
  }

  for (const auto& t : plan.tensors) {
    const SynthTensor* tp = &t;
    uint64_t row_bytes = ggml_row_bytes(t.type, t.spec.ne[0]);
    w.add_tensor(t.spec.name, t.type, t.spec.ne,
                 [&plan, tp, &pool, row_bytes](uint64_t r0, uint64_t nr, uint8_t* dst) -> Status {
                   pool.parallel_for(
                       nr, [&](size_t b, size_t e) { synth_fill_rows(plan, *tp, r0 + b, e - b, dst + b * row_bytes); },
                       std::max<size_t>(1, (1u << 20) / std::max<uint64_t>(1, row_bytes)));
                   return {};
                 });
  }
  return w;
}

Status synth_write(const SynthPlan& plan, const std::string& path, int n_threads,
                   const std::function<void(uint64_t, uint64_t)>& progress) {
  ThreadPool pool(n_threads);
  GgufWriter w = synth_writer(plan, pool);
  return w.write_mapped(path, progress);
}

expected<int> synth_memfd(const SynthPlan& plan, int n_threads,
                          const std::function<void(uint64_t, uint64_t)>& progress) {
  const std::string name = "dsv4-synthetic-" + plan.preset.name;
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return make_error("memfd_create failed: %s", std::strerror(errno));
  ThreadPool pool(n_threads);
  GgufWriter w = synth_writer(plan, pool);
  if (auto st = w.write_mapped(fd, name, progress); !st) {
    ::close(fd);
    return st.error().with_context("the synthetic " + plan.preset.name + " model in memory");
  }
  return fd;
}

}  // namespace dsv4
