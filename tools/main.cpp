// dsv4: one binary, one subcommand per tool (tools/cmd_*.cpp).
#include <cstdio>

#include "commands.h"

namespace dsv4::tools {
namespace {
int g_exit_code = 0;
}
void set_exit_code(int code) { g_exit_code = code; }
}  // namespace dsv4::tools

int main(int argc, char** argv) {
  CLI::App app{"dsv4: DeepSeek V4 inference engine (C++20 + CUDA)", "dsv4"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dsv4 0.1.0");
  dsv4::tools::register_inspect(app);
  dsv4::tools::register_synth(app);
  dsv4::tools::register_logits(app);
  dsv4::tools::register_bench(app);
  dsv4::tools::register_convert(app);
  dsv4::tools::register_render(app);
  dsv4::tools::register_parse(app);
  dsv4::tools::register_run(app);
  dsv4::tools::register_tokenize(app);
  dsv4::tools::register_serve(app);
  dsv4::tools::register_pull(app);
  try {
    const std::vector<std::string> args = dsv4::tools::normalize_args(argc, argv);
    std::vector<const char*> arg_ptrs;
    for (const auto& a : args) arg_ptrs.push_back(a.c_str());
    app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return dsv4::tools::g_exit_code;
}
