// Routed experts streamed from the model file (CudaOptions::stream_experts, docs/design-notes/expert-offload.md):
// when the host experts cannot all be pinned in RAM for the GPU to read, those that are not stay pageable in
// the file's mapping, and for each expert op the host copies the ones its batch uses into a small ring of
// pinned staging slots, from which the GPU copies them into its gather stage. Pages not in RAM are read from
// the disk by the copying threads' page faults (SSD streaming).
//
// The two sides share one ExpertStreamBox (mapped pinned memory with a GPU; plain memory in the tests) and a
// staging area of `slots` slots of `slot_bytes` each. Request s (sequence numbers grow from 1) stages
// list[0 .. count) in order; stage position c goes through slot r = c % slots:
//   GPU  writes count, n_expert, list, src, bytes, then request = s
//   CPU  for each c (several threads, c claimed in increasing order): when c >= slots, waits until
//        consumed[r] == stream_tag(s, c - slots) (the GPU has copied the slot's previous expert out); copies
//        expert list[c] of the three matrices (src[m] + list[c] * bytes[m], m = 0, 1, 2) into slot r back to
//        back; then ready[r] = stream_tag(s, c)
//   GPU  for each c: waits until ready[r] == stream_tag(s, c), copies the slot out, then consumed[r] =
//        stream_tag(s, c)
// Nothing else is ordered: the GPU finishes request s (all of it consumed) before it posts s + 1, so slots
// start free, and the host has read all of request s's words before that (list[c] before ready for c). Empty
// requests are never posted (the GPU would not wait for one, and the next could overwrite its words while the
// host reads them). Tags never repeat (s in the high word), so a stale ready or consumed word never matches.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>

namespace dsv4 {

class SpinTeam;

inline constexpr int k_stream_max_experts = 1024;  // experts per layer a request can list
inline constexpr int k_stream_max_slots = 64;

// The shared words (see the top of this file). 16-byte aligned sizes and bases.
struct ExpertStreamBox {
  uint32_t request = 0;  // GPU -> CPU: the latest request's sequence number (0: none yet)
  int32_t count = 0;     // experts to stage: list[0 .. count)
  int32_t n_expert = 0;  // experts in each stacked matrix (list entries are below it)
  int32_t pad = 0;
  uint64_t src[3] = {};                        // host addresses of the three stacked expert matrices (gate, up, down)
  int64_t bytes[3] = {};                       // one expert's bytes in each
  int32_t list[k_stream_max_experts] = {};     // stage position c -> expert index
  uint64_t ready[k_stream_max_slots] = {};     // CPU -> GPU: the tag of the expert now in slot r
  uint64_t consumed[k_stream_max_slots] = {};  // GPU -> CPU: the tag of the expert last copied out of slot r
};

// Stage position c of request s (0 never names one).
constexpr uint64_t stream_tag(uint32_t s, int32_t c) {
  return (static_cast<uint64_t>(s) << 32) | static_cast<uint32_t>(c + 1);
}

class ExpertStreamer {
 public:
  // box and staging (slots x slot_bytes) stay owned by the caller and must outlive the streamer; threads
  // copy (<= 0: every core but one, at most 16). Starts the worker that polls box->request.
  ExpertStreamer(ExpertStreamBox* box, uint8_t* staging, int slots, size_t slot_bytes, int threads);
  ~ExpertStreamer();  // stops the worker (no request may be in flight) and logs the totals
  ExpertStreamer(const ExpertStreamer&) = delete;
  ExpertStreamer& operator=(const ExpertStreamer&) = delete;

  int threads() const;
  int slots() const { return slots_; }
  size_t slot_bytes() const { return slot_bytes_; }

  // Totals since the start (the worker's: read them only once it is idle, as the tests do).
  struct Stats {
    uint64_t requests = 0, experts = 0;
    double bytes = 0, seconds = 0;  // bytes copied and the seconds the requests took, first look to last slot
  };
  Stats stats() const { return stats_; }
  // Requests served so far (stats() covers them once this reaches the last request posted).
  uint64_t served() const { return served_.load(std::memory_order_acquire); }

  // A slot the GPU has not handed back, or a request it never posts the end of, after this long is a hang:
  // reported and fatal (a layer's experts take milliseconds, a slow disk seconds).
  static constexpr uint64_t k_wait_limit_ns = 60ull * 1000 * 1000 * 1000;

 private:
  void worker(uint32_t last);
  void serve(uint32_t s);

  ExpertStreamBox* box_;
  uint8_t* staging_;
  int slots_;
  size_t slot_bytes_;
  std::unique_ptr<SpinTeam> team_;
  Stats stats_;
  std::atomic<uint64_t> served_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dsv4
