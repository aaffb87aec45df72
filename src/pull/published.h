// The published DeepSeek V4 GGUF files dsv4 knows by short name (`dsv4 pull NAME`), from the
// antirez/deepseek-v4-gguf repository (their layouts: docs/formats.md §1.9).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"

namespace dsv4 {

struct PublishedFile {
  const char* name;   // short name: q2, q2-q4, q4, mxfp4, dspark, mtp, pro-q2
  const char* file;   // the file name in the repository
  const char* what;   // one line for --list
  double approx_gib;  // tensor bytes / 2^30 (the files add a few MB of metadata); 0: not known
  bool loads;         // dsv4 runs it today (else it downloads, and says what is missing)
};

// Where `dsv4 pull` downloads from unless --base-url says otherwise (a file's URL is base + file).
inline constexpr const char* k_published_base_url = "https://huggingface.co/antirez/deepseek-v4-gguf/resolve/main/";

std::span<const PublishedFile> published_files();
// The file of a short name; an error listing the names otherwise.
expected<PublishedFile> find_published(std::string_view name);

}  // namespace dsv4
