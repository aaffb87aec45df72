#include "conversation/logprobs_json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "tokenizer/stream_decoder.h"

namespace dsv4 {

using ordered_json = nlohmann::ordered_json;

namespace {

ordered_json logprob_value(float lp) {
  if (!std::isfinite(lp)) return nullptr;
  return lp;
}

}  // namespace

ordered_json token_to_json(int32_t id, std::string_view bytes) {
  ordered_json j = ordered_json::object();
  j["token"] = id;
  std::string text = utf8_lossy(bytes);
  if (text != bytes) {
    ordered_json raw = ordered_json::array();
    for (char c : bytes) raw.push_back(static_cast<unsigned>(static_cast<unsigned char>(c)));
    j["text"] = std::move(text);
    j["bytes"] = std::move(raw);
  } else {
    j["text"] = std::move(text);
  }
  return j;
}

ordered_json logprobs_to_json(const LogprobDump& d, const Tokenizer& tok) {
  ordered_json j = ordered_json::object();
  j["format"] = "dsv4-logprobs";
  j["version"] = 1;
  j["model"] = d.model;
  j["prompt_tokens"] = d.prompt_tokens;
  j["top_k"] = d.top_k;
  j["finish"] = d.finish;
  // The continuation decoded as a whole: characters split across tokens come
  // out whole here even though each step's own text shows U+FFFD.
  std::string all;
  for (const auto& s : d.steps) all += s.text;
  j["text"] = utf8_lossy(all);
  ordered_json steps = ordered_json::array();
  for (const auto& s : d.steps) {
    ordered_json step = token_to_json(s.token, s.text);
    step["logprob"] = logprob_value(s.logprob);
    ordered_json top = ordered_json::array();
    for (const auto& [id, lp] : s.top) {
      ordered_json alt = token_to_json(id, tok.token_bytes(id));
      alt["logprob"] = logprob_value(lp);
      top.push_back(std::move(alt));
    }
    step["top"] = std::move(top);
    steps.push_back(std::move(step));
  }
  j["steps"] = std::move(steps);
  return j;
}

Status logprobs_write_file(const std::string& path, const LogprobDump& d, const Tokenizer& tok) {
  // Every string went through utf8_lossy, so dump() cannot meet invalid UTF-8;
  // `replace` keeps it exception-free regardless.
  const std::string text = logprobs_to_json(d, tok).dump(1, ' ', false, ordered_json::error_handler_t::replace) + "\n";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error("cannot create %s: %s", path.c_str(), std::strerror(errno));
  const size_t wrote = std::fwrite(text.data(), 1, text.size(), f);
  if (std::fclose(f) != 0 || wrote != text.size()) return make_error("writing %s failed (disk full?)", path.c_str());
  return {};
}

}  // namespace dsv4
