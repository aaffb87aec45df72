// Routed experts read from the model file on demand (CudaOptions::stream_experts; backend/host/expert_stream.h
// states the protocol): host experts the driver has not pinned are pageable memory the GPU cannot read, so an
// expert op that uses them (cuda_moe.cu) has the host copy them into a ring of mapped pinned slots, and copies
// each slot into its gather stage as soon as the host marks it ready:
//   plan (gather_plan_kernel: list [count] of the stage's experts)
//     -> stream_request_kernel: count, list, the matrices' host addresses into the mailbox, then the request
//     -> stream_copy_kernel: grid (k_blocks_per_slot, slots); block (x, r) takes stage positions
//        c = r, r + slots, ... < count: waits for slot r's ready tag, copies its share of the slot into stage
//        position c, and the last of the slot's blocks to finish hands the slot back (consumed tag)
//   host: ExpertStreamer (all cores but one) copies list[c]'s three matrices from the mapping into slot c % slots
// so the host's copies (page cache, or the disk for pages not in RAM) overlap the bus. Every GPU part is a kernel:
// a decode graph records it like any other op. Results are bitwise those of registered host experts (the same
// bytes reach the same stage).
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "backend/host/expert_stream.h"
#include "core/error.h"

namespace dsv4::cuda {

struct CudaContext;

class ExpertStreamRunner {
 public:
  // threads: the host's copying threads (<= 0: every core but one, at most 16).
  explicit ExpertStreamRunner(int threads);
  ~ExpertStreamRunner();
  ExpertStreamRunner(const ExpertStreamRunner&) = delete;
  ExpertStreamRunner& operator=(const ExpertStreamRunner&) = delete;

  // Host memory whose experts go through the streamer (not registered: the GPU cannot read it).
  Status add_streamed(const void* host, size_t bytes);
  // Every host expert matrix the backend maps (streamed or pinned: an op mixing them stages both through the
  // slots): one expert of it must fit a third of a slot.
  // Grows the slots once something streams (load time only: no request may be in flight).
  Status note_expert_bytes(int64_t bytes);

  bool streamed(const void* p) const;

  // Stages the experts list[0 .. *count) (device memory; *count <= cap) of the three matrices (host addresses
  // src[m], one expert of bytes[m], n_expert experts) into dst[m] + c * bytes[m], on ctx.stream.
  void stage(const CudaContext& ctx, const uint8_t* const src[3], const int64_t bytes[3], int64_t n_expert,
             const int32_t* list, const int32_t* count, int64_t cap, uint8_t* const dst[3]);

  int threads() const { return streamer_ ? streamer_->threads() : 0; }
  size_t pinned_bytes() const { return static_cast<size_t>(k_slots) * slot_bytes_; }

  static constexpr int k_slots = 16;           // staging ring (q2: 7.1 MB an expert, 113 MB pinned)
  static constexpr int k_blocks_per_slot = 8;  // a power of two (the done counters wrap)

 private:
  Status allocate(size_t slot_bytes);

  int threads_;
  ExpertStreamBox* box_ = nullptr;  // mapped pinned memory (host pointer); box_d_: its device pointer
  void* box_d_ = nullptr;
  uint8_t* staging_ = nullptr;  // [k_slots][slot_bytes_], mapped pinned
  void* staging_d_ = nullptr;
  size_t slot_bytes_ = 0;
  int64_t max_expert_bytes_ = 0;  // the largest one expert of any host matrix (note_expert_bytes)
  uint32_t* seq_d_ = nullptr;     // device: the last request's sequence number
  uint32_t* done_d_ = nullptr;    // device: [k_slots] blocks finished per slot, ever
  std::unique_ptr<ExpertStreamer> streamer_;
  std::map<uintptr_t, size_t> streamed_;  // host ranges [first, first + second)
};

}  // namespace dsv4::cuda
