// Server counters, exported at GET /metrics in the Prometheus text format
// (version 0.0.4): "# HELP" / "# TYPE" lines, then "name{labels} value".
//
//   dsv4_requests_total{endpoint,status}   counter  HTTP requests answered
//   dsv4_request_seconds_sum/_count        counter  wall time of answered requests
//   dsv4_prompt_tokens_total               counter  prompt tokens of finished jobs
//   dsv4_cached_prompt_tokens_total        counter  prompt tokens reused from the live session
//   dsv4_prefilled_tokens_total            counter  prompt tokens actually prefilled
//   dsv4_completion_tokens_total           counter  generated tokens
//   dsv4_prefill_seconds_total             counter  time spent prefilling
//   dsv4_decode_seconds_total              counter  time spent generating
//   dsv4_prefill_tokens_per_second         gauge    of the last job that prefilled anything
//   dsv4_decode_tokens_per_second          gauge    of the last job that generated anything
//   dsv4_cache_hits_total                  counter  jobs that reused part of the live session
//   dsv4_jobs_total{result}                counter  finished jobs: ok, cancelled, error
//   dsv4_queue_depth                       gauge    jobs waiting for the engine
//   dsv4_jobs_running                      gauge    0 or 1
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace dsv4::server {

struct JobOutcome;

class Metrics {
 public:
  void request_done(const std::string& endpoint, int status, double seconds);
  void job_done(const JobOutcome& outcome);
  std::string prometheus(size_t queue_depth, bool running) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  double request_seconds_ = 0;
  uint64_t request_count_ = 0;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, prefilled_tokens_ = 0, completion_tokens_ = 0;
  double prefill_seconds_ = 0, decode_seconds_ = 0;
  double last_prefill_tps_ = 0, last_decode_tps_ = 0;
  uint64_t cache_hits_ = 0;
  uint64_t jobs_ok_ = 0, jobs_cancelled_ = 0, jobs_error_ = 0;
};

}  // namespace dsv4::server
