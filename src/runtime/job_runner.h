// Runs one job on the worker thread: Backend::begin_job picks the session
// and the prompt tokens (resident sessions, disk cache, prompt_reuse.h), then
// the job generates in one or two phases with generate()'s semantics, and
// Backend::end_job sees the outcome.
//
// One phase (the usual case): generate(prompt, options).
//
// Two phases, when something must be forced after the reasoning:
//   R (thinking mode only): generate with "</think>" as an extra stop string
//     and at most `thinking_budget` tokens. Ends the job unless it stopped at
//     "</think>", or ran out of budget (then the </think> token is appended).
//   C (content): continues from prompt + R's tokens.
//     * forced tool call: the DSML opener (and `invoke name="NAME">\n` for a
//       named function) is appended as forced output, the model continues as
//       plain text until the block's closing tag (an extra stop string), and
//       a parser fed with forced text + generated text produces the events;
//     * budget only: generate() in chat parsing mode (the content state).
//   Forced tokens (</think>, the tool-call opener) are part of the reply: they
//   count once, as completion tokens, never as prompt tokens, although the
//   engine reads them as part of phase C's prompt. Client stop strings apply
//   in both phases.
#pragma once

#include <cstdint>
#include <functional>

#include "runtime/backend.h"
#include "runtime/job.h"

namespace dsv4::runtime {

struct JobHooks {
  std::function<void(const DsmlEvent&)> on_event;
  std::function<bool()> cancelled;
  std::function<void(uint64_t done, uint64_t total)> on_prefill_progress;  // optional
  std::function<void()> on_token;                                          // optional: after each sampled token
};

JobOutcome run_job(Backend& backend, const JobInput& input, const JobHooks& hooks);

// The completion text forced for tool_choice required ("") / a named function.
RenderedPrompt forced_tool_opener(const std::string& name_or_empty);

}  // namespace dsv4::runtime
