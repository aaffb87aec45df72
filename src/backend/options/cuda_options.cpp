#include "backend/options/cuda_options.h"

#include <algorithm>
#include <charconv>
#include <string>

namespace dsv4 {

namespace {

constexpr const char* k_dup_names[] = {"hc_pre",    "hc_head",    "rms_norm",       "matmul",
                                       "matmuls",   "store_rows", "indexer_scores", "topk",
                                       "attention", "moe_route",  "moe_experts",    "swiglu"};
static_assert(std::size(k_dup_names) == static_cast<size_t>(CudaDupOp::COUNT));

std::string expert_gemm_text(int n) {
  if (n == k_expert_gemm_auto) return "auto";
  if (n == 0) return "off";
  if (n == 1) return "on";
  return std::to_string(n);
}

}  // namespace

const char* cuda_dup_op_name(CudaDupOp op) {
  const auto i = static_cast<size_t>(op);
  return i < std::size(k_dup_names) ? k_dup_names[i] : "?";
}

const char* cuda_dup_op_names() {
  static const std::string names = [] {
    std::string n;
    for (const char* k : k_dup_names) n += (n.empty() ? "" : ", ") + std::string(k);
    return n;
  }();
  return names.c_str();
}

Status parse_cublas(std::string_view text, CudaOptions& options) {
  if (text.empty()) return make_error("empty (want auto, off or the path of libcublas)");
  options.cublas_library.clear();
  if (text == "auto") {
    options.cublas = CublasMode::AUTO;
  } else if (text == "off") {
    options.cublas = CublasMode::OFF;
  } else {
    options.cublas = CublasMode::LIBRARY;
    options.cublas_library = std::string(text);
  }
  return {};
}

expected<uint64_t> parse_gpu_memory(std::string_view text) {
  if (text == "auto") return uint64_t{0};
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::fixed);
  const bool digits = ec == std::errc() && v >= 0;
  const size_t i = static_cast<size_t>(end - text.data());
  const std::string_view unit = text.substr(i);
  double mult = 0;
  if (unit.empty() || unit == "G" || unit == "GiB" || unit == "g") mult = double(uint64_t{1} << 30);
  if (unit == "M" || unit == "MiB" || unit == "m") mult = double(uint64_t{1} << 20);
  if (!digits || mult == 0 || v > 1e6)
    return make_error("--gpu-memory %.*s: want auto or a size such as 24G, 24GiB, 40960M (a plain number: GiB)",
                      static_cast<int>(text.size()), text.data());
  const auto bytes = static_cast<uint64_t>(v * mult);
  if (bytes < (uint64_t{1} << 30))
    return make_error("--gpu-memory %.*s: at least 1 GiB", static_cast<int>(text.size()), text.data());
  return bytes;
}

expected<std::vector<int>> parse_gpus(std::string_view text) {
  if (text == "all") return std::vector<int>{-1};
  std::vector<int> out;
  for (size_t at = 0; at <= text.size();) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    int v = -1;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < 0 || v > 1023)
      return make_error("--gpus %.*s: want all or device indices such as 0,1", static_cast<int>(text.size()),
                        text.data());
    if (std::find(out.begin(), out.end(), v) != out.end())
      return make_error("--gpus %.*s: device %d twice", static_cast<int>(text.size()), text.data(), v);
    out.push_back(v);
    at = comma + 1;
  }
  if (out.size() > 16) return make_error("--gpus: %zu devices (at most 16)", out.size());
  return out;
}

expected<float> parse_cpu_experts(std::string_view text) {
  if (text == "auto") return -1.0f;
  if (text == "off") return 0.0f;
  double v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v, std::chars_format::fixed);
  if (ec != std::errc() || end != text.data() + text.size() || !(v >= 0.0 && v <= 1.0))
    return make_error("--cpu-experts %.*s: want auto, off or a share from 0 to 1 (such as 0.4)",
                      static_cast<int>(text.size()), text.data());
  return static_cast<float>(v);
}

expected<StreamExperts> parse_stream_experts(std::string_view text) {
  if (text == "auto") return StreamExperts::AUTO;
  if (text == "on") return StreamExperts::ON;
  if (text == "off") return StreamExperts::OFF;
  return make_error("--stream-experts %.*s: want auto, on or off", static_cast<int>(text.size()), text.data());
}

const char* stream_experts_name(StreamExperts mode) {
  switch (mode) {
    case StreamExperts::AUTO: return "auto";
    case StreamExperts::ON: return "on";
    case StreamExperts::OFF: return "off";
  }
  return "?";
}

expected<ActQuantFusion> parse_act_quant_fusion(std::string_view text) {
  for (ActQuantFusion m : {ActQuantFusion::AUTO, ActQuantFusion::ALL, ActQuantFusion::OFF})
    if (text == act_quant_fusion_name(m)) return m;
  return make_error("--act-quant-fusion %.*s: want auto, all or off", static_cast<int>(text.size()), text.data());
}

const char* act_quant_fusion_name(ActQuantFusion mode) {
  switch (mode) {
    case ActQuantFusion::OFF: return "off";
    case ActQuantFusion::AUTO: return "auto";
    case ActQuantFusion::ALL: return "all";
  }
  return "?";
}

int expert_gemm_auto_min(GgmlType gate_type) {
  // H100, one layer of Flash experts, uniform routing (bench_cuda_ops --expert-gemm off|on): the q2 experts
  // (IQ2_XXS gate/up, Q2_K down) and, since its wider producer loads, the Q4_K ones on the GEMM lose at 18
  // assignments per expert and win from 24 on.
  switch (gate_type) {
    case GgmlType::IQ2_XXS:
    case GgmlType::Q4_K: return 32;
    default: return 64;
  }
}

std::string expert_gemm_auto_text() {
  const int iq2 = expert_gemm_auto_min(GgmlType::IQ2_XXS), q4 = expert_gemm_auto_min(GgmlType::Q4_K);
  return (iq2 == q4 ? std::to_string(iq2) + " IQ2_XXS and Q4_K"
                    : std::to_string(iq2) + " IQ2_XXS, " + std::to_string(q4) + " Q4_K") +
         ", else " + std::to_string(expert_gemm_auto_min(GgmlType::Q8_0));
}

expected<int> parse_expert_gemm(std::string_view text) {
  if (text == "auto") return k_expert_gemm_auto;
  if (text == "on") return 1;
  if (text == "off") return 0;
  int n = 0;
  bool digits = !text.empty() && text.size() <= 7;
  for (char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) n = n * 10 + (c - '0');
  }
  if (!digits || n < 1 || n > 1000000)
    return make_error("want auto, on, off or a whole number from 1 to 1000000, got \"%s\"", std::string(text).c_str());
  return n;
}

expected<unsigned> parse_dup_ops(std::string_view list) {
  unsigned mask = 0;
  size_t at = 0;
  while (at < list.size()) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string_view name = list.substr(at, end - at);
    at = end + 1;
    if (name.empty()) continue;
    unsigned bit = ~0u;
    for (unsigned i = 0; i < std::size(k_dup_names); ++i)
      if (name == k_dup_names[i]) bit = i;
    if (bit == ~0u)
      return make_error("cannot launch op \"%s\" twice (the ops that can: %s)", std::string(name).c_str(),
                        cuda_dup_op_names());
    mask |= 1u << bit;
  }
  return mask;
}

Status CudaOptions::check() const {
  if (gemm_min_tokens < 2)
    return make_error("--gemm-min-tokens %lld: the cuBLAS matmul threshold must be at least 2 tokens",
                      static_cast<long long>(gemm_min_tokens));
  if (ffma_max_tokens < 0 || ffma_max_tokens > 64)
    return make_error("--ffma-max-tokens %lld: want 0 to 64", static_cast<long long>(ffma_max_tokens));
  if (cublas == CublasMode::LIBRARY && cublas_library.empty())
    return make_error("--cublas: empty (want auto, off or the path of libcublas)");
  if (expert_gemm_min != k_expert_gemm_auto && (expert_gemm_min < 0 || expert_gemm_min > 1000000))
    return make_error("--expert-gemm %d: want auto, 0 (off) or 1 to 1000000 assignments", expert_gemm_min);
  if (expert_group_min < 1 || expert_group_min > 1000000)
    return make_error("--expert-group-min %lld: want 1 to 1000000 tokens", static_cast<long long>(expert_group_min));
  if (dup_ops >> static_cast<unsigned>(CudaDupOp::COUNT)) return make_error("--dup-ops: unknown op bits 0x%x", dup_ops);
  if (!(cpu_experts < 0.0f || (cpu_experts >= 0.0f && cpu_experts <= 1.0f)))
    return make_error("--cpu-experts %g: want auto, off or a share from 0 to 1", static_cast<double>(cpu_experts));
  if (fast_attention_terms < 1 || fast_attention_terms > 3)
    return make_error("--fast-attention-terms %d: want 1, 2 or 3", fast_attention_terms);
  if (cpu_expert_threads < 0 || cpu_expert_threads > 4096)
    return make_error("cpu expert threads %d: want 0 (every core but one) to 4096", cpu_expert_threads);
  return {};
}

std::string CudaOptions::describe() const {
  const CudaOptions d;
  std::string s;
  auto add = [&s](const std::string& w) { s += (s.empty() ? "" : " ") + w; };
  if (tensor_cores != d.tensor_cores) add("tensor_cores=off");
  if (int_dot != d.int_dot) add("int_dot=off");
  if (int8_matvec != d.int8_matvec) add("int8_matvec=off");
  if (int8_tiles != d.int8_tiles) add("int8_tiles=off");
  if (act_quant_fusion != d.act_quant_fusion)
    add(std::string("act_quant_fusion=") + act_quant_fusion_name(act_quant_fusion));
  if (token_matvec != d.token_matvec) add("token_matvec=off");
  if (cublas == CublasMode::OFF) add("cublas=off");
  if (cublas == CublasMode::LIBRARY) add("cublas=" + cublas_library);
  if (gemm_min_tokens != d.gemm_min_tokens) add("gemm_min_tokens=" + std::to_string(gemm_min_tokens));
  if (ffma_max_tokens != d.ffma_max_tokens) add("ffma_max_tokens=" + std::to_string(ffma_max_tokens));
  if (branches != d.branches) add("branches=off");
  if (graphs != d.graphs) add("graphs=off");
  if (pdl != d.pdl) add("pdl=off");
  if (expert_gemm_min != d.expert_gemm_min) add("expert_gemm=" + expert_gemm_text(expert_gemm_min));
  if (expert_gemm_codes != d.expert_gemm_codes) add("expert_gemm_codes=off");
  if (fast_attention_terms != d.fast_attention_terms)
    add("fast_attention_terms=" + std::to_string(fast_attention_terms));
  if (expert_group_min != d.expert_group_min) add("expert_group_min=" + std::to_string(expert_group_min));
  if (expert_gather != d.expert_gather) add("expert_gather=off");
  if (expert_prefetch != d.expert_prefetch) add("expert_prefetch=off");
  if (gemm_weight_cache != d.gemm_weight_cache) add("gemm_weight_cache=off");
  if (gpu_memory != d.gpu_memory) add(strfmt("gpu_memory=%.2fGiB", static_cast<double>(gpu_memory) / (1u << 30)));
  if (!gpus.empty()) {
    std::string list;
    for (int g : gpus) list += (list.empty() ? "" : ",") + (g < 0 ? std::string("all") : std::to_string(g));
    add("gpus=" + list);
  }
  if (cpu_experts != d.cpu_experts)
    add(cpu_experts < 0.0f ? std::string("cpu_experts=auto")
                           : strfmt("cpu_experts=%.2f", static_cast<double>(cpu_experts)));
  if (cpu_expert_threads != d.cpu_expert_threads) add(strfmt("cpu_expert_threads=%d", cpu_expert_threads));
  if (stream_experts != d.stream_experts) add(std::string("stream_experts=") + stream_experts_name(stream_experts));
  if (dup_ops != 0) {
    std::string names;
    for (unsigned i = 0; i < static_cast<unsigned>(CudaDupOp::COUNT); ++i)
      if (dup(static_cast<CudaDupOp>(i))) names += (names.empty() ? "" : ",") + std::string(k_dup_names[i]);
    add("dup_ops=" + names);
  }
  return s;
}

}  // namespace dsv4
