// dsv4 pull: download a published DeepSeek V4 GGUF by short name (src/pull/), resumable.
#include <sys/stat.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/progress.h"
#include "gguf/gguf.h"
#include "pull/download.h"
#include "pull/published.h"
#include "util.h"

namespace dsv4::tools {

namespace {

struct PullArgs {
  std::string name;
  std::string dir = ".";
  std::string base_url = k_published_base_url;
  bool list = false;
  int attempts = 8;
};

int run_pull(const PullArgs& a) {
  if (a.list) {
    std::printf("%-8s %10s  %-7s %s\n", "name", "size", "runs", "what (file)");
    for (const PublishedFile& f : published_files())
      std::printf("%-8s %10s  %-7s %s\n%30s(%s)\n", f.name,
                  f.approx_gib > 0 ? strfmt("%.1f GiB", f.approx_gib).c_str() : "?", f.loads ? "yes" : "not yet",
                  f.what, "", f.file);
    return 0;
  }
  if (a.name.empty()) {
    std::fprintf(stderr, "dsv4 pull: error: name a file (dsv4 pull --list shows them)\n");
    return 2;
  }
  auto f = find_published(a.name);
  if (!f) {
    std::fprintf(stderr, "dsv4 pull: error: %s\n", f.error().message.c_str());
    return 2;
  }
  const std::string path = (a.dir.empty() || a.dir.back() == '/' ? a.dir : a.dir + "/") + f->file;
  const std::string url = a.base_url + f->file;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    std::printf("%s is already here (%s); delete it to download it again\n", path.c_str(),
                human_bytes(static_cast<uint64_t>(st.st_size)).c_str());
    return 0;
  }
  std::printf("pulling %s\n  from %s\n  to   %s\n", f->name, url.c_str(), path.c_str());
  std::unique_ptr<Progress> bar;
  DownloadOptions o;
  o.url = url;
  o.path = path;
  o.max_attempts = a.attempts;
  o.progress = [&](uint64_t done, uint64_t total) {
    if (!bar && total > 0) bar = std::make_unique<Progress>("pull " + std::string(f->name), total);
    if (bar) bar->update(done);
  };
  auto r = download_resumable(o);
  if (bar) bar->finish();
  if (!r) {
    std::fprintf(stderr, "dsv4 pull: error: %s\n", r.error().message.c_str());
    return 1;
  }
  const double s = bar ? bar->elapsed_s() : 0.0;
  std::printf("%s: %s%s in %.0f s (%.0f MB/s)\n", path.c_str(), human_bytes(r->bytes).c_str(),
              r->resumed_from > 0 ? strfmt(", resumed at %s", human_bytes(r->resumed_from).c_str()).c_str() : "", s,
              s > 0 ? static_cast<double>(r->bytes - r->resumed_from) / s / 1e6 : 0.0);
  // The bytes arrived; are they a GGUF? (The header, metadata and tensor extents against the file size.)
  auto g = GgufFile::open(path);
  if (!g) {
    std::fprintf(stderr, "dsv4 pull: error: %s is not a valid GGUF: %s\n", path.c_str(), g.error().message.c_str());
    return 1;
  }
  if (!f->loads)
    std::printf("note: dsv4 does not run %s files yet (issue: every published file; see dsv4 pull --list)\n", f->name);
  return 0;
}

}  // namespace

void register_pull(CLI::App& app) {
  auto args = std::make_shared<PullArgs>();
  CLI::App* cmd = app.add_subcommand(
      "pull", "Download a published DeepSeek V4 GGUF by short name (resumable: run it again after an interruption)");
  cmd->add_option("name", args->name, "q2 | q2-q4 | q4 | mxfp4 | dspark | mtp | pro-q2 (see --list)");
  cmd->add_option("-o,--dir", args->dir, "Directory to download into (the file keeps its published name)")
      ->capture_default_str();
  cmd->add_option("--base-url", args->base_url, "Where the files are (a file's URL is this plus its name)")
      ->capture_default_str();
  cmd->add_option("--attempts", args->attempts, "Requests before giving up (each after a failure resumes)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_flag("--list", args->list, "List the published files, their sizes and whether dsv4 runs them");
  cmd->callback([args] { set_exit_code(run_pull(*args)); });
}

}  // namespace dsv4::tools
