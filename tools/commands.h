// Each `dsv4 <command>` lives in its own tools/cmd_<name>.cpp and registers a
// CLI11 subcommand here. A command's callback sets the process exit code via
// `set_exit_code`; errors are printed as "dsv4 <cmd>: error: ..." and never crash.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace dsv4::tools {

void set_exit_code(int code);

void register_inspect(CLI::App& app);
void register_synth(CLI::App& app);
void register_logits(CLI::App& app);
void register_bench(CLI::App& app);
void register_convert(CLI::App& app);
void register_render(CLI::App& app);
void register_parse(CLI::App& app);
void register_run(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_serve(CLI::App& app);
void register_pull(CLI::App& app);

// argv as strings, with ds4's `dsv4 run -sys TEXT` spelled `--system TEXT`
// (CLI11 accepts only one-letter short options); see cmd_run.cpp.
std::vector<std::string> normalize_args(int argc, char** argv);

}  // namespace dsv4::tools
