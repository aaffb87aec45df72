// dsv4 run: chat with a model from the terminal. One-shot with a prompt
// (-p, --prompt-file, or stdin when it is not a terminal), interactive
// otherwise (run_repl.h). The reply streams to stdout; options, progress and
// statistics go to stderr.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>

#include "commands.h"
#include "engine_flags.h"
#include "kv_cache_flags.h"
#include "conversation/logprobs_json.h"
#include "chat/thinking.h"
#include "dsv4/engine.h"
#include "model/model_file.h"
#include "run_chat.h"
#include "run_interrupt.h"
#include "run_output.h"
#include "run_repl.h"
#include "util.h"

namespace dsv4::tools {

namespace {

// The flags as given (CLI11 fills these), before validation.
struct RunArgs {
  std::string model;
  SpeculationArgs spec;
  BackendChoice backend = BackendChoice::AUTO;
  Numerics numerics = Numerics::REFERENCE;
  int threads = 0, batch = 0;  // 0: the backend's default
  uint32_t ctx = 32768;
  std::string prompt, prompt_file, system;
  bool prompt_given = false;  // -p was used (possibly with an empty text)
  bool raw_prompt = false;
  bool nothink = false, think = false, think_max = false;
  float temp = 1.0f, top_p = 1.0f, min_p = 0.05f;
  int top_k = 0;
  float repeat_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  int64_t seed = -1;
  int max_tokens = 0;
  int thinking_budget = -1;
  runtime::KvCacheOptions cache;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string dump_logprobs;
  int logprobs_top_k = 5;
  bool no_color = false;
  std::string expert_stats;
  CudaOptions cuda;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "dsv4 run: error: %s\n", message.c_str());
  return 1;
}

// Flag values the engine would reject later (or not at all): checked before
// the model loads.
Status validate(const RunArgs& a) {
  auto finite = [](float v) { return std::isfinite(v); };
  if (!finite(a.temp) || a.temp < 0)
    return make_error("--temp must be a number >= 0 (got %g)", static_cast<double>(a.temp));
  if (!finite(a.top_p) || a.top_p <= 0 || a.top_p > 1)
    return make_error("--top-p must be in (0, 1] (got %g)", static_cast<double>(a.top_p));
  if (a.top_k < 0) return make_error("--top-k must be >= 0 (0 = off; got %d)", a.top_k);
  if (!finite(a.min_p) || a.min_p < 0 || a.min_p > 1)
    return make_error("--min-p must be in [0, 1] (got %g)", static_cast<double>(a.min_p));
  if (!finite(a.repeat_penalty) || a.repeat_penalty <= 0)
    return make_error("--repeat-penalty must be > 0 (1 = off; got %g)", static_cast<double>(a.repeat_penalty));
  if (!finite(a.presence_penalty) || std::fabs(a.presence_penalty) > 2)
    return make_error("--presence-penalty must be in [-2, 2] (got %g)", static_cast<double>(a.presence_penalty));
  if (!finite(a.frequency_penalty) || std::fabs(a.frequency_penalty) > 2)
    return make_error("--frequency-penalty must be in [-2, 2] (got %g)", static_cast<double>(a.frequency_penalty));
  if (a.max_tokens < 0) return make_error("-n must be >= 0 (0 = until the end of the reply; got %d)", a.max_tokens);
  if (a.thinking_budget < -1)
    return make_error("--thinking-budget must be >= 0 (or -1 for none; got %d)", a.thinking_budget);
  if (a.thinking_budget >= 0 && a.nothink) return make_error("--thinking-budget needs a thinking mode, not --nothink");
  DSV4_TRY(check_kv_cache_options(a.cache));
  if (a.ctx < 2) return make_error("--ctx must be at least 2 tokens (got %u)", a.ctx);
  if (a.threads < 0) return make_error("--threads must be >= 0 (0 = all cores; got %d)", a.threads);
  if (a.batch < 0 || a.batch > 65536)
    return make_error("--batch must be in [1, 65536], or 0 for the default (got %d)", a.batch);
  if (a.logprobs_top_k < 0 || a.logprobs_top_k > 100)
    return make_error("--logprobs-top-k must be in [0, 100] (got %d)", a.logprobs_top_k);
  for (const auto& s : a.stop)
    if (s.empty()) return make_error("--stop needs a non-empty string");
  if (a.prompt_given && !a.prompt_file.empty()) return make_error("give either -p or --prompt-file, not both");
  if (a.raw_prompt) {
    if (!a.prompt_given && a.prompt_file.empty())
      return make_error("--raw-prompt needs -p TEXT or --prompt-file FILE (the model continues that text)");
    if (!a.system.empty()) return make_error("--raw-prompt sends the text as it is: no --system");
    if (a.think || a.think_max || a.thinking_budget >= 0)
      return make_error(
          "--raw-prompt has no chat template, so no thinking mode (--think, --think-max, "
          "--thinking-budget)");
  }
  return {};
}

expected<RunSettings> settings_from(const RunArgs& a) {
  DSV4_TRY(validate(a));
  RunSettings s;
  s.engine.model_path = a.model;
  a.spec.apply(s.engine);
  DSV4_TRY_ASSIGN(s.draft, a.spec.draft_in_effect());
  s.draft_margin = a.spec.margin;
  s.engine.backend = a.backend;
  s.engine.numerics = a.numerics;
  s.engine.ctx = a.ctx;
  s.engine.threads = a.threads;
  s.engine.prefill_batch = a.batch;
  s.engine.expert_stats = a.expert_stats;
  s.engine.cuda = cuda_options_for(a.cuda);
  s.engine.show_progress = false;  // the engine draws nothing while loading; LoadIndicator does
  s.thinking = a.nothink || a.raw_prompt ? ThinkingLevel::NONE : a.think_max ? ThinkingLevel::MAX : ThinkingLevel::HIGH;
  s.raw_prompt = a.raw_prompt;
  s.system = a.system;
  s.sampling = recommended_sampling(s.thinking);
  s.sampling.temperature = a.temp;
  s.sampling.top_p = a.top_p;
  s.sampling.top_k = a.top_k;
  s.sampling.min_p = a.min_p;
  s.sampling.repetition_penalty = a.repeat_penalty;
  s.sampling.presence_penalty = a.presence_penalty;
  s.sampling.frequency_penalty = a.frequency_penalty;
  if (a.seed >= 0) {
    s.sampling.seed = static_cast<uint64_t>(a.seed);
  } else {
    std::random_device rd;
    s.sampling.seed = (static_cast<uint64_t>(rd()) << 32 | rd()) & 0x7fffffffffffffffull;
  }
  s.max_tokens = a.max_tokens;
  s.thinking_budget = a.thinking_budget;
  s.cache = a.cache;
  s.stop = a.stop;
  s.ignore_eos = a.ignore_eos;
  s.dump_logprobs = a.dump_logprobs;
  s.logprobs_top_k = a.logprobs_top_k;
  if (!s.dump_logprobs.empty()) s.sampling.temperature = 0;  // the dump is of the greedy continuation
  s.colors = colors_for_terminal(a.no_color);
  return s;
}

// A prompt file's text ("-": stdin) with trailing line breaks removed.
expected<std::string> read_prompt(const std::string& path) {
  std::string text;
  if (path == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return make_error("prompt file %s not found", path.c_str());
    if (S_ISDIR(st.st_mode)) return make_error("prompt file %s is a directory", path.c_str());
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error("cannot open prompt file %s", path.c_str());
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

int write_logprobs(const RunSettings& s, const ChatSession& chat, const GenerateResult& r) {
  LogprobDump d;
  d.model = chat.engine().info().model_name;
  d.prompt_tokens = r.prompt_tokens;
  d.top_k = s.logprobs_top_k;
  d.finish = finish_reason_name(r.finish);
  d.steps = r.logprobs;
  if (auto st = logprobs_write_file(s.dump_logprobs, d, chat.engine().tokenizer()); !st)
    return fail(st.error().message);
  std::fprintf(stderr, "dsv4 run: wrote %zu logprob steps (top %d) to %s\n", d.steps.size(), d.top_k,
               s.dump_logprobs.c_str());
  return 0;
}

int run_run(const RunArgs& a) {
  if (a.model.empty()) return fail(strfmt("no model given: use -m FILE.gguf; %s", k_model_help));
  auto settings = settings_from(a);
  if (!settings) return fail(settings.error().message);
  const RunSettings& s = *settings;

  // Where the prompt comes from: -p, --prompt-file, stdin when it is not a
  // terminal; otherwise the interactive chat.
  std::optional<std::string> prompt;
  if (a.prompt_given) {
    prompt = a.prompt;
  } else if (!a.prompt_file.empty()) {
    auto text = read_prompt(a.prompt_file);
    if (!text) return fail(text.error().message);
    prompt = std::move(*text);
  } else if (::isatty(0) == 0) {
    auto text = read_prompt("-");
    if (!text) return fail(text.error().message);
    prompt = std::move(*text);
  }
  if (prompt && prompt->empty())
    return fail(
        "the prompt is empty (give text with -p, --prompt-file or on stdin; no prompt on a terminal starts the chat)");
  if (!prompt && !s.dump_logprobs.empty()) return fail("--dump-logprobs needs a prompt (-p, --prompt-file or stdin)");

  Ansi err(s.colors.err);
  std::fprintf(stderr, "%sdsv4 run: %s%s\n", err.dim(), s.engine.describe().c_str(), err.reset());
  std::fprintf(stderr, "%sdsv4 run: %s%s\n", err.dim(), s.describe().c_str(), err.reset());
  if (s.thinking == ThinkingLevel::MAX && s.engine.ctx < k_think_max_min_ctx)
    std::fprintf(
        stderr, "dsv4 run: note: the model card asks for a context of at least %u tokens for Think-Max (--ctx is %u)\n",
        k_think_max_min_ctx, s.engine.ctx);
  if (!s.dump_logprobs.empty())
    std::fprintf(stderr, "dsv4 run: note: --dump-logprobs samples greedily (temperature 0)\n");

  std::unique_ptr<Engine> engine;
  {
    struct stat st {};
    const uint64_t size = ::stat(s.engine.model_path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    LoadIndicator indicator(strfmt("loading %s (%s)", s.engine.model_path.c_str(), human_bytes(size).c_str()),
                            ::isatty(2) != 0);
    auto loaded = Engine::load(s.engine);
    indicator.stop();
    if (!loaded) return fail(loaded.error().message);
    engine = std::move(*loaded);
  }
  const EngineInfo& info = engine->info();
  std::fprintf(stderr, "%sdsv4 run: loaded %s on %s in %.2f s; %s of weights, %s%s%s\n", err.dim(),
               info.model_name.c_str(), info.backend.c_str(), info.load_seconds, human_bytes(info.weight_bytes).c_str(),
               info.quant.c_str(),
               info.has_dspark ? strfmt("; DSpark drafter loaded: %d proposed tokens per pass", s.draft).c_str()
               : info.has_mtp  ? strfmt("; MTP block loaded: %d proposed tokens per pass", s.draft).c_str()
                               : "",
               err.reset());
  // The serving runtime with one resident session (and the disk cache, when asked for).
  runtime::BatchingOptions batching;
  batching.draft = s.draft;
  batching.draft_margin = s.draft_margin;
  auto backend = runtime::EngineBackend::create(std::move(engine), 0, s.cache, batching);
  if (!backend) return fail(backend.error().message);
  if (!s.cache.disk_dir.empty())
    std::fprintf(stderr, "%sdsv4 run: %s%s\n", err.dim(), (*backend)->describe_cache().c_str(), err.reset());
  runtime::Runtime rt(**backend, 1);
  ChatSession chat(rt, **backend, s);
  // Saves the conversation's session to the disk cache on the way out (nothing without --kv-disk-dir).
  struct Shutdown {
    runtime::Runtime& rt;
    ~Shutdown() { rt.shutdown(/*save_sessions=*/true); }
  } shutdown{rt};

  if (!prompt) return run_repl(chat, s);

  interrupt_install();
  ReplyPrinter printer(s.colors.out);
  auto r = chat.reply(*prompt, printer);
  if (!r) return fail(r.error().message);
  print_reply_report(*r, chat.session_tokens(), chat.context_size(), s.colors.err);
  if (!s.dump_logprobs.empty())
    if (int rc = write_logprobs(s, chat, *r); rc != 0) return rc;
  return r->finish == FinishReason::CANCELLED ? 130 : 0;
}

}  // namespace

std::vector<std::string> normalize_args(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2 || args[1] != "run") return args;
  // ds4 spells the system prompt flag `-sys`; CLI11 knows only one-letter
  // short options, so it becomes --system (unless it is the value of a
  // flag that takes text).
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& prev = args[i - 1];
    const bool is_value = prev == "-p" || prev == "--prompt" || prev == "--system" || prev == "--stop";
    if (args[i] == "-sys" && !is_value) args[i] = "--system";
  }
  return args;
}

void register_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Chat with a model: one-shot with -p / --prompt-file / stdin, interactive when no prompt is given on a terminal");
  cmd->add_option("-m,--model", a->model, "Model GGUF file")->type_name("FILE");
  CLI::Option* prompt_opt = cmd->add_option("-p,--prompt", a->prompt, "The user message (one-shot)");
  cmd->add_option("--prompt-file", a->prompt_file,
                  "Read the user message from a file (- = stdin; trailing newlines dropped)")
      ->type_name("FILE");
  cmd->add_option("--system", a->system, "System prompt (default: none; -sys works too)");
  cmd->add_flag("--raw-prompt", a->raw_prompt,
                "One-shot without the chat template: the model continues the text of -p / --prompt-file as it is "
                "(special tokens spelled in it count as such)");
  auto* nothink = cmd->add_flag("--nothink", a->nothink, "Chat mode: answer directly, no reasoning");
  auto* think = cmd->add_flag("--think", a->think, "Thinking mode: reasoning, then the answer (the default)");
  auto* think_max = cmd->add_flag("--think-max", a->think_max,
                                  "Thinking with the Think-Max prefix (maximum effort; wants --ctx >= 393216)");
  nothink->excludes(think)->excludes(think_max);
  think->excludes(think_max);
  cmd->add_option("--temp", a->temp, "Sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Nucleus sampling: keep the most likely tokens up to this mass (1 = off)")
      ->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Keep the K most likely tokens (0 = off)")->capture_default_str();
  cmd->add_option("--min-p", a->min_p, "Drop tokens below this fraction of the top probability (0 = off)")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", a->repeat_penalty, "Divide logits of recent tokens by this (1 = off)")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", a->presence_penalty, "Subtract once from logits of recent tokens")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", a->frequency_penalty, "Subtract per occurrence from logits of recent tokens")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Random seed (default: a random one, printed at start)");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "Tokens to generate per reply at most (0 = until the reply ends)")
      ->capture_default_str();
  cmd->add_option("--thinking-budget", a->thinking_budget,
                  "Reasoning tokens after which the model is made to answer (</think> is forced; -1 = no budget)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx", a->ctx, "Context size in tokens (prompt + history + reply)")->capture_default_str();
  cmd->add_option("--stop", a->stop, "Stop when this text is generated (repeatable)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past the end-of-sentence token (benchmarks, tests)");
  add_backend_flags(cmd, &a->backend, &a->numerics);
  cmd->add_option("-t,--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--batch", a->batch,
                  "Prompt tokens per forward batch; 0 = the backend's default (CUDA 4096, CPU 512)")
      ->capture_default_str();
  add_speculation_flags(cmd, &a->spec);
  cmd->add_option("--dump-logprobs", a->dump_logprobs,
                  "Write the greedy continuation with per-token logprobs and top-K alternatives to this JSON file")
      ->type_name("FILE");
  cmd->add_option("--logprobs-top-k", a->logprobs_top_k, "Alternatives per step in --dump-logprobs")
      ->capture_default_str();
  cmd->add_flag("--no-color", a->no_color, "No ANSI colours (also when NO_COLOR is set)");
  cmd->footer(std::string("Interactive chat (no prompt, stdin a terminal) ") + repl_help_text());
  add_kv_cache_flags(cmd, &a->cache, /*with_sessions=*/false);
  add_expert_stats_flag(cmd, &a->expert_stats);
  add_cuda_flags(cmd, &a->cuda);
  cmd->callback([a, prompt_opt] {
    a->prompt_given = prompt_opt->count() > 0;
    set_exit_code(run_run(*a));
  });
}

}  // namespace dsv4::tools
