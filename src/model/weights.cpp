#include "model/weights.h"

#include <unordered_set>

namespace dsv4 {

namespace {

std::string dims_string(const std::vector<uint64_t>& ne) {
  std::string s = "[";
  for (size_t i = 0; i < ne.size(); ++i) s += strfmt(i ? ", %llu" : "%llu", static_cast<unsigned long long>(ne[i]));
  return s + "]";
}

TensorRef make_ref(const GgufFile& f, const GgufTensorInfo& t) {
  TensorRef r;
  r.data = f.tensor_data(t);
  r.type = t.type;
  for (uint32_t d = 0; d < 4; ++d) r.ne[d] = t.ne[d];
  r.n_bytes = t.n_bytes;
  r.name = std::string(t.name);
  return r;
}

// Binds every entry of `table` into the slots via `store`; collects messages.
template <class Store>
void bind_table(const GgufFile& f, const std::vector<TensorSpec>& table, std::vector<std::string>& errors,
                Store&& store) {
  for (const auto& spec : table) {
    const GgufTensorInfo* t = f.find_tensor(spec.name);
    if (!t) {
      if (spec.required)
        errors.push_back(strfmt("missing tensor %s (expected %s, type %s)", spec.name.c_str(),
                                dims_string(spec.ne).c_str(), allowed_types(spec.cls).c_str()));
      continue;
    }
    std::string msg = check_tensor(spec, *t);
    if (!msg.empty()) {
      errors.push_back(msg);
      continue;
    }
    store(spec, make_ref(f, *t));
  }
}

Status check_expert_pairing(const LayerWeights& lw, const std::string& where) {
  const TensorRef& g = lw[LayerTensor::FFN_GATE_EXPS];
  const TensorRef& u = lw[LayerTensor::FFN_UP_EXPS];
  if (g && u && g.type != u.type)
    return make_error("%s: ffn_up_exps is %s but ffn_gate_exps is %s (gate and up must have the same type)",
                      where.c_str(), ggml_type_name(u.type), ggml_type_name(g.type));
  return {};
}

Status report(const std::vector<std::string>& errors, const char* what) {
  if (errors.empty()) return {};
  std::string msg = strfmt("%s does not match the DeepSeek V4 tensor layout (%zu problem%s):", what, errors.size(),
                           errors.size() == 1 ? "" : "s");
  size_t shown = 0;
  for (const auto& e : errors) {
    if (shown++ == 12) {
      msg += strfmt("\n  ... and %zu more", errors.size() - 12);
      break;
    }
    msg += "\n  " + e;
  }
  return Error{msg};
}

}  // namespace

std::string check_tensor(const TensorSpec& spec, const GgufTensorInfo& t) {
  std::vector<uint64_t> actual(t.ne, t.ne + t.n_dims);
  // Trailing 1-dims are not significant (ggml drops or keeps them freely).
  auto trim = [](std::vector<uint64_t> v) {
    while (v.size() > 1 && v.back() == 1) v.pop_back();
    return v;
  };
  if (trim(actual) != trim(spec.ne))
    return strfmt("tensor %s: expected shape %s, found %s", spec.name.c_str(), dims_string(spec.ne).c_str(),
                  dims_string(actual).c_str());
  if (!type_allowed(spec.cls, t.type))
    return strfmt("tensor %s: type %s is not allowed (allowed: %s)", spec.name.c_str(), ggml_type_name(t.type),
                  allowed_types(spec.cls).c_str());
  return "";
}

std::string QuantMix::describe() const {
  std::string recipe;
  if (expert_gate_up == GgmlType::IQ2_XXS && expert_down == GgmlType::Q2_K)
    recipe = "q2";
  else if (expert_gate_up == GgmlType::Q4_K && expert_down == GgmlType::Q4_K)
    recipe = "q4";
  else if (expert_gate_up == GgmlType::Q8_0 && expert_down == GgmlType::Q8_0)
    recipe = "q8";
  else if (expert_gate_up == GgmlType::MXFP4 && expert_down == GgmlType::MXFP4)
    recipe = "mxfp4";
  else if (expert_gate_up == expert_down)
    recipe = ggml_type_name(expert_gate_up);
  else
    recipe = "mixed";
  std::string tail;
  if (tail_layers > 0) {
    if (recipe == "q2" && tail_gate_up == GgmlType::Q4_K && tail_down == GgmlType::Q4_K) recipe = "q2-q4";
    tail = tail_gate_up == tail_down
               ? strfmt("; the last %u layers' experts %s", tail_layers, ggml_type_name(tail_gate_up))
               : strfmt("; the last %u layers' experts %s gate/up, %s down", tail_layers, ggml_type_name(tail_gate_up),
                        ggml_type_name(tail_down));
  }
  return strfmt("%s (experts %s gate/up, %s down%s; dense %s)%s", recipe.c_str(), ggml_type_name(expert_gate_up),
                ggml_type_name(expert_down), tail.c_str(), ggml_type_name(dense),
                published_layout ? ", published layout" : "");
}

int QuantMix::routed_bits() const {
  switch (expert_gate_up) {
    case GgmlType::IQ2_XXS:
    case GgmlType::Q2_K: return 2;
    case GgmlType::Q4_K: return 4;
    case GgmlType::MXFP4: return 2;  // as ds4 records it (its routed-bits helper knows only Q4_K as 4)
    case GgmlType::Q8_0: return 8;
    case GgmlType::F16: return 16;
    default: return 32;
  }
}

expected<ModelWeights> bind_weights(const GgufFile& f, const ModelSpec& spec) {
  ModelWeights w;
  w.spec = spec;
  w.layers.resize(spec.n_layer);
  std::vector<TensorSpec> table = main_tensor_table(spec);
  std::vector<std::string> errors;
  bind_table(f, table, errors, [&](const TensorSpec& s, TensorRef ref) {
    w.n_bytes += ref.n_bytes;
    if (s.scope == TensorScope::GLOBAL)
      w.global[static_cast<size_t>(s.slot)] = std::move(ref);
    else
      w.layers[static_cast<size_t>(s.layer)].t[static_cast<size_t>(s.slot)] = std::move(ref);
  });
  for (uint32_t il = 0; il < spec.n_layer; ++il) {
    auto st = check_expert_pairing(w.layers[il], "blk." + std::to_string(il));
    if (!st) errors.push_back(st.error().message);
  }
  // Hash tables must name real experts (the forward pass indexes with them).
  for (uint32_t il = 0; il < spec.n_layer && errors.empty(); ++il) {
    const TensorRef& h = w.layers[il][LayerTensor::FFN_GATE_TID2EID];
    if (!h) continue;
    const int32_t* ids = h.i32();
    uint64_t n = h.ne[0] * h.ne[1];
    for (uint64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || static_cast<uint32_t>(ids[i]) >= spec.n_expert) {
        errors.push_back(strfmt("tensor %s: entry %llu = %d is not an expert id in [0, %u)", h.name.c_str(),
                                static_cast<unsigned long long>(i), ids[i], spec.n_expert));
        break;
      }
    }
  }
  DSV4_TRY(report(errors, f.path().c_str()));

  std::unordered_set<std::string> known;
  for (const auto& s : table) known.insert(s.name);
  for (const auto& t : f.tensors())
    if (!known.count(std::string(t.name))) w.ignored.emplace_back(t.name);

  const LayerWeights& l0 = w.layers[0];
  w.mix.expert_gate_up = l0[LayerTensor::FFN_GATE_EXPS].type;
  w.mix.expert_down = l0[LayerTensor::FFN_DOWN_EXPS].type;
  w.mix.dense = l0[LayerTensor::ATTN_Q_A].type;
  // Routed experts of the last layers in another type than layer 0's (q2-q4: the last 6 in Q4_K).
  const LayerWeights& last = w.layers.back();
  if (last[LayerTensor::FFN_GATE_EXPS].type != w.mix.expert_gate_up ||
      last[LayerTensor::FFN_DOWN_EXPS].type != w.mix.expert_down) {
    w.mix.tail_gate_up = last[LayerTensor::FFN_GATE_EXPS].type;
    w.mix.tail_down = last[LayerTensor::FFN_DOWN_EXPS].type;
    for (size_t l = w.layers.size(); l-- > 0;) {
      if (w.layers[l][LayerTensor::FFN_GATE_EXPS].type != w.mix.tail_gate_up ||
          w.layers[l][LayerTensor::FFN_DOWN_EXPS].type != w.mix.tail_down)
        break;
      ++w.mix.tail_layers;
    }
  }
  // Published layout: every tensor has the q2, q2-q4 or q4 recipe's type.
  for (QuantRecipe r : {QuantRecipe::Q2, QuantRecipe::Q2_Q4, QuantRecipe::Q4, QuantRecipe::MXFP4}) {
    bool all = true;
    for (const auto& s : table) {
      const GgufTensorInfo* t = f.find_tensor(s.name);
      if (t && t->type != recipe_type(r, s, spec.n_layer)) {
        all = false;
        break;
      }
    }
    if (all) w.mix.published_layout = true;
  }
  return w;
}

expected<MtpWeights> bind_mtp_weights(const GgufFile& f, const ModelSpec& spec) {
  if (auto arch = f.get_string("general.architecture"); arch && *arch == "deepseek4-dspark")
    return make_error("%s is a DSpark support file, not an MTP block: load it with --dspark", f.path().c_str());
  MtpWeights m;
  std::vector<std::string> errors;
  bind_table(f, mtp_tensor_table(spec), errors, [&](const TensorSpec& s, TensorRef ref) {
    if (s.scope == TensorScope::MTP_HEAD)
      m.head[static_cast<size_t>(s.slot)] = std::move(ref);
    else
      m.block.t[static_cast<size_t>(s.slot)] = std::move(ref);
  });
  auto st = check_expert_pairing(m.block, "mtp.0");
  if (!st) errors.push_back(st.error().message);
  DSV4_TRY(report(errors, f.path().c_str()));
  return m;
}

}  // namespace dsv4

namespace dsv4 {

namespace {

// The first of the spellings ds4 accepts for a DSpark key (ds4-variants-mtp-dspark.md §4.1).
const GgufKV* find_dspark_kv(const GgufFile& f, const char* key) {
  for (const std::string& k :
       {std::string("dspark.") + key, std::string("deepseek4.dspark.") + key, std::string("deepseek4.dspark_") + key})
    if (const GgufKV* kv = f.find(k)) return kv;
  return nullptr;
}

expected<uint32_t> dspark_u32(const GgufFile& f, const char* key) {
  const GgufKV* kv = find_dspark_kv(f, key);
  if (!kv) return make_error("metadata key dspark.%s is missing", key);
  const GgufScalar v = GgufFile::scalar(*kv);
  if (!v.is_integer() || v.i < 0 || v.u > UINT32_MAX) return make_error("metadata dspark.%s is not a count", key);
  return static_cast<uint32_t>(v.u);
}

}  // namespace

expected<DSparkMeta> read_dspark_meta(const GgufFile& f, const ModelSpec& spec) {
  auto arch = f.get_string("general.architecture");
  if (!arch || *arch != "deepseek4-dspark")
    return make_error("%s is not a DSpark support file (general.architecture is %s, not deepseek4-dspark)",
                      f.path().c_str(), arch ? std::string(*arch).c_str() : "missing");
  DSparkMeta m;
  auto fail = [&](const Error& e) { return e.with_context(f.path()); };
  auto u32 = [&](const char* key, uint32_t& out) -> Status {
    auto v = dspark_u32(f, key);
    if (!v) return fail(v.error());
    out = *v;
    return {};
  };
  DSV4_TRY(u32("block_size", m.block_size));
  DSV4_TRY(u32("markov_rank", m.markov_rank));
  DSV4_TRY(u32("noise_token_id", m.noise_token_id));
  DSV4_TRY(u32("stage_count", m.stage_count));
  const GgufKV* layers = find_dspark_kv(f, "target_layer_ids");
  if (!layers) return fail(Error{"metadata key dspark.target_layer_ids is missing"});
  DSV4_TRY_ASSIGN(std::vector<GgufScalar> ids, GgufFile::array(*layers));
  m.target_layers.clear();
  for (const GgufScalar& v : ids) {
    if (!v.is_integer() || v.i < 0 || v.u >= spec.n_layer)
      return fail(Error{strfmt("dspark.target_layer_ids: %lld is not a layer of the model (0..%u)",
                               static_cast<long long>(v.i), spec.n_layer - 1)});
    if (!m.target_layers.empty() && v.u <= m.target_layers.back())
      return fail(Error{"dspark.target_layer_ids must be strictly increasing"});
    m.target_layers.push_back(static_cast<uint32_t>(v.u));
  }
  if (m.target_layers.empty()) return fail(Error{"dspark.target_layer_ids is empty"});
  if (m.block_size < 1 || m.block_size > 16)
    return fail(Error{strfmt("dspark.block_size %u is not in 1..16", m.block_size)});
  if (m.markov_rank == 0) return fail(Error{"dspark.markov_rank is 0"});
  if (m.noise_token_id >= spec.n_vocab)
    return fail(
        Error{strfmt("dspark.noise_token_id %u is outside the vocabulary (%u)", m.noise_token_id, spec.n_vocab)});
  if (m.stage_count < 1 || m.stage_count > 8)
    return fail(Error{strfmt("dspark.stage_count %u is not in 1..8", m.stage_count)});
  return m;
}

expected<DSparkWeights> bind_dspark_weights(const GgufFile& f, const ModelSpec& spec) {
  DSparkWeights d;
  DSV4_TRY_ASSIGN(d.meta, read_dspark_meta(f, spec));
  d.stages.resize(d.meta.stage_count);
  std::vector<std::string> errors;
  bind_table(f, dspark_tensor_table(spec, d.meta), errors, [&](const TensorSpec& s, TensorRef ref) {
    if (s.scope == TensorScope::DSPARK_HEAD)
      d.head[static_cast<size_t>(s.slot)] = std::move(ref);
    else
      d.stages[static_cast<size_t>(s.layer)].t[static_cast<size_t>(s.slot)] = std::move(ref);
  });
  for (uint32_t st = 0; st < d.meta.stage_count; ++st) {
    auto pairing = check_expert_pairing(d.stages[st], ("mtp." + std::to_string(st)).c_str());
    if (!pairing) errors.push_back(pairing.error().message);
  }
  DSV4_TRY(report(errors, f.path().c_str()));
  return d;
}

}  // namespace dsv4
