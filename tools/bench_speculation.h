// dsv4 bench --verify: the cost of speculative verify passes, the self-consistency of the
// draft/verify/commit cycle, MTP acceptance, and the projected speed (bench_speculation.cpp).
#pragma once

#include <functional>
#include <string>

#include "core/error.h"
#include "dsv4/engine.h"

namespace dsv4::tools {

struct SpeculationBench {
  int max_k = 5;        // --verify K: passes of 1 + k tokens for k = 1..K
  int gen_tokens = 32;  // passes per k, and tokens generated per run
  int draft = 0;        // with --mtp: proposals per pass of the MTP run (0: no MTP run)
  float draft_margin = 0;
};

// Receives each output line (CSV rows and "# " comments), newline included.
using BenchPrinter = std::function<void(const std::string& line)>;

// Runs at the session's current length (its frontier) and leaves the session there.
Status bench_speculation(Engine& engine, Session& session, const SpeculationBench& b, const BenchPrinter& out);

}  // namespace dsv4::tools
