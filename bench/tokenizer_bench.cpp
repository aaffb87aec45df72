// Tokenizer throughput on ~1 MiB of mixed text (English, code, JSON, CJK,
// kana, Hangul, Arabic, Devanagari, emoji, digit and whitespace runs).
//
// Two vocabularies:
//  * "synthetic": the real file's scale (129280 tokens, 127741 merges), made
//    by building every frequent piece of the text itself up from bytes with
//    left-to-right merges, so most pieces run a long merge chain;
//  * "golden": the 4006-token HF-trained vocabulary of the golden fixture
//    (tests/fixtures/tokenizer/golden.json), when present.
//
// Reported as bytes/second of input text (items = tokens produced).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace dsv4 {
namespace {

const std::string& bench_text() {
  static const std::string text = [] {
    const std::vector<std::string> english = {
        "the",       "of",         "and",     "to",      "in",         "is",        "that",      "for",    "it",
        "as",        "with",       "was",     "on",      "model",      "token",     "inference", "engine", "DeepSeek",
        "attention", "compressed", "kernel",  "memory",  "throughput", "latency",   "It's",      "don't",  "we'll",
        "Hello",     "world",      "because", "however", "tokenizer",  "benchmark", "results"};
    const std::vector<std::string> code = {
        "def forward(self, x):\n        return self.proj(x) + x\n",
        "    for (int i = 0; i < n; ++i) { acc += a[i] * b[i]; }\n",
        "{\"role\": \"user\", \"content\": \"What is 2+2?\", \"id\": 12345}\n",
        "const result = await fetch(`/api/v1/items/${id}`);\n",
        "if err != nil {\n\t\treturn nil, fmt.Errorf(\"open %s: %w\", path, err)\n\t}\n",
        "SELECT name, COUNT(*) FROM users WHERE age >= 21 GROUP BY name;\n"};
    const std::vector<std::string> other = {"自然语言处理是人工智能的一个重要分支。",
                                            "日本語のテキストとカタカナ・ひらがな。",
                                            "한국어 문장입니다. ",
                                            "مرحبا بكم في العالم ",
                                            "नमस्ते दुनिया, ",
                                            "Привет, как дела? ",
                                            "Καλημέρα κόσμε. ",
                                            "\U0001F600\U0001F44D\U0001F3FD ",
                                            "\U0001F468\u200d\U0001F469\u200d\U0001F467 ",
                                            "caf\u00e9 na\u00efve \u2014 ",
                                            "\u00a0\u00a0",
                                            "    ",
                                            "\n\n",
                                            "\r\n",
                                            "\t",
                                            "3.14159 ",
                                            "1234567890 ",
                                            "2024-05-21 "};
    Rng rng(42);
    std::string s;
    while (s.size() < (1u << 20)) {
      const uint64_t r = rng.below(10);
      if (r < 5) {
        for (int w = 0; w < 12; ++w) {
          s += english[rng.below(english.size())];
          s += rng.below(8) == 0 ? ", " : " ";
        }
        s += ".\n";
      } else if (r < 8) {
        s += code[rng.below(code.size())];
      } else {
        for (int k = 0; k < 4; ++k) s += other[rng.below(other.size())];
      }
    }
    return s;
  }();
  return text;
}

struct VocabSpec {
  std::vector<std::string> tokens, merges;
  std::vector<int32_t> types;
};

VocabSpec make_synthetic_vocab() {
  constexpr size_t k_vocab = 129280, k_merges = 127741;
  std::vector<std::string> tokens = {std::string(k_token_bos), std::string(k_token_eos), "<｜▁pad▁｜>"};
  std::vector<int32_t> types = {3, 3, 3};
  std::set<std::string> have;
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
    have.insert(tokens.back());
    types.push_back(1);
  }
  // Most frequent pieces first; each is built up byte by byte.
  std::map<std::string_view, size_t> counts;
  for (std::string_view p : pretokenize(bench_text())) ++counts[p];
  std::vector<std::pair<size_t, std::string_view>> order;
  for (const auto& [p, c] : counts) order.emplace_back(c, p);
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<std::string> merges;
  std::set<std::string> merged;
  for (const auto& [c, piece] : order) {
    std::string cur = bytes_to_byte_level(piece.substr(0, 1));
    for (size_t k = 1; k < piece.size() && merges.size() < k_merges; ++k) {
      const std::string next = bytes_to_byte_level(piece.substr(k, 1));
      std::string m = cur + " " + next;
      cur += next;
      if (merged.insert(m).second) merges.push_back(std::move(m));
      if (have.insert(cur).second) {
        tokens.push_back(cur);
        types.push_back(1);
      }
    }
    if (merges.size() >= k_merges) break;
  }
  // Filler merges ("x y" chains over byte pairs) up to the real merge count.
  for (int a = 0; a < 256 && merges.size() < k_merges; ++a)
    for (int b = 0; b < 256 && merges.size() < k_merges; ++b) {
      const std::string l = bytes_to_byte_level(std::string(1, static_cast<char>(a)));
      const std::string r = bytes_to_byte_level(std::string(1, static_cast<char>(b)));
      std::string m = l + " " + r;
      if (!merged.insert(m).second) continue;
      merges.push_back(std::move(m));
      if (have.insert(l + r).second) {
        tokens.push_back(l + r);
        types.push_back(1);
      }
    }
  for (std::string_view s : {k_token_user, k_token_assistant, k_token_think_begin, k_token_think_end, k_token_dsml}) {
    tokens.emplace_back(s);
    types.push_back(3);
  }
  while (tokens.size() < k_vocab) {
    tokens.push_back("<｜place▁holder▁no▁" + std::to_string(tokens.size()) + "｜>");
    types.push_back(3);
  }
  return VocabSpec{std::move(tokens), std::move(merges), std::move(types)};
}

const VocabSpec& synthetic_vocab() {
  static const VocabSpec v = make_synthetic_vocab();
  return v;
}

std::unique_ptr<Tokenizer> synthetic_tokenizer() {
  const VocabSpec& v = synthetic_vocab();
  auto t = Tokenizer::from_vocab(v.tokens, v.merges, v.types);
  if (!t) {
    fprintf(stderr, "synthetic vocabulary: %s\n", t.error().message.c_str());
    std::abort();
  }
  return std::move(*t);
}

const Tokenizer* synthetic() {
  static const std::unique_ptr<Tokenizer> t = synthetic_tokenizer();
  return t.get();
}

const Tokenizer* golden() {
  static const std::unique_ptr<Tokenizer> t = []() -> std::unique_ptr<Tokenizer> {
    std::ifstream in(DSV4_TOKENIZER_GOLDEN);
    if (!in) return nullptr;
    const nlohmann::json j = nlohmann::json::parse(in);
    auto tok = Tokenizer::from_vocab(j.at("vocab").get<std::vector<std::string>>(),
                                     j.at("merges").get<std::vector<std::string>>(),
                                     j.at("token_types").get<std::vector<int32_t>>());
    return tok ? std::move(*tok) : nullptr;
  }();
  return t.get();
}

void report(benchmark::State& state, size_t tokens) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bench_text().size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes_per_token"] = static_cast<double>(bench_text().size()) / static_cast<double>(tokens);
}

void BM_pretokenize(benchmark::State& state) {
  const std::string& text = bench_text();
  size_t pieces = 0;
  for (auto _ : state) {
    std::vector<std::string_view> v = pretokenize(text);
    pieces = v.size();
    benchmark::DoNotOptimize(v.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["pieces"] = static_cast<double>(pieces);
}

void encode_bench(benchmark::State& state, const Tokenizer* tok) {
  if (!tok) {
    state.SkipWithError("golden fixture not found");
    return;
  }
  size_t n = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tok->encode(bench_text());
    n = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, n);
}

void BM_encode_synthetic_129k(benchmark::State& state) { encode_bench(state, synthetic()); }
void BM_encode_golden_4k(benchmark::State& state) { encode_bench(state, golden()); }

void BM_stream_decode_synthetic(benchmark::State& state) {
  const Tokenizer* tok = synthetic();
  const std::vector<int32_t> ids = tok->encode(bench_text());
  for (auto _ : state) {
    StreamDecoder d(*tok);
    size_t bytes = 0;
    for (int32_t id : ids) bytes += d.push(id).size();
    bytes += d.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  report(state, ids.size());
}

void BM_load_synthetic_129k(benchmark::State& state) {
  const VocabSpec& v = synthetic_vocab();
  for (auto _ : state) {
    state.PauseTiming();
    VocabSpec copy = v;
    state.ResumeTiming();
    auto t = Tokenizer::from_vocab(std::move(copy.tokens), std::move(copy.merges), std::move(copy.types));
    benchmark::DoNotOptimize(t.has_value());
  }
}

BENCHMARK(BM_pretokenize)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_encode_synthetic_129k)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_encode_golden_4k)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_stream_decode_synthetic)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_load_synthetic_129k)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace dsv4

BENCHMARK_MAIN();
