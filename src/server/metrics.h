// Server counters, exported at GET /metrics in the Prometheus text format
// (version 0.0.4): "# HELP" / "# TYPE" lines, then "name{labels} value".
//
//   dsv4_requests_total{endpoint,status}   counter  HTTP requests answered; endpoint is a route of
//                                                   the server (route_label) or "other", so clients
//                                                   cannot add series
//   dsv4_request_seconds_sum/_count        counter  wall time of answered requests
//   dsv4_prompt_tokens_total               counter  prompt tokens of finished jobs
//   dsv4_cached_prompt_tokens_total        counter  prompt tokens reused (resident session or disk cache)
//   dsv4_prefilled_tokens_total            counter  prompt tokens actually prefilled
//   dsv4_completion_tokens_total           counter  generated tokens
//   dsv4_prefill_seconds_total             counter  time spent prefilling
//   dsv4_decode_seconds_total              counter  time spent generating
//   dsv4_prefill_tokens_per_second         gauge    of the last job that prefilled anything
//   dsv4_decode_tokens_per_second          gauge    of the last job that generated anything
//   dsv4_cache_hits_total                  counter  jobs that reused cached prompt tokens
//   dsv4_spec_passes_total                 counter  speculative verify passes (--draft)
//   dsv4_spec_proposed_tokens_total        counter  tokens proposed to them
//   dsv4_spec_accepted_tokens_total        counter  proposals the model agreed with (passes saved)
//   dsv4_jobs_total{result}                counter  finished jobs: ok, cancelled, error
//   dsv4_queue_depth                       gauge    jobs waiting for a worker
//   dsv4_jobs_running                      gauge    jobs running (at most --parallel)
//   dsv4_parallel_max                      gauge    --parallel
//   dsv4_jobs_waiting_for_session          gauge    running jobs waiting for a free session (KV admission)
//   dsv4_time_to_first_token_seconds       histogram  job created -> first sampled token
//   dsv4_inter_token_seconds               histogram  between consecutive sampled tokens of a job
//
// Batched steps (--parallel > 1, runtime/step_batcher.h):
//   dsv4_steps_total                       counter  Engine::step calls
//   dsv4_step_rows                         histogram sessions per step (le: 1, 2, 4, ..., 64)
//   dsv4_step_seconds                      histogram wall time of a step
//   dsv4_step_tokens_total{kind}           counter  decode (one-token rows) and prefill (chunk) tokens
//   dsv4_step_members                      gauge    jobs generating now
//
// Resident sessions and the on-disk KV cache (CacheReport, from the backend):
//   dsv4_sessions_max                      gauge    --sessions
//   dsv4_sessions_live                     gauge    sessions created so far
//   dsv4_session_tokens{slot}              gauge    tokens each live session holds
//   dsv4_session_bytes                     gauge    backend memory of one session (its whole context)
//   dsv4_session_picks_total{pick}         counter  extends, regenerates, new, displaced (session_pool.h)
//   dsv4_kv_disk_enabled                   gauge    1 with a working --kv-disk-dir
//   dsv4_kv_disk_writable                  gauge    0 after a failed write (full disk: read-only)
//   dsv4_kv_disk_hits_total                counter  requests that restored a file
//   dsv4_kv_disk_misses_total              counter  lookups that found nothing longer than memory had
//   dsv4_kv_disk_restored_tokens_total     counter  prompt tokens restored from files
//   dsv4_kv_disk_stores_total              counter  files written
//   dsv4_kv_disk_saves_total{reason}       counter  saves handed to the writer: cold, frontier, displaced, shutdown
//   dsv4_kv_disk_saves_skipped_total{why}  counter  busy (writer queue full), present (same file exists)
//   dsv4_kv_disk_write_failures_total      counter  writes that failed
//   dsv4_kv_disk_evictions_total           counter  files removed to stay within the budget
//   dsv4_kv_disk_rejected_files_total      counter  invalid files removed (corrupt, truncated, foreign, wrong version)
//   dsv4_kv_disk_files / _bytes / _budget_bytes  gauge  what the directory holds, and the budget
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/cache_report.h"
#include "runtime/step_batcher.h"

namespace dsv4::runtime {
struct JobOutcome;
}

namespace dsv4::server {

// The metrics label of a request path: one of the server's routes (the path
// without its query), else "other". A fixed set: labels never grow with input.
const char* route_label(std::string_view path);

// A label value escaped for the Prometheus text format (\\, \", \n).
std::string prometheus_escape(std::string_view value);

// What the runtime is doing now, for the gauges.
struct RuntimeStatus {
  size_t queue_depth = 0;          // jobs waiting for a worker
  size_t running = 0;              // jobs running
  size_t parallel = 1;             // workers (--parallel)
  size_t waiting_for_session = 0;  // running jobs waiting for a free session
  runtime::StepReport steps;
};

// A Prometheus histogram: counts per upper bound (cumulative when written), then +Inf.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  // "# HELP/# TYPE", name_bucket{le=...} lines, name_sum, name_count.
  void write(std::string& out, const char* name, const char* help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  // `path`: the request path as received; it is reduced to route_label().
  void request_done(std::string_view path, int status, double seconds);
  void job_done(const runtime::JobOutcome& outcome);
  std::string prometheus(const RuntimeStatus& runtime, const runtime::CacheReport& cache = {}) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string_view, int>, uint64_t> requests_;  // (route_label, status)
  double request_seconds_ = 0;
  uint64_t request_count_ = 0;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, prefilled_tokens_ = 0, completion_tokens_ = 0;
  uint64_t spec_passes_ = 0, spec_proposed_ = 0, spec_accepted_ = 0;
  double prefill_seconds_ = 0, decode_seconds_ = 0;
  double last_prefill_tps_ = 0, last_decode_tps_ = 0;
  uint64_t cache_hits_ = 0;
  uint64_t jobs_ok_ = 0, jobs_cancelled_ = 0, jobs_error_ = 0;
  Histogram first_token_{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram inter_token_{{0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2}};
};

}  // namespace dsv4::server
