// A one-line progress bar on stderr for long work (loading, synth, prefill).
// Prints only when stderr is a terminal, unless forced; redraws at most ~10x/s.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace dsv4 {

class Progress {
 public:
  // total: units of work (bytes, tokens); unit: label printed after rates ("B" -> GB/s).
  Progress(std::string label, uint64_t total, std::string unit = "B");
  ~Progress();
  void update(uint64_t done);
  void finish();
  double elapsed_s() const;

 private:
  void draw(bool final);
  std::string label_, unit_;
  uint64_t total_ = 0, done_ = 0;
  bool enabled_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace dsv4
