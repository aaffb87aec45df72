// The real `dsv4` binary on a synthetic tiny model: `dsv4 run` (one-shot,
// stdin prompts, thinking modes, stop strings, logprob dumps, errors),
// `dsv4 tokenize` and `dsv4 render --tokens`. The tiny model has random
// weights, so replies are noise; what is checked is counts, shapes,
// determinism, valid UTF-8 and error messages.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "core/utf8.h"
#include "pull/published.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string scratch() {
  static const std::string dir = [] {
    auto d = fs::temp_directory_path() / ("dsv4_cli_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(scratch(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const g_cleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

struct Result {
  int status = -1;
  std::string out, err;
};

// Runs `dsv4 ARGS` with stdin from `stdin_text` (or /dev/null), capturing
// both streams.
Result run_dsv4(const std::string& args, const std::optional<std::string>& stdin_text = std::nullopt) {
  static int n = 0;
  const std::string base = scratch() + "/cmd" + std::to_string(n++);
  std::string in = "/dev/null";
  if (stdin_text) {
    in = base + ".in";
    write_file(in, *stdin_text);
  }
  const std::string cmd = std::string(DSV4_EXE) + " " + args + " <" + in + " >" + base + ".out 2>" + base + ".err";
  const int rc = std::system(cmd.c_str());
  Result r;
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  // Whatever the command, it must not crash (sanitizer builds report here too).
  EXPECT_EQ(r.err.find("Sanitizer"), std::string::npos) << args << "\n" << r.err;
  EXPECT_EQ(r.err.find("runtime error:"), std::string::npos) << args << "\n" << r.err;
  EXPECT_EQ(r.err.find("assertion failed"), std::string::npos) << args << "\n" << r.err;
  EXPECT_LT(r.status, 128) << args << " died of a signal\n" << r.err;
  return r;
}

const std::string& tiny() {
  static const std::string path = [] {
    const std::string p = scratch() + "/tiny.gguf";
    const std::string cmd = std::string(DSV4_EXE) + " synth --preset tiny -o " + p + " >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
    return p;
  }();
  return path;
}

// "[prompt P tokens (C cached), ... | generated G tokens, ... | finish F | ...]" from stderr.
struct Stats {
  int prompt = -1, cached = -1, generated = -1;
  std::string finish;
};
Stats stats_of(const std::string& err) {
  static const std::regex re(
      R"(\[prompt (\d+) tokens \((\d+) cached\), prefill [^|]*\| generated (\d+) tokens, decode [^|]*\| finish (\w+) \| context \d+/\d+[^\]]*\])");
  std::smatch m;
  Stats s;
  if (std::regex_search(err, m, re)) {
    s.prompt = std::stoi(m[1]);
    s.cached = std::stoi(m[2]);
    s.generated = std::stoi(m[3]);
    s.finish = m[4];
  }
  return s;
}

std::string run_tiny(const std::string& args) { return "run -m " + tiny() + " " + args; }

}  // namespace

TEST(CliRun, StreamsExactlyNTokensWithIgnoreEos) {
  Result r = run_dsv4(run_tiny("-p hello -n 20 --ignore-eos --seed 1"));
  ASSERT_EQ(r.status, 0) << r.err;
  const Stats s = stats_of(r.err);
  EXPECT_EQ(s.generated, 20) << r.err;
  EXPECT_EQ(s.finish, "length");
  EXPECT_GT(s.prompt, 0);
  EXPECT_TRUE(dsv4::utf8_valid(r.out));
  EXPECT_FALSE(r.out.empty());
  // The effective options are printed at start.
  EXPECT_NE(r.err.find("thinking=high (--think)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("seed=1 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("max_tokens=20"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ctx=32768"), std::string::npos) << r.err;
}

TEST(CliRun, AtMostNTokensWhenEosCounts) {
  for (int seed : {1, 2, 3}) {
    Result r = run_dsv4(run_tiny("-p hello -n 20 --seed " + std::to_string(seed)));
    ASSERT_EQ(r.status, 0) << r.err;
    const Stats s = stats_of(r.err);
    EXPECT_GE(s.generated, 1);
    EXPECT_LE(s.generated, 20);
    EXPECT_TRUE(dsv4::utf8_valid(r.out));
  }
}

TEST(CliRun, SameSeedSameReplyAndStdinEqualsDashP) {
  Result a = run_dsv4(run_tiny("-p 'tell me a story' -n 12 --ignore-eos --seed 7 --nothink"));
  Result b = run_dsv4(run_tiny("-n 12 --ignore-eos --seed 7 --nothink"), std::string("tell me a story\n"));
  write_file(scratch() + "/prompt.txt", "tell me a story\n");
  Result c = run_dsv4(run_tiny("--prompt-file " + scratch() + "/prompt.txt -n 12 --ignore-eos --seed 7 --nothink"));
  Result d = run_dsv4(run_tiny("-p 'tell me a story' -n 12 --ignore-eos --seed 8 --nothink"));
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_EQ(a.out, c.out);
  EXPECT_EQ(stats_of(a.err).prompt, stats_of(b.err).prompt);
  EXPECT_NE(a.out, d.out);  // another seed, another reply
}

TEST(CliRun, ThinkingModes) {
  Result think = run_dsv4(run_tiny("-p hi -n 8 --ignore-eos --seed 3 --think"));
  Result none = run_dsv4(run_tiny("-p hi -n 8 --ignore-eos --seed 3 --nothink"));
  Result max = run_dsv4(run_tiny("-p hi -n 8 --ignore-eos --seed 3 --think-max"));
  Result dflt = run_dsv4(run_tiny("-p hi -n 8 --ignore-eos --seed 3"));
  for (const Result* r : {&think, &none, &max, &dflt}) ASSERT_EQ(r->status, 0) << r->err;
  // Thinking output is fenced; chat mode has no reasoning section.
  EXPECT_TRUE(think.out.starts_with("[thinking]\n")) << think.out;
  EXPECT_EQ(none.out.find("[thinking]"), std::string::npos) << none.out;
  EXPECT_EQ(dflt.out, think.out);  // thinking is the default
  // BOS U hi A <think> vs </think>: same length; Think-Max adds its prefix.
  EXPECT_EQ(stats_of(none.err).prompt, stats_of(think.err).prompt);
  EXPECT_GT(stats_of(max.err).prompt, stats_of(think.err).prompt + 50);
  EXPECT_NE(max.err.find("at least 393216 tokens for Think-Max"), std::string::npos) << max.err;
  // Two modes at once are refused.
  Result both = run_dsv4(run_tiny("-p hi --think --nothink"));
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
}

TEST(CliRun, SystemPromptAndItsDs4Spelling) {
  Result plain = run_dsv4(run_tiny("-p hi -n 2 --seed 1"));
  Result sys = run_dsv4(run_tiny("-sys 'You are terse.' -p hi -n 2 --seed 1"));
  Result sys2 = run_dsv4(run_tiny("--system 'You are terse.' -p hi -n 2 --seed 1"));
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(sys.status, 0) << sys.err;
  ASSERT_EQ(sys2.status, 0) << sys2.err;
  EXPECT_GT(stats_of(sys.err).prompt, stats_of(plain.err).prompt);
  EXPECT_EQ(stats_of(sys.err).prompt, stats_of(sys2.err).prompt);
  EXPECT_NE(sys.err.find("system=\"You are terse.\""), std::string::npos) << sys.err;
  // As the value of -p, "-sys" is text.
  Result text = run_dsv4(run_tiny("-p -sys -n 2 --seed 1"));
  EXPECT_EQ(text.status, 0) << text.err;
}

TEST(CliRun, StopStringCutsTheReply) {
  Result full = run_dsv4(run_tiny("-p 'print the code' -n 40 --ignore-eos --nothink --temp 0"));
  ASSERT_EQ(full.status, 0) << full.err;
  // The first run of three ASCII letters after the start of the reply.
  std::smatch m;
  const std::string body = full.out.substr(1);
  ASSERT_TRUE(std::regex_search(body, m, std::regex("[A-Za-z]{3}"))) << full.out;
  const std::string stop = m.str(0);
  Result cut = run_dsv4(run_tiny("-p 'print the code' -n 40 --ignore-eos --nothink --temp 0 --stop " + stop));
  ASSERT_EQ(cut.status, 0) << cut.err;
  EXPECT_EQ(stats_of(cut.err).finish, "stop");
  std::string expect = full.out.substr(0, full.out.find(stop));
  if (!expect.empty() && expect.back() != '\n') expect += '\n';
  EXPECT_EQ(cut.out, expect);
}

TEST(CliRun, DumpLogprobsWritesTheGreedyContinuation) {
  const std::string path = scratch() + "/lp.json";
  Result r = run_dsv4(run_tiny("-p hello -n 8 --ignore-eos --nothink --dump-logprobs " + path + " --logprobs-top-k 3"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string text = slurp(path);
  EXPECT_TRUE(dsv4::utf8_valid(text));
  json j = json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << text;
  EXPECT_EQ(j["format"], "dsv4-logprobs");
  EXPECT_EQ(j["top_k"], 3);
  EXPECT_EQ(j["prompt_tokens"], stats_of(r.err).prompt);
  ASSERT_EQ(j["steps"].size(), 8u);
  for (const auto& st : j["steps"]) {
    ASSERT_TRUE(st["token"].is_number_integer());
    ASSERT_TRUE(st["text"].is_string());
    ASSERT_TRUE(st["logprob"].is_number());
    EXPECT_LE(st["logprob"].get<double>(), 0.0);
    ASSERT_EQ(st["top"].size(), 3u);
    EXPECT_EQ(st["top"][0]["token"], st["token"]);  // greedy
    EXPECT_DOUBLE_EQ(st["top"][0]["logprob"].get<double>(), st["logprob"].get<double>());
    EXPECT_GE(st["top"][0]["logprob"].get<double>(), st["top"][2]["logprob"].get<double>());
  }
  EXPECT_NE(r.err.find("temp=0"), std::string::npos) << r.err;
  // Greedy, so a second dump is identical.
  const std::string path2 = scratch() + "/lp2.json";
  Result r2 =
      run_dsv4(run_tiny("-p hello -n 8 --ignore-eos --nothink --dump-logprobs " + path2 + " --logprobs-top-k 3"));
  ASSERT_EQ(r2.status, 0) << r2.err;
  EXPECT_EQ(slurp(path2), text);
  // Needs a prompt.
  Result none = run_dsv4(run_tiny("--dump-logprobs " + path2), std::string(""));
  EXPECT_NE(none.status, 0);
}

TEST(CliRun, CtrlCStopsAOneShotReply) {
  // An endless reply (no EOS, no limit, large context), interrupted once it streams.
  const std::string base = scratch() + "/sigint";
  const std::string script = std::string(DSV4_EXE) + " run -m " + tiny() + " -p hi -n 0 --ignore-eos --nothink >" +
                             base + ".out 2>" + base + ".err & pid=$!; " + "for i in $(seq 200); do [ -s " + base +
                             ".out ] && break; sleep 0.05; done; " + "kill -INT $pid; wait $pid; echo $? >" + base +
                             ".rc";
  ASSERT_EQ(std::system(("sh -c '" + script + "'").c_str()), 0);
  EXPECT_EQ(slurp(base + ".rc"), "130\n") << slurp(base + ".err");
  const std::string err = slurp(base + ".err");
  EXPECT_NE(err.find("[interrupted]"), std::string::npos) << err;
  EXPECT_EQ(stats_of(err).finish, "cancelled") << err;
  EXPECT_TRUE(dsv4::utf8_valid(slurp(base + ".out")));
}

TEST(CliRun, MissingOrWrongModelFiles) {
  Result missing = run_dsv4("run -m " + scratch() + "/nope.gguf -p hi");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("not found"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("dsv4 synth --preset tiny"), std::string::npos) << missing.err;
  EXPECT_NE(missing.err.find("huggingface.co"), std::string::npos) << missing.err;
  write_file(scratch() + "/text.gguf", "this is not a model\n");
  Result text = run_dsv4("run -m " + scratch() + "/text.gguf -p hi");
  EXPECT_EQ(text.status, 1);
  EXPECT_NE(text.err.find("not a GGUF file"), std::string::npos) << text.err;
  Result no_model = run_dsv4("run -p hi");
  EXPECT_EQ(no_model.status, 1);
  EXPECT_NE(no_model.err.find("no model given"), std::string::npos) << no_model.err;
  EXPECT_NE(no_model.err.find("dsv4 synth --preset tiny"), std::string::npos) << no_model.err;
}

TEST(CliRun, MtpProposalsLeaveTheReplyAsItIs) {
  const std::string mtp = scratch() + "/tiny-mtp.gguf";
  ASSERT_EQ(std::system((std::string(DSV4_EXE) + " synth --preset tiny --mtp -o " + mtp + " >/dev/null 2>&1").c_str()),
            0);
  for (const std::string sampling : {"--temp 0", "--temp 0.8 --seed 5"}) {
    Result plain = run_dsv4(run_tiny("-p 'write a poem' -n 40 --ignore-eos --nothink " + sampling));
    Result spec =
        run_dsv4(run_tiny("-p 'write a poem' -n 40 --ignore-eos --nothink --mtp " + mtp + " --draft 3 " + sampling));
    ASSERT_EQ(plain.status, 0) << plain.err;
    ASSERT_EQ(spec.status, 0) << spec.err;
    EXPECT_EQ(spec.out, plain.out) << sampling;
    EXPECT_EQ(stats_of(spec.err).generated, 40) << spec.err;
    EXPECT_NE(spec.err.find("proposed tokens per pass"), std::string::npos) << spec.err;
    EXPECT_TRUE(std::regex_search(spec.err, std::regex(R"(\| accepted \d+/\d+ proposed, [0-9.]+ tokens/pass\])")))
        << spec.err;
  }
  Result big = run_dsv4(run_tiny("-p hi --mtp " + mtp + " --draft 99"));
  EXPECT_NE(big.status, 0);
  EXPECT_NE(big.err.find("--draft must be between 0 and 15"), std::string::npos) << big.err;
}

TEST(CliRun, BadFlagValuesAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--temp -1", "--temp"},
      {"--temp abc", "--temp"},
      {"--top-p 0", "--top-p"},
      {"--top-p 1.5", "--top-p"},
      {"--top-k -3", "--top-k"},
      {"--min-p 2", "--min-p"},
      {"--repeat-penalty 0", "--repeat-penalty"},
      {"--presence-penalty 9", "--presence-penalty"},
      {"-n -1", "-n"},
      {"--ctx 1", "--ctx"},
      {"--threads -2", "--threads"},
      {"--batch -1", "--batch"},
      {"--backend tpu", "--backend"},
      {"--numerics fp8", "--numerics"},
      {"--logprobs-top-k 1000 --dump-logprobs x.json", "--logprobs-top-k"},
      {"--stop ''", "--stop"},
      {"--no-such-flag", "no-such-flag"},
      {"--gemm-min-tokens 1", "--gemm-min-tokens"},
      {"--expert-gemm fast", "--expert-gemm"},
      {"--expert-gemm 0", "--expert-gemm"},
      {"--draft 2", "--draft needs a drafter"},
      {"--draft-margin -1", "--draft-margin"},
  };
  for (const auto& [flags, mention] : cases) {
    Result r = run_dsv4(run_tiny("-p hi " + flags));
    EXPECT_NE(r.status, 0) << flags;
    EXPECT_NE(r.err.find(mention), std::string::npos) << flags << "\n" << r.err;
  }
  Result no_file = run_dsv4(run_tiny("--prompt-file /nonexistent/p.txt"));
  EXPECT_EQ(no_file.status, 1);
  EXPECT_NE(no_file.err.find("prompt file /nonexistent/p.txt not found"), std::string::npos) << no_file.err;
  Result both = run_dsv4(run_tiny("-p hi --prompt-file x.txt"));
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
  Result empty = run_dsv4(run_tiny(""), std::string("\n"));
  EXPECT_NE(empty.status, 0);
  EXPECT_NE(empty.err.find("the prompt is empty"), std::string::npos) << empty.err;
}

TEST(CliRun, ContextOverflowIsExplained) {
  std::string long_prompt;
  for (int i = 0; i < 40; ++i) long_prompt += "word ";
  Result r = run_dsv4(run_tiny("--ctx 16 -n 4"), long_prompt);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(the prompt has \d+ tokens but the context holds 16)"))) << r.err;
  // A context the model cannot hold is refused by the engine with its range.
  Result huge = run_dsv4(run_tiny("--ctx 99999999 -p hi"));
  EXPECT_EQ(huge.status, 1);
  EXPECT_NE(huge.err.find("out of range"), std::string::npos) << huge.err;
  // A reply that fills the context stops there.
  Result full = run_dsv4(run_tiny("--ctx 24 -p hi -n 100 --ignore-eos --nothink"));
  ASSERT_EQ(full.status, 0) << full.err;
  EXPECT_EQ(stats_of(full.err).finish, "length");
  EXPECT_NE(full.err.find("is full"), std::string::npos) << full.err;
}

TEST(CliRun, HelpListsTheFlagsAndCommands) {
  Result r = run_dsv4("run --help");
  EXPECT_EQ(r.status, 0);
  for (const char* flag : {"--prompt-file",
                           "--system",
                           "--nothink",
                           "--think-max",
                           "--temp",
                           "--top-p",
                           "--top-k",
                           "--min-p",
                           "--seed",
                           "--max-tokens",
                           "--ctx",
                           "--repeat-penalty",
                           "--presence-penalty",
                           "--frequency-penalty",
                           "--stop",
                           "--backend",
                           "--threads",
                           "--numerics",
                           "--mtp",
                           "--dump-logprobs",
                           "--logprobs-top-k",
                           "--no-color",
                           "--ignore-eos",
                           "/save FILE",
                           "/nothink",
                           "CUDA:",
                           "--no-tensor-cores",
                           "--no-int-dot",
                           "--no-int8-matvec",
                           "--no-int8-tiles",
                           "--act-quant-fusion",
                           "--no-token-matvec",
                           "--cublas",
                           "--gemm-min-tokens",
                           "--ffma-max-tokens",
                           "--no-cuda-branches",
                           "--no-cuda-graphs",
                           "--no-pdl",
                           "--expert-gemm",
                           "--no-expert-gemm-codes",
                           "--gpu-memory",
                           "--gpus",
                           "--no-expert-gather",
                           "--cpu-experts",
                           "--stream-experts",
                           "--expert-stats"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag;
}

TEST(CliRun, SynthHelpNamesEveryPreset) {
  // --preset's help is built from the preset table, so it names every preset --list-presets lists.
  const Result list = run_dsv4("synth --list-presets");
  ASSERT_EQ(list.status, 0) << list.err;
  const Result help = run_dsv4("synth --help");
  ASSERT_EQ(help.status, 0) << help.err;
  const size_t at = help.out.find("--preset");
  ASSERT_NE(at, std::string::npos) << help.out;
  const std::string line = help.out.substr(at, help.out.find('\n', at) - at) + " ";
  std::istringstream in(list.out);
  int n = 0;
  for (std::string row; std::getline(in, row);) {
    const std::string name = row.substr(0, row.find(' '));
    if (name.empty()) continue;
    ++n;
    EXPECT_NE(line.find(" " + name + " "), std::string::npos) << name << " missing from: " << line;
  }
  EXPECT_GE(n, 8);
}

TEST(CliRun, CudaSwitchesAreAcceptedAndPrinted) {
  // The CPU backend ignores them; the options line at start names the ones that differ from the defaults.
  Result r = run_dsv4(run_tiny(
      "-p hi -n 2 --ignore-eos --no-int-dot --no-int8-matvec --no-int8-tiles --act-quant-fusion all --no-token-matvec "
      "--cublas off --gemm-min-tokens 64 "
      "--ffma-max-tokens 8 --no-cuda-graphs --no-pdl --expert-gemm off --no-expert-gemm-codes "
      "--gpu-memory 24G --no-expert-gather --cpu-experts 0.25 --stream-experts off"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("int_dot=off int8_matvec=off int8_tiles=off act_quant_fusion=all token_matvec=off cublas=off "
                       "gemm_min_tokens=64 "
                       "ffma_max_tokens=8 "
                       "graphs=off pdl=off "
                       "expert_gemm=off expert_gemm_codes=off"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("expert_gather=off gpu_memory=24.00GiB cpu_experts=0.25 stream_experts=off"), std::string::npos)
      << r.err;
}

TEST(CliRun, ExpertStatsAreCountedAndMergedIntoTheFile) {
  // --expert-stats FILE: written at exit with every routed assignment of the run (tokens x k per layer);
  // a second run reads it at load and adds its own; a file of another shape or a damaged one is refused.
  const std::string path =
      (std::filesystem::temp_directory_path() / ("dsv4_cli_stats_" + std::to_string(::getpid()))).string();
  std::filesystem::remove(path);
  auto total = [&] {
    std::ifstream in(path);
    std::string line;
    uint64_t sum = 0;
    for (int i = 0; std::getline(in, line); ++i) {
      if (i < 2) continue;
      std::istringstream ls(line);
      uint64_t v = 0;
      ls >> v;  // the layer index
      while (ls >> v) sum += v;
    }
    return sum;
  };
  Result r = run_dsv4(run_tiny("-p hello -n 4 --ignore-eos --seed 1 --expert-stats " + path));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("routing statistics:"), std::string::npos) << r.err;
  const uint64_t first = total();
  EXPECT_GT(first, 0u);
  r = run_dsv4(run_tiny("-p hello -n 4 --ignore-eos --seed 1 --expert-stats " + path));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(total(), 2 * first);
  {
    std::ofstream out(path);
    out << "dsv4-expert-stats 1\nlayers 1 experts 2\n0 5 6\n";
  }
  r = run_dsv4(run_tiny("-p hello -n 2 --expert-stats " + path));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("routing statistics of a model with 1 layers x 2 routed experts"), std::string::npos) << r.err;
  {
    std::ofstream out(path);
    out << "dsv4-expert-stats 1\nlayers 1 experts 2\n0 5\n";
  }
  r = run_dsv4(run_tiny("-p hello -n 2 --expert-stats " + path));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("line 3: expected 2 counts, found 1"), std::string::npos) << r.err;
  std::filesystem::remove(path);
}

TEST(CliRun, EngineChoicesAreParsedWithClearErrors) {
  // --backend, --numerics and the CUDA switches are typed when the command line is read: a bad value
  // is refused before the model loads, naming the flag and what it accepts.
  const std::pair<const char*, const char*> cases[] = {
      {"--backend tpu", "--backend: unknown backend \"tpu\" (expected auto, cpu or cuda)"},
      {"--numerics fp4", "--numerics: unknown numerics \"fp4\" (expected reference, plain or fast)"},
      {"--expert-gemm 0", "--expert-gemm: want auto, on, off or a whole number from 1 to 1000000, got \"0\""},
      {"--dup-ops matmul,hc_post", "--dup-ops: cannot launch op \"hc_post\" twice"},
      {"--cublas ''", "--cublas: empty (want auto, off or the path of libcublas)"},
      {"--gpu-memory 12X", "--gpu-memory 12X: want auto or a size such as 24G, 24GiB, 40960M (a plain number: GiB)"},
      {"--gpu-memory 0.5G", "--gpu-memory 0.5G: at least 1 GiB"},
      {"--cpu-experts 1.5", "--cpu-experts 1.5: want auto, off or a share from 0 to 1 (such as 0.4)"},
      {"--cpu-experts half", "--cpu-experts half: want auto, off or a share from 0 to 1 (such as 0.4)"},
      {"--gpus 0,0", "--gpus 0,0: device 0 twice"},
      {"--stream-experts yes", "--stream-experts yes: want auto, on or off"},
      {"--gpus one", "--gpus one: want all or device indices such as 0,1"},
  };
  for (const auto& [flag, message] : cases) {
    Result r = run_dsv4("run -m /nonexistent.gguf -p hi " + std::string(flag));
    EXPECT_NE(r.status, 0) << flag;
    EXPECT_NE(r.err.find(message), std::string::npos) << flag << "\n" << r.err;
  }
  // A layer split over GPUs on the CPU backend is refused at load, naming the way.
  Result g = run_dsv4(run_tiny("-p hi -n 2 --backend cpu --gpus 0,1"));
  EXPECT_NE(g.status, 0);
  EXPECT_NE(g.err.find("--gpus needs --backend cuda or auto"), std::string::npos) << g.err;
  // The parsed values reach the engine: plain numerics is what the options line and the engine report.
  Result r = run_dsv4(run_tiny("-p hi -n 2 --ignore-eos --numerics plain --backend cpu"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("backend=cpu numerics=plain"), std::string::npos) << r.err;
}

TEST(CliTokenize, IdsAndPieces) {
  Result r = run_dsv4("tokenize -m " + tiny() + " 'hello world'");
  ASSERT_EQ(r.status, 0) << r.err;
  // One "  id  "piece"" line per token, then "N tokens: ids".
  std::istringstream in(r.out);
  std::string line, joined;
  std::vector<std::string> ids;
  std::string summary;
  static const std::regex piece_re(R"re(^\s*(\d+)  "(.*)"$)re");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, piece_re)) {
      ids.push_back(m[1]);
      joined += m[2];
    } else {
      summary = line;
    }
  }
  EXPECT_EQ(joined, "hello world");
  ASSERT_FALSE(ids.empty());
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ",") + id;
  EXPECT_EQ(summary, std::to_string(ids.size()) + " tokens: " + list);
  // Text on stdin gives the same.
  Result s = run_dsv4("tokenize -m " + tiny(), std::string("hello world"));
  EXPECT_EQ(s.out, r.out);
}

TEST(CliTokenize, SpecialsAndErrors) {
  Result plain = run_dsv4("tokenize -m " + tiny() + " '<｜User｜>hi'");
  Result specials = run_dsv4("tokenize --specials -m " + tiny() + " '<｜User｜>hi'");
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(specials.status, 0) << specials.err;
  EXPECT_NE(specials.out.find("\"<｜User｜>\"\n"), std::string::npos) << specials.out;
  EXPECT_EQ(plain.out.find("\"<｜User｜>\"\n"), std::string::npos) << plain.out;
  Result no_model = run_dsv4("tokenize hello");
  EXPECT_EQ(no_model.status, 1);
  EXPECT_NE(no_model.err.find("a model is needed for its vocabulary"), std::string::npos) << no_model.err;
  Result missing = run_dsv4("tokenize -m " + scratch() + "/nope.gguf hello");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("dsv4 synth --preset tiny"), std::string::npos) << missing.err;
}

TEST(CliRender, TokensMatchTheRenderedTextsSpecials) {
  const std::string msgs = scratch() + "/msgs.json";
  write_file(msgs, R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}])");
  for (const char* mode : {"chat", "thinking"}) {
    Result text = run_dsv4(std::string("render --messages ") + msgs + " --thinking-mode " + mode);
    ASSERT_EQ(text.status, 0) << text.err;
    Result ids =
        run_dsv4(std::string("render --tokens -m ") + tiny() + " --messages " + msgs + " --thinking-mode " + mode);
    ASSERT_EQ(ids.status, 0) << ids.err;
    // The message texts hold no special-token strings, so tokenizing the
    // rendered text with specials gives the same ids.
    Result tok = run_dsv4("tokenize --specials -m " + tiny(), text.out);
    ASSERT_EQ(tok.status, 0) << tok.err;
    const std::string summary = tok.out.substr(tok.out.rfind(" tokens: ") + 9);
    EXPECT_EQ(ids.out, summary) << mode;
    EXPECT_TRUE(ids.out.starts_with("0,")) << ids.out;  // BOS is id 0 in the tiny vocabulary
  }
  Result no_model = run_dsv4("render --tokens --messages " + msgs);
  EXPECT_EQ(no_model.status, 1);
  EXPECT_NE(no_model.err.find("--tokens needs -m"), std::string::npos) << no_model.err;
}

TEST(CliRun, KvDiskCacheCarriesAPromptAcrossRuns) {
  // The runtime's disk cache under `run`: the first run saves the prompt's
  // prefix (the cold save point), the second restores it instead of
  // prefilling, and the reply is the same.
  const std::string dir = scratch() + "/kv-run";
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "the quick brown fox " + std::to_string(i) + " ";
  write_file(scratch() + "/kv-prompt.txt", prompt);
  const std::string args = run_tiny("--prompt-file " + scratch() +
                                    "/kv-prompt.txt --nothink -n 6 --ignore-eos --seed 3 "
                                    "--kv-disk-dir " +
                                    dir + " --kv-cache-min-tokens 8 --kv-cache-align 8");
  Result first = run_dsv4(args);
  ASSERT_EQ(first.status, 0) << first.err;
  EXPECT_NE(first.err.find("KV disk cache " + dir), std::string::npos) << first.err;
  EXPECT_EQ(stats_of(first.err).cached, 0) << first.err;
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.path().extension() == ".kv";
  EXPECT_GE(files, 1u);

  Result second = run_dsv4(args);
  ASSERT_EQ(second.status, 0) << second.err;
  const Stats s = stats_of(second.err);
  EXPECT_GT(s.cached, 0) << second.err;
  EXPECT_EQ(s.prompt, stats_of(first.err).prompt);
  EXPECT_EQ(second.out, first.out);  // restored state == prefilled state (bitwise numerics)
}

TEST(CliRun, ThinkingBudgetEndsTheReasoning) {
  // After 3 reasoning tokens </think> is forced and the answer follows: 3 + 1 + 8 = 12 tokens.
  Result r = run_dsv4(run_tiny("-p hello --thinking-budget 3 -n 12 --ignore-eos --seed 1"));
  ASSERT_EQ(r.status, 0) << r.err;
  const Stats s = stats_of(r.err);
  EXPECT_EQ(s.generated, 12) << r.err;
  EXPECT_EQ(r.err.find("ended inside the reasoning"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("thinking_budget=3"), std::string::npos) << r.err;

  Result bad = run_dsv4(run_tiny("-p hello --thinking-budget 3 --nothink"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.err.find("--thinking-budget needs a thinking mode"), std::string::npos) << bad.err;
}

TEST(CliPull, DownloadsChecksAndListsPublishedFiles) {
  // A local server in place of the published repository: q2's name serves the tiny model, mxfp4's some bytes
  // that are not a GGUF.
  const std::string model = slurp(tiny());
  httplib::Server server;
  server.Get("/" + std::string(dsv4::find_published("q2")->file), [&](const httplib::Request&, httplib::Response& res) {
    res.set_content(model, "application/octet-stream");
  });
  server.Get("/" + std::string(dsv4::find_published("mxfp4")->file),
             [](const httplib::Request&, httplib::Response& res) { res.set_content("not a model", "text/plain"); });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread t([&] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string dir = scratch() + "/pulled";
  const std::string base = " --base-url http://127.0.0.1:" + std::to_string(port) + "/ -o " + dir;
  std::filesystem::create_directories(dir);
  Result r = run_dsv4("pull q2" + base);
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string path = dir + "/" + dsv4::find_published("q2")->file;
  EXPECT_EQ(slurp(path), model);
  r = run_dsv4("pull q2" + base);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("is already here"), std::string::npos) << r.out;
  r = run_dsv4("pull mxfp4" + base);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("is not a valid GGUF"), std::string::npos) << r.err;
  r = run_dsv4("pull q5" + base);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unknown file \"q5\" (published: q2, q2-q4"), std::string::npos) << r.err;
  r = run_dsv4("pull --list");
  EXPECT_EQ(r.status, 0);
  for (const dsv4::PublishedFile& f : dsv4::published_files()) EXPECT_NE(r.out.find(f.file), std::string::npos);
  server.stop();
  t.join();
}

TEST(CliRun, RawPromptContinuesTheTextWithoutTheTemplate) {
  // The prompt is exactly the tokenizer's tokens of the text ("hello world": as many as dsv4 tokenize lists),
  // where the chat template would add its markers; -c is --ctx.
  Result t = run_dsv4("tokenize -m " + tiny() + " 'hello world'");
  ASSERT_EQ(t.status, 0) << t.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(t.out, m, std::regex(R"((\d+) tokens: )"))) << t.out;  // the summary line
  const int n_tokens = std::stoi(m[1]);
  ASSERT_GT(n_tokens, 0);
  Result r = run_dsv4(run_tiny("--raw-prompt -p 'hello world' -n 4 --ignore-eos --seed 3 -c 300"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(stats_of(r.err).prompt, n_tokens) << r.err;
  EXPECT_EQ(stats_of(r.err).generated, 4) << r.err;
  EXPECT_NE(r.err.find("ctx=300"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("raw_prompt=yes"), std::string::npos) << r.err;
  Result chat = run_dsv4(run_tiny("-p 'hello world' -n 4 --ignore-eos --seed 3 --nothink"));
  ASSERT_EQ(chat.status, 0) << chat.err;
  EXPECT_GT(stats_of(chat.err).prompt, n_tokens) << chat.err;
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--raw-prompt -n 2", "--raw-prompt needs -p TEXT or --prompt-file FILE"},
           {"--raw-prompt -p hi --system be-brief", "no --system"},
           {"--raw-prompt -p hi --think", "no thinking mode"}}) {
    Result e = run_dsv4(run_tiny(flags));
    EXPECT_NE(e.status, 0) << flags;
    EXPECT_NE(e.err.find(message), std::string::npos) << flags << "\n" << e.err;
  }
}
