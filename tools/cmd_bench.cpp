// dsv4 bench: prefill and decode speed at growing context frontiers (CSV).
//
// Loads once, walks one fixed token sequence: at each frontier it prefills the
// newly added interval (timed) and then decodes --gen-tokens tokens greedily
// with EOS ignored (timed), then rewinds to the frontier and continues.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "bench_speculation.h"
#include "commands.h"
#include "engine_flags.h"
#include "generate/generate.h"
#include "dsv4/engine.h"
#include "tokenizer/tokenizer.h"

#include "dsv4_git_version.h"  // DSV4_GIT_COMMIT, generated at build time

namespace dsv4::tools {

namespace {

struct BenchArgs : LoadArgs {
  std::string prompt_file, csv;
  double router_skew = 0;  // of --synthetic
  uint32_t ctx_start = 2048, ctx_max = 0, step_incr = 0;
  double step_mul = 2.0;
  int gen_tokens = 32;
  bool profile = false;
  int concurrency = 1;  // sessions decoding together (Engine::step)
  // --mixed-prefill T (with --concurrency N): a prompt of T tokens prefilled in
  // chunks of --mixed-chunk tokens inside the N sessions' decode steps.
  uint32_t mixed_prefill = 0;
  uint32_t mixed_chunk = 0;  // 0: a quarter of the prefill batch (dsv4 serve's --prefill-chunk default)
  int verify = 0;            // --verify K: speculative decoding's pass costs and cycle (bench_speculation.h)
  SpeculationArgs spec;      // --mtp, --dspark, --draft
};

int run_bench(const BenchArgs& a) {
  auto fail = [](const std::string& m) {
    std::fprintf(stderr, "dsv4 bench: error: %s\n", m.c_str());
    return 1;
  };
  if (a.model.empty() == a.synthetic.empty()) return fail("give either -m FILE or --synthetic PRESET");
  const uint32_t ctx_max = a.ctx_max ? a.ctx_max : a.ctx_start;
  if (a.ctx_start == 0 || ctx_max < a.ctx_start) return fail("need 0 < --ctx-start <= --ctx-max");
  if (a.step_incr == 0 && !(a.step_mul > 1.0)) return fail("--step-mul must be > 1 (or use --step-incr)");
  if (a.concurrency < 1 || a.concurrency > 1024) return fail("--concurrency must be between 1 and 1024");
  if (a.mixed_prefill > 0 && a.concurrency < 2) return fail("--mixed-prefill needs --concurrency of at least 2");
  if (a.verify > 0 && (a.concurrency > 1 || a.profile))
    return fail("--verify runs alone: no --concurrency or --profile");
  auto draft = a.spec.draft_in_effect();
  if (!draft) return fail(draft.error().message);
  EngineOptions o;
  a.apply(o);
  o.synthetic_router_skew = a.router_skew;
  a.spec.apply(o);
  // (--concurrency --profile decodes the steps twice, the second time timed op by op)
  const uint32_t decode_room = static_cast<uint32_t>(a.gen_tokens) * (a.concurrency > 1 && a.profile ? 2 : 1);
  // (--mixed-prefill: one decode step per prompt chunk; the smallest default chunk is the CPU's 512 / 4)
  const uint32_t chunk_floor =
      a.mixed_chunk > 0 ? a.mixed_chunk : static_cast<uint32_t>(default_prefill_batch(false) / 4);
  const uint32_t mixed_room = (a.mixed_prefill + chunk_floor - 1) / chunk_floor;
  o.ctx = ctx_max + decode_room + mixed_room + 1 + static_cast<uint32_t>(Session::max_verify());
  auto engine = Engine::load(o);
  if (!engine) return fail(engine.error().message);
  const EngineInfo& info = (*engine)->info();
  o.prefill_batch = info.prefill_batch;  // the header records the batch in use

  // The fixed token sequence: a prompt file's tokens repeated, or a deterministic
  // walk over ordinary (non-special) tokens.
  const Tokenizer& tok = (*engine)->tokenizer();
  std::vector<int32_t> seq;
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file);
    if (!in) return fail("cannot read " + a.prompt_file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto ids = tok.encode(text);
    if (ids.empty()) return fail("the prompt file tokenizes to nothing");
    while (seq.size() < ctx_max) seq.insert(seq.end(), ids.begin(), ids.end());
  } else {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    while (seq.size() < ctx_max) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      int32_t t = static_cast<int32_t>((x >> 33) % info.n_vocab);
      if (!tok.is_special(t)) seq.push_back(t);
    }
  }
  seq.resize(ctx_max);

  std::FILE* csv = a.csv.empty() ? nullptr : std::fopen(a.csv.c_str(), "w");
  if (!a.csv.empty() && !csv) return fail("cannot create " + a.csv);
  auto both = [&](const char* fmt, auto... args) {
    if constexpr (sizeof...(args) == 0) {  // a header line: no format
      std::fputs(fmt, stdout);
      if (csv) std::fputs(fmt, csv);
    } else {
      std::printf(fmt, args...);
      if (csv) std::fprintf(csv, fmt, args...);
    }
  };
  both("# dsv4 bench, commit %s\n", DSV4_GIT_COMMIT);
  both("# device: %s\n", info.backend.c_str());
  both("# model: %s (%s; %s)\n", info.model_path.c_str(), info.model_name.c_str(), info.quant.c_str());
  both("# options: %s gen_tokens=%d ctx_start=%u ctx_max=%u step=%s\n", o.describe().c_str(), a.gen_tokens, a.ctx_start,
       ctx_max, a.step_incr ? ("+" + std::to_string(a.step_incr)).c_str() : ("x" + std::to_string(a.step_mul)).c_str());
  both("# decode weight bytes per token: %llu\n", static_cast<unsigned long long>(info.decode_bytes_per_token));
  both("# kv state: %s rows, %.0f bytes per context token + %.1f MiB fixed\n", info.kv_rows.c_str(),
       info.kv_bytes_per_token, static_cast<double>((*engine)->session_bytes(1)) / (1 << 20));
  // With a drafter (--mtp/--dspark and --draft > 0) the sweep decodes through generate()'s speculative
  // rounds (greedy: the same tokens as plain decoding) and adds the proposals' counts.
  const bool speculate = *draft > 0;
  if (a.concurrency <= 1 && a.verify == 0)
    both(speculate ? "ctx,prefill_tokens,prefill_tps,gen_tokens,gen_tps,weight_gbps,kv_bytes,spec_passes,proposed,"
                     "accepted\n"
                   : "ctx,prefill_tokens,prefill_tps,gen_tokens,gen_tps,weight_gbps,kv_bytes\n");
  if (csv) std::fflush(csv);

  using clock = std::chrono::steady_clock;
  if (a.concurrency > 1) {
    // N sessions, each with its own token walk, prefilled to ctx_start one after the other; then
    // gen_tokens greedy steps in which every session decodes one token, all in one Engine::step.
    const size_t n = static_cast<size_t>(a.concurrency);
    std::vector<std::unique_ptr<Session>> sessions;
    double pf_seconds = 0;
    for (size_t k = 0; k < n; ++k) {
      auto ss = (*engine)->new_session(o.ctx);
      if (!ss) return fail(strfmt("session %zu of %zu: %s", k + 1, n, ss.error().message.c_str()));
      std::vector<int32_t> walk;
      uint64_t x = 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull * (k + 1);
      while (walk.size() < a.ctx_start) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int32_t t = static_cast<int32_t>((x >> 33) % info.n_vocab);
        if (!tok.is_special(t)) walk.push_back(t);
      }
      const auto t0 = clock::now();
      if (auto st = (*ss)->prefill(walk); !st) return fail(st.error().message);
      pf_seconds += std::chrono::duration<double>(clock::now() - t0).count();
      sessions.push_back(std::move(*ss));
    }
    both("streams,ctx,prefill_tps,gen_steps,aggregate_tps,per_stream_tps,weight_gbps_per_stream\n");
    std::vector<int32_t> next(n);
    std::vector<SessionStep> items(n);
    auto steps = [&]() -> Status {
      for (int i = 0; i < a.gen_tokens; ++i) {
        for (size_t k = 0; k < n; ++k) {
          const auto& lg = sessions[k]->logits();
          next[k] = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
          items[k] = SessionStep{sessions[k].get(), std::span<const int32_t>(&next[k], 1)};
        }
        DSV4_TRY((*engine)->step(items));
      }
      return {};
    };
    const auto t1 = clock::now();
    if (auto st = steps(); !st) return fail(st.error().message);
    const double dt = std::chrono::duration<double>(clock::now() - t1).count();
    const double per_stream = dt > 0 ? a.gen_tokens / dt : 0;
    both("%zu,%u,%.2f,%d,%.2f,%.2f,%.2f\n", n, a.ctx_start, pf_seconds > 0 ? n * a.ctx_start / pf_seconds : 0.0,
         a.gen_tokens, per_stream * static_cast<double>(n), per_stream,
         per_stream * static_cast<double>(info.decode_bytes_per_token) / 1e9);
    if (a.mixed_prefill > 0) {
      // The same prompt prefilled alone (in whole batches), then in chunks inside the decode steps of the
      // N sessions: its rate beside them, and theirs beside it.
      const int64_t batch = std::max(1, info.prefill_batch);
      const size_t chunk = a.mixed_chunk > 0 ? a.mixed_chunk : static_cast<size_t>(std::max<int64_t>(1, batch / 4));
      if (chunk + n > static_cast<size_t>(batch))
        return fail(strfmt("--mixed-chunk %zu + %zu decode rows exceed the prefill batch (%lld)", chunk, n,
                           static_cast<long long>(batch)));
      std::vector<int32_t> prompt;
      uint64_t x = 0x5851f42d4c957f2dull;
      while (prompt.size() < a.mixed_prefill) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int32_t t = static_cast<int32_t>((x >> 33) % info.n_vocab);
        if (!tok.is_special(t)) prompt.push_back(t);
      }
      const uint32_t pctx = std::max(o.ctx, a.mixed_prefill + 1);
      auto solo = (*engine)->new_session(pctx);
      if (!solo) return fail(solo.error().message);
      const auto s0 = clock::now();
      if (auto st = (*solo)->prefill(prompt); !st) return fail(st.error().message);
      const double solo_s = std::chrono::duration<double>(clock::now() - s0).count();
      (*solo)->reset();
      auto mixed = std::move(*solo);
      size_t fed = 0, decoded = 0;
      std::vector<SessionStep> mix(n + 1);
      const auto m0 = clock::now();
      while (fed < prompt.size()) {
        for (size_t k = 0; k < n; ++k) {
          const auto& lg = sessions[k]->logits();
          next[k] = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
          mix[k] = SessionStep{sessions[k].get(), std::span<const int32_t>(&next[k], 1)};
        }
        const size_t take = std::min(chunk, prompt.size() - fed);
        mix[n] = SessionStep{mixed.get(), std::span<const int32_t>(prompt.data() + fed, take)};
        if (auto st = (*engine)->step(mix); !st) return fail(st.error().message);
        fed += take;
        ++decoded;
      }
      const double mixed_s = std::chrono::duration<double>(clock::now() - m0).count();
      const double solo_tps = solo_s > 0 ? prompt.size() / solo_s : 0,
                   mixed_tps = mixed_s > 0 ? prompt.size() / mixed_s : 0;
      both("# mixed: a %u-token prompt in chunks of %zu inside the decode steps of the %zu streams\n", a.mixed_prefill,
           chunk, n);
      both(
          "mixed_prefill_tokens,chunk,solo_prefill_tps,mixed_prefill_tps,mixed_over_solo,decode_steps,per_stream_"
          "tps\n");
      both("%u,%zu,%.2f,%.2f,%.3f,%zu,%.2f\n", a.mixed_prefill, chunk, solo_tps, mixed_tps,
           solo_tps > 0 ? mixed_tps / solo_tps : 0.0, decoded, mixed_s > 0 ? decoded / mixed_s : 0.0);
    }
    if (csv) std::fclose(csv);
    if (a.profile) {  // the same number of steps again, every op timed (ms per step)
      (*engine)->set_op_profiling(true);
      const Status st = steps();
      const std::string report = (*engine)->take_op_profile_report(std::max(1, a.gen_tokens));
      (*engine)->set_op_profiling(false);
      if (!st) return fail(st.error().message);
      std::fprintf(stderr, "# op profile of a batched step of %zu streams at ctx %u (ms per step, every op timed)\n%s",
                   n, a.ctx_start, report.c_str());
    }
    return 0;
  }

  auto session = (*engine)->new_session(o.ctx);
  if (!session) return fail(session.error().message);
  if (a.verify > 0) {
    if (auto st = (*session)->prefill(std::span<const int32_t>(seq.data(), a.ctx_start)); !st)
      return fail(st.error().message);
    const SpeculationBench sb{
        .max_k = a.verify, .gen_tokens = a.gen_tokens, .draft = *draft, .draft_margin = a.spec.margin};
    const Status st =
        bench_speculation(**engine, **session, sb, [&](const std::string& line) { both("%s", line.c_str()); });
    if (csv) std::fclose(csv);
    return st ? 0 : fail(st.error().message);
  }
  uint32_t done = 0;
  for (uint32_t frontier = a.ctx_start;;) {
    frontier = std::min(frontier, ctx_max);
    auto t0 = clock::now();
    auto st = (*session)->prefill(std::span<const int32_t>(seq.data() + done, frontier - done));
    if (!st) return fail(st.error().message);
    double pf = std::chrono::duration<double>(clock::now() - t0).count();
    uint32_t n_pf = frontier - done;
    done = frontier;
    // Greedy decode, EOS ignored.
    SpecStats spec;
    auto decode_steps = [&]() -> Status {
      if (speculate) {
        GenerateOptions go;
        go.sampling.temperature = 0;
        go.max_tokens = a.gen_tokens;
        go.ignore_eos = true;
        go.parse_chat = false;
        go.draft = *draft;
        go.draft_margin = a.spec.margin;
        const std::vector<int32_t> prompt((*session)->tokens());
        DSV4_TRY_ASSIGN(const GenerateResult r, generate(**session, tok, prompt, go));
        spec = r.spec;
        return {};
      }
      for (int i = 0; i < a.gen_tokens; ++i) {
        const auto& lg = (*session)->logits();
        int32_t best = 0;
        for (size_t v = 1; v < lg.size(); ++v)
          if (lg[v] > lg[static_cast<size_t>(best)]) best = static_cast<int32_t>(v);
        DSV4_TRY((*session)->decode(best));
      }
      return {};
    };
    auto t1 = clock::now();
    if (auto d = decode_steps(); !d) return fail(d.error().message);
    double dt = std::chrono::duration<double>(clock::now() - t1).count();
    // --profile: the same steps again from the frontier with every op timed,
    // so the CSV's decode rate stays that of the untimed run.
    std::string profile;
    if (a.profile) {
      if (auto r = (*session)->rewind(frontier); !r) return fail(r.error().message);
      (*engine)->set_op_profiling(true);
      auto d = decode_steps();
      profile = (*engine)->take_op_profile_report(std::max(1, a.gen_tokens));
      (*engine)->set_op_profiling(false);
      if (!d) return fail(d.error().message);
    }
    // --profile, prefill: the first batch of this interval again, every op timed
    // (rewind to the interval's start, prefill one batch, then the rest untimed).
    std::string pf_profile;
    const uint32_t pf_start = frontier - n_pf;
    const uint32_t pf_m = std::min<uint32_t>(n_pf, static_cast<uint32_t>(std::max(1, o.prefill_batch)));
    if (a.profile && pf_m > 1) {
      if (auto r = (*session)->rewind(pf_start); !r) return fail(r.error().message);
      (*engine)->set_op_profiling(true);
      auto p1 = (*session)->prefill(std::span<const int32_t>(seq.data() + pf_start, pf_m));
      pf_profile = (*engine)->take_op_profile_report(1.0);
      (*engine)->set_op_profiling(false);
      if (!p1) return fail(p1.error().message);
      if (pf_start + pf_m < frontier) {
        auto p2 =
            (*session)->prefill(std::span<const int32_t>(seq.data() + pf_start + pf_m, frontier - pf_start - pf_m));
        if (!p2) return fail(p2.error().message);
      }
    }
    double gen_tps = a.gen_tokens > 0 && dt > 0 ? a.gen_tokens / dt : 0;
    both("%u,%u,%.2f,%d,%.2f,%.2f,%llu", frontier, n_pf, pf > 0 ? n_pf / pf : 0.0, a.gen_tokens, gen_tps,
         gen_tps * static_cast<double>(info.decode_bytes_per_token) / 1e9,
         static_cast<unsigned long long>((*engine)->session_bytes(frontier)));
    if (speculate)
      both(",%llu,%llu,%llu", static_cast<unsigned long long>(spec.passes),
           static_cast<unsigned long long>(spec.proposed), static_cast<unsigned long long>(spec.accepted));
    both("\n");
    if (csv) std::fflush(csv);
    if (a.profile)
      std::fprintf(stderr,
                   "# decode op profile at ctx %u (ms per token, a second decode run with every op timed; timing adds "
                   "overhead)\n%s",
                   frontier, profile.c_str());
    if (!pf_profile.empty())
      std::fprintf(
          stderr, "# prefill op profile: one batch of %u tokens at positions %u..%u (ms per batch, every op timed)\n%s",
          pf_m, pf_start, pf_start + pf_m - 1, pf_profile.c_str());
    if (auto r = (*session)->rewind(frontier); !r) return fail(r.error().message);
    if (frontier >= ctx_max) break;
    frontier = a.step_incr ? frontier + a.step_incr : static_cast<uint32_t>(frontier * a.step_mul);
  }
  if (csv) std::fclose(csv);
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed at context frontiers (CSV)");
  cmd->add_option("-m,--model", a->model, "Model GGUF");
  add_synthetic_flags(cmd, &a->synthetic, &a->seed);
  cmd->add_option("--router-skew", a->router_skew, "Skewed routing of --synthetic (as dsv4 synth --router-skew)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  add_expert_stats_flag(cmd, &a->expert_stats);
  cmd->add_option("--ctx-start", a->ctx_start, "First frontier")->capture_default_str();
  cmd->add_option("--ctx-max", a->ctx_max, "Last frontier (default: --ctx-start)");
  cmd->add_option("--step-mul", a->step_mul, "Next frontier = frontier * F")->capture_default_str();
  cmd->add_option("--step-incr", a->step_incr, "Next frontier = frontier + N (overrides --step-mul)");
  cmd->add_option("--gen-tokens", a->gen_tokens, "Greedy tokens decoded at each frontier (EOS ignored)")
      ->capture_default_str();
  cmd->add_option("--prompt-file", a->prompt_file, "Text whose tokens (repeated) form the sequence");
  cmd->add_option("--csv", a->csv, "Also write the CSV to this file");
  add_backend_flags(cmd, &a->backend, &a->numerics);
  add_fast_skip_flag(cmd, &a->fast_skip);
  cmd->add_option("-t,--threads", a->threads, "CPU threads (0 = all)")->capture_default_str();
  cmd->add_option("--batch", a->batch,
                  "Prefill batch (tokens per forward); 0 = the backend's default (CUDA 4096, CPU 512)")
      ->capture_default_str();
  cmd->add_option("--concurrency", a->concurrency,
                  "Sessions decoding together in one batched step (Engine::step), each prefilled to --ctx-start with "
                  "its own tokens; prints aggregate and per-stream decode t/s (1: the frontier sweep)")
      ->capture_default_str();
  cmd->add_option("--mixed-prefill", a->mixed_prefill,
                  "With --concurrency N: then a prompt of this many tokens is prefilled alone, and again in chunks "
                  "inside the N sessions' decode steps (one long prefill while N streams decode); prints both "
                  "prefill rates and the streams' rate beside it")
      ->capture_default_str();
  cmd->add_option("--mixed-chunk", a->mixed_chunk,
                  "Prompt tokens per step of the mixed run (0: a quarter of the prefill batch, as dsv4 serve)")
      ->capture_default_str();
  cmd->add_flag("--profile", a->profile,
                "Time every op of the decode steps, and of one prefill batch, and print per-op tables (stderr)");
  cmd->add_option("--verify", a->verify,
                  "Speculative decoding at --ctx-start instead of the sweep: verify passes of 1 + k tokens vs a decode "
                  "step (k = 1..K), proposals replaying the greedy continuation (k + 1 tokens a pass), the MTP "
                  "block's acceptance (--mtp), and the speed projected at published acceptance rates")
      ->type_name("K");
  add_speculation_flags(cmd, &a->spec);
  add_cuda_flags(cmd, &a->cuda);
  cmd->callback([a] { set_exit_code(run_bench(*a)); });
}

}  // namespace dsv4::tools
