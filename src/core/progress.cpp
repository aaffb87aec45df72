#include "core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace dsv4 {

Progress::Progress(std::string label, uint64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total) {
  enabled_ = ::isatty(2) != 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { finish(); }

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(uint64_t done) {
  done_ = done;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  done_ = total_;
  if (enabled_) draw(true);
}

static std::string human(double v, const std::string& unit) {
  char buf[64];
  if (unit == "B") {
    if (v >= 1e9)
      std::snprintf(buf, sizeof buf, "%.2f GB", v / 1e9);
    else if (v >= 1e6)
      std::snprintf(buf, sizeof buf, "%.1f MB", v / 1e6);
    else
      std::snprintf(buf, sizeof buf, "%.0f B", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, unit.c_str());
  }
  return buf;
}

void Progress::draw(bool final) {
  double t = elapsed_s();
  double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  int width = 30, filled = static_cast<int>(frac * width);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(static_cast<size_t>(width), '.');
  double rate = t > 0 ? static_cast<double>(done_) / t : 0;
  std::fprintf(stderr, "\r%s [%s] %5.1f%% %s/%s %s/s   ", label_.c_str(), bar.c_str(), frac * 100,
               human(static_cast<double>(done_), unit_).c_str(), human(static_cast<double>(total_), unit_).c_str(),
               human(rate, unit_).c_str());
  if (final) std::fputc('\n', stderr);
  std::fflush(stderr);
}

}  // namespace dsv4
