#include "model/expert_stats.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>

#include "core/fd_io.h"

namespace dsv4 {

namespace {

constexpr std::string_view k_magic = "dsv4-expert-stats 1";
constexpr uint32_t k_max_layers = 4096, k_max_experts = 65536;
constexpr size_t k_max_file = size_t{256} << 20;

// Splits off the next line (without its '\n'); false at the end of the text.
bool next_line(std::string_view& text, std::string_view& line) {
  if (text.empty()) return false;
  const size_t nl = text.find('\n');
  line = text.substr(0, nl);
  text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return true;
}

// The next space-separated unsigned number of `line`.
bool next_number(std::string_view& line, uint64_t& v) {
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  if (line.empty()) return false;
  const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), v);
  if (ec != std::errc{} || (p != line.data() + line.size() && *p != ' ')) return false;
  line.remove_prefix(static_cast<size_t>(p - line.data()));
  return true;
}

bool take_word(std::string_view& line, std::string_view word) {
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  if (line.substr(0, word.size()) != word) return false;
  line.remove_prefix(word.size());
  return line.empty() || line.front() == ' ';
}

}  // namespace

ExpertStats ExpertStats::zeros(uint32_t n_layer, uint32_t n_expert) {
  ExpertStats s;
  s.n_layer = n_layer;
  s.n_expert = n_expert;
  s.counts.assign(static_cast<size_t>(n_layer) * n_expert, 0);
  return s;
}

uint64_t ExpertStats::total() const {
  uint64_t t = 0;
  for (uint64_t c : counts) t += c;
  return t;
}

Status ExpertStats::merge(const ExpertStats& o) {
  if (o.n_layer != n_layer || o.n_expert != n_expert)
    return make_error("routing statistics of %u layers x %u experts cannot be merged with %u x %u", o.n_layer,
                      o.n_expert, n_layer, n_expert);
  for (size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
  return {};
}

double ExpertStats::top_share(double fraction) const {
  const size_t top = std::clamp<size_t>(static_cast<size_t>(fraction * n_expert + 0.5), 0, n_expert);
  uint64_t in_top = 0, all = 0;
  std::vector<uint64_t> row(n_expert);
  for (uint32_t l = 0; l < n_layer; ++l) {
    std::copy_n(counts.begin() + static_cast<std::ptrdiff_t>(l) * n_expert, n_expert, row.begin());
    std::sort(row.begin(), row.end(), std::greater<>());
    for (size_t e = 0; e < row.size(); ++e) (e < top ? in_top : all) += row[e];
  }
  all += in_top;
  return all ? static_cast<double>(in_top) / static_cast<double>(all) : 0.0;
}

std::string expert_stats_encode(const ExpertStats& s) {
  std::string out(k_magic);
  out += "\nlayers " + std::to_string(s.n_layer) + " experts " + std::to_string(s.n_expert) + "\n";
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    out += std::to_string(l);
    for (uint32_t e = 0; e < s.n_expert; ++e) {
      out += ' ';
      out += std::to_string(s.at(l, e));
    }
    out += '\n';
  }
  return out;
}

expected<ExpertStats> expert_stats_decode(std::string_view text) {
  std::string_view line;
  if (!next_line(text, line) || line != k_magic)
    return make_error("not a dsv4 routing statistics file (the first line is not \"%.*s\")",
                      static_cast<int>(k_magic.size()), k_magic.data());
  uint64_t layers = 0, experts = 0;
  if (!next_line(text, line) || !take_word(line, "layers") || !next_number(line, layers) ||
      !take_word(line, "experts") || !next_number(line, experts) || !line.empty())
    return make_error("line 2: expected \"layers N experts E\"");
  if (layers == 0 || layers > k_max_layers || experts == 0 || experts > k_max_experts)
    return make_error("line 2: %llu layers x %llu experts is out of range", static_cast<unsigned long long>(layers),
                      static_cast<unsigned long long>(experts));
  // Every count takes at least one character: a shorter rest cannot hold them (and nothing is allocated
  // for counts that are not there).
  if (layers * experts > text.size())
    return make_error("line 2: %llu layers x %llu experts, but the file is too short to hold their counts",
                      static_cast<unsigned long long>(layers), static_cast<unsigned long long>(experts));
  ExpertStats s = ExpertStats::zeros(static_cast<uint32_t>(layers), static_cast<uint32_t>(experts));
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const int ln = static_cast<int>(l) + 3;
    if (!next_line(text, line)) return make_error("line %d: the file ends before layer %u", ln, l);
    uint64_t idx = 0;
    if (!next_number(line, idx) || idx != l) return make_error("line %d: expected layer %u first", ln, l);
    for (uint32_t e = 0; e < s.n_expert; ++e)
      if (!next_number(line, s.at(l, e)))
        return make_error("line %d: expected %u counts, found %u (or a count that is not a number)", ln, s.n_expert, e);
    if (!line.empty()) return make_error("line %d: more than %u counts", ln, s.n_expert);
  }
  while (next_line(text, line))
    if (!line.empty()) return make_error("text after the last layer's line");
  return s;
}

expected<ExpertStats> expert_stats_load(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return make_error("cannot open %s: %s", path.c_str(), std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() <= k_max_file) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return make_error("reading %s failed", path.c_str());
  if (text.size() > k_max_file) return make_error("%s is larger than a routing statistics file can be", path.c_str());
  auto s = expert_stats_decode(text);
  if (!s) return s.error().with_context(path);
  return s;
}

Status expert_stats_save(const std::string& path, const ExpertStats& s) {
  const std::string text = expert_stats_encode(s);
  return write_file_atomic(path, text.data(), text.size());
}

}  // namespace dsv4
