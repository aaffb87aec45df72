#include "server/metrics.h"

#include <algorithm>
#include <span>

#include "core/error.h"
#include "runtime/job.h"

namespace dsv4::server {

const char* route_label(std::string_view path) {
  static constexpr const char* k_routes[] = {
      "/health",         "/metrics",      "/v1/models",   "/v1/chat/completions",
      "/v1/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"};
  path = path.substr(0, path.find('?'));
  for (const char* r : k_routes)
    if (path == r) return r;
  return "other";
}

std::string prometheus_escape(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void Histogram::observe(double v) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  ++counts_[static_cast<size_t>(it - bounds_.begin())];
  sum_ += v;
  ++count_;
}

namespace {

// A histogram in the text format: counts[i] observations in (bounds[i-1], bounds[i]], the last past every bound.
template <typename Bound, typename Count>
void write_histogram(std::string& out, const char* name, const char* help, std::span<const Bound> bounds,
                     std::span<const Count> counts, double sum) {
  out += strfmt("# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    cum += counts[i];
    out += strfmt("%s_bucket{le=\"%g\"} %llu\n", name, static_cast<double>(bounds[i]),
                  static_cast<unsigned long long>(cum));
  }
  cum += counts[bounds.size()];
  out += strfmt("%s_bucket{le=\"+Inf\"} %llu\n", name, static_cast<unsigned long long>(cum));
  out += strfmt("%s_sum %.6f\n%s_count %llu\n", name, sum, name, static_cast<unsigned long long>(cum));
}

}  // namespace

void Histogram::write(std::string& out, const char* name, const char* help) const {
  write_histogram(out, name, help, std::span<const double>(bounds_), std::span<const uint64_t>(counts_), sum_);
}

void Metrics::request_done(std::string_view path, int status, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{route_label(path), status}];
  request_seconds_ += seconds;
  ++request_count_;
}

void Metrics::job_done(const runtime::JobOutcome& o) {
  std::lock_guard<std::mutex> lock(mu_);
  if (o.error) {
    ++jobs_error_;
    return;
  }
  const GenerateResult& r = o.result;
  if (r.finish == FinishReason::CANCELLED)
    ++jobs_cancelled_;
  else
    ++jobs_ok_;
  if (o.first_token_seconds >= 0) first_token_.observe(o.first_token_seconds);
  for (float g : o.token_gaps) inter_token_.observe(g);
  prompt_tokens_ += r.prompt_tokens;
  cached_tokens_ += r.cached_tokens;
  const size_t prefilled = r.prompt_tokens > r.cached_tokens ? r.prompt_tokens - r.cached_tokens : 0;
  prefilled_tokens_ += prefilled;
  completion_tokens_ += r.tokens.size();
  spec_passes_ += r.spec.passes;
  spec_proposed_ += r.spec.proposed;
  spec_accepted_ += r.spec.accepted;
  prefill_seconds_ += r.prefill_seconds;
  decode_seconds_ += r.decode_seconds;
  if (r.cached_tokens > 0) ++cache_hits_;
  if (prefilled > 0 && r.prefill_seconds > 0) last_prefill_tps_ = static_cast<double>(prefilled) / r.prefill_seconds;
  if (!r.tokens.empty() && r.decode_seconds > 0)
    last_decode_tps_ = static_cast<double>(r.tokens.size()) / r.decode_seconds;
}

std::string Metrics::prometheus(const RuntimeStatus& rt, const runtime::CacheReport& c) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string s;
  auto head = [&](const char* name, const char* type, const char* help) {
    s += strfmt("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  };
  auto line_u = [&](const char* name, uint64_t v) {
    s += strfmt("%s %llu\n", name, static_cast<unsigned long long>(v));
  };
  auto line_d = [&](const char* name, double v) { s += strfmt("%s %.6f\n", name, v); };

  head("dsv4_requests_total", "counter", "HTTP requests answered, by endpoint and status.");
  for (const auto& [key, n] : requests_)
    s += strfmt("dsv4_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", prometheus_escape(key.first).c_str(),
                key.second, static_cast<unsigned long long>(n));
  head("dsv4_request_seconds", "summary", "Wall time of answered requests.");
  line_d("dsv4_request_seconds_sum", request_seconds_);
  line_u("dsv4_request_seconds_count", request_count_);
  head("dsv4_prompt_tokens_total", "counter", "Prompt tokens of finished jobs.");
  line_u("dsv4_prompt_tokens_total", prompt_tokens_);
  head("dsv4_cached_prompt_tokens_total", "counter", "Prompt tokens reused from a resident session or the disk cache.");
  line_u("dsv4_cached_prompt_tokens_total", cached_tokens_);
  head("dsv4_prefilled_tokens_total", "counter", "Prompt tokens prefilled.");
  line_u("dsv4_prefilled_tokens_total", prefilled_tokens_);
  head("dsv4_completion_tokens_total", "counter", "Generated tokens.");
  line_u("dsv4_completion_tokens_total", completion_tokens_);
  head("dsv4_prefill_seconds_total", "counter", "Time spent prefilling prompts.");
  line_d("dsv4_prefill_seconds_total", prefill_seconds_);
  head("dsv4_decode_seconds_total", "counter", "Time spent generating tokens.");
  line_d("dsv4_decode_seconds_total", decode_seconds_);
  head("dsv4_prefill_tokens_per_second", "gauge", "Prefill speed of the last job that prefilled tokens.");
  line_d("dsv4_prefill_tokens_per_second", last_prefill_tps_);
  head("dsv4_decode_tokens_per_second", "gauge", "Generation speed of the last job that generated tokens.");
  line_d("dsv4_decode_tokens_per_second", last_decode_tps_);
  head("dsv4_cache_hits_total", "counter", "Jobs that reused cached prompt tokens (resident session or disk).");
  line_u("dsv4_cache_hits_total", cache_hits_);
  head("dsv4_spec_passes_total", "counter", "Speculative verify passes (--draft).");
  line_u("dsv4_spec_passes_total", spec_passes_);
  head("dsv4_spec_proposed_tokens_total", "counter", "Tokens proposed to the verify passes.");
  line_u("dsv4_spec_proposed_tokens_total", spec_proposed_);
  head("dsv4_spec_accepted_tokens_total", "counter", "Proposed tokens the model agreed with (forward passes saved).");
  line_u("dsv4_spec_accepted_tokens_total", spec_accepted_);
  head("dsv4_jobs_total", "counter", "Finished generation jobs by result.");
  s += strfmt("dsv4_jobs_total{result=\"ok\"} %llu\n", static_cast<unsigned long long>(jobs_ok_));
  s += strfmt("dsv4_jobs_total{result=\"cancelled\"} %llu\n", static_cast<unsigned long long>(jobs_cancelled_));
  s += strfmt("dsv4_jobs_total{result=\"error\"} %llu\n", static_cast<unsigned long long>(jobs_error_));
  head("dsv4_queue_depth", "gauge", "Jobs waiting for a worker.");
  line_u("dsv4_queue_depth", rt.queue_depth);
  head("dsv4_jobs_running", "gauge", "Jobs running (at most --parallel).");
  line_u("dsv4_jobs_running", rt.running);
  head("dsv4_parallel_max", "gauge", "Jobs that may run at once (--parallel).");
  line_u("dsv4_parallel_max", rt.parallel);
  head("dsv4_jobs_waiting_for_session", "gauge", "Running jobs waiting for a free session (KV admission).");
  line_u("dsv4_jobs_waiting_for_session", rt.waiting_for_session);
  first_token_.write(s, "dsv4_time_to_first_token_seconds", "From a job's arrival to its first sampled token.");
  inter_token_.write(s, "dsv4_inter_token_seconds", "Between consecutive sampled tokens of a job.");

  using runtime::StepReport;
  const StepReport& st = rt.steps;
  head("dsv4_steps_total", "counter", "Batched engine steps (--parallel > 1).");
  line_u("dsv4_steps_total", st.steps);
  write_histogram(s, "dsv4_step_rows", "Sessions per batched step.", std::span<const size_t>(StepReport::k_row_bounds),
                  std::span<const uint64_t>(st.steps_by_rows), static_cast<double>(st.rows));
  write_histogram(s, "dsv4_step_seconds", "Wall time of a batched step.",
                  std::span<const double>(StepReport::k_second_bounds), std::span<const uint64_t>(st.steps_by_seconds),
                  st.seconds);
  head("dsv4_step_tokens_total", "counter", "Tokens of batched steps: decode (one-token rows) and prefill chunks.");
  s += strfmt("dsv4_step_tokens_total{kind=\"decode\"} %llu\n", static_cast<unsigned long long>(st.decode_tokens));
  s += strfmt("dsv4_step_tokens_total{kind=\"prefill\"} %llu\n", static_cast<unsigned long long>(st.prefill_tokens));
  head("dsv4_step_members", "gauge", "Jobs generating through the step batcher now.");
  line_u("dsv4_step_members", st.members);

  head("dsv4_sessions_max", "gauge", "Resident sessions the server keeps at most (--sessions).");
  line_u("dsv4_sessions_max", c.max_sessions);
  head("dsv4_sessions_live", "gauge", "Resident sessions created so far.");
  line_u("dsv4_sessions_live", c.session_tokens.size());
  head("dsv4_session_tokens", "gauge", "Tokens each resident session holds.");
  for (size_t i = 0; i < c.session_tokens.size(); ++i)
    s += strfmt("dsv4_session_tokens{slot=\"%zu\"} %llu\n", i, static_cast<unsigned long long>(c.session_tokens[i]));
  head("dsv4_session_bytes", "gauge", "Backend memory of one resident session (its whole context).");
  line_u("dsv4_session_bytes", c.session_bytes);
  head("dsv4_session_picks_total", "counter", "Requests by how their session was chosen.");
  static constexpr const char* k_picks[] = {"extends", "regenerates", "new", "displaced"};
  for (size_t i = 0; i < c.picks.size(); ++i)
    s +=
        strfmt("dsv4_session_picks_total{pick=\"%s\"} %llu\n", k_picks[i], static_cast<unsigned long long>(c.picks[i]));

  head("dsv4_kv_disk_enabled", "gauge", "1 when the on-disk KV cache is in use.");
  line_u("dsv4_kv_disk_enabled", c.disk_enabled ? 1 : 0);
  head("dsv4_kv_disk_writable", "gauge", "0 once a write failed (the cache then only serves hits).");
  line_u("dsv4_kv_disk_writable", c.disk_enabled && c.disk.writable ? 1 : 0);
  head("dsv4_kv_disk_hits_total", "counter", "Requests that restored a prefix from a cache file.");
  line_u("dsv4_kv_disk_hits_total", c.disk.hits);
  head("dsv4_kv_disk_misses_total", "counter", "Cache lookups that found no file longer than what memory held.");
  line_u("dsv4_kv_disk_misses_total", c.disk.misses);
  head("dsv4_kv_disk_restored_tokens_total", "counter", "Prompt tokens restored from cache files.");
  line_u("dsv4_kv_disk_restored_tokens_total", c.restored_tokens);
  head("dsv4_kv_disk_stores_total", "counter", "Cache files written.");
  line_u("dsv4_kv_disk_stores_total", c.disk.stores);
  head("dsv4_kv_disk_saves_total", "counter", "Session states handed to the cache writer, by reason.");
  static constexpr const char* k_reasons[] = {"cold", "frontier", "displaced", "shutdown"};
  for (size_t i = 0; i < c.saves.size(); ++i)
    s += strfmt("dsv4_kv_disk_saves_total{reason=\"%s\"} %llu\n", k_reasons[i],
                static_cast<unsigned long long>(c.saves[i]));
  head("dsv4_kv_disk_saves_skipped_total", "counter", "Saves skipped: the writer was busy, or the same file exists.");
  s += strfmt("dsv4_kv_disk_saves_skipped_total{why=\"busy\"} %llu\n", static_cast<unsigned long long>(c.skipped_busy));
  s += strfmt("dsv4_kv_disk_saves_skipped_total{why=\"present\"} %llu\n",
              static_cast<unsigned long long>(c.skipped_present));
  head("dsv4_kv_disk_write_failures_total", "counter", "Cache file writes that failed.");
  line_u("dsv4_kv_disk_write_failures_total", c.write_failures);
  head("dsv4_kv_disk_evictions_total", "counter", "Cache files removed to stay within the budget.");
  line_u("dsv4_kv_disk_evictions_total", c.disk.evictions);
  head("dsv4_kv_disk_rejected_files_total", "counter",
       "Invalid cache files removed (corrupt, truncated, foreign, wrong version).");
  line_u("dsv4_kv_disk_rejected_files_total", c.disk.rejected);
  head("dsv4_kv_disk_files", "gauge", "Cache files in the directory.");
  line_u("dsv4_kv_disk_files", c.disk.files);
  head("dsv4_kv_disk_bytes", "gauge", "Total size of the cache files.");
  line_u("dsv4_kv_disk_bytes", c.disk.bytes);
  head("dsv4_kv_disk_budget_bytes", "gauge", "The cache's size budget (--kv-disk-space-mb).");
  line_u("dsv4_kv_disk_budget_bytes", c.disk.budget_bytes);
  return s;
}

}  // namespace dsv4::server
