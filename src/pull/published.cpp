#include "pull/published.h"

namespace dsv4 {

namespace {
constexpr PublishedFile k_files[] = {
    {"q2", "DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix-0731.gguf",
     "Flash 0731, routed experts IQ2_XXS gate/up + Q2_K down (fits one 96+ GB GPU)", 80.8, true},
    {"q2-q4",
     "DeepSeek-V4-Flash-Layers37-42Q4KExperts-OtherExpertLayersIQ2XXSGateUp-Q2KDown-AProjQ8-SExpQ8-OutQ8-chat-v2-"
     "imatrix-fixed-0731.gguf",
     "Flash 0731, q2 with the routed experts of layers 37-42 in Q4_K", 90.9, true},
    {"q4",
     "DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2-imatrix-0731.gguf",
     "Flash 0731, routed experts Q4_K", 153.3, true},
    {"mxfp4",
     "DeepSeek-V4-Flash-MXFP4Experts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2-mxfp4-0731.gguf",
     "Flash 0731, routed experts MXFP4 (DeepSeek's FP4 weights, lossless)", 145.3, true},
    {"dspark", "DeepSeek-V4-Flash-DSpark-support-0731.gguf",
     "DSpark drafter for the 0731 Flash files (speculative decoding: --dspark FILE)", 5.58, true},
    {"mtp", "DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf", "MTP block for the pre-0731 Flash weights", 3.54, true},
    {"pro-q2", "DeepSeek-V4-Pro-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-Instruct-imatrix.gguf",
     "V4 Pro (61 layers, 384 experts), routed experts IQ2_XXS + Q2_K", 0.0, true},
};
}  // namespace

std::span<const PublishedFile> published_files() { return k_files; }

expected<PublishedFile> find_published(std::string_view name) {
  std::string names;
  for (const PublishedFile& f : k_files) {
    if (name == f.name) return f;
    names += (names.empty() ? "" : ", ") + std::string(f.name);
  }
  return make_error("unknown file \"%.*s\" (published: %s)", static_cast<int>(name.size()), name.data(), names.c_str());
}

}  // namespace dsv4
