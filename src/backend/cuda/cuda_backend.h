// The CUDA backend: every op of src/ops/ops.h as CUDA kernels on one device
// and one stream, tested op by op against the CPU backend (tests/cuda).
//
// Memory: activations/state from cudaMalloc (zero-initialised), weights copied
// to device memory at upload, except routed experts a memory budget leaves in
// host memory (map_host_weight: pinned and read over the bus, or streamed from
// the model file by the host).
// Dynamic values (positions, expert ids, selections) are read by the kernels
// from device tensors and no op synchronises with the host, so a decode step
// can later be captured in a CUDA graph. Every CUDA call is checked; a failure
// (bad device state, a kernel that trapped on a broken invariant) is fatal
// with the statement, file and line.
//
// This header is plain C++ (no CUDA headers), so the engine and the tests can
// include it from .cpp files.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/options/cuda_options.h"
#include "core/error.h"
#include "ops/ops.h"

namespace dsv4 {

// The switches (CudaOptions: tensor cores, cuBLAS, expert GEMM, ...) and the loader's hooks.
struct CudaBackendOptions : CudaOptions {
  // Called after each weight upload with the bytes uploaded so far (all
  // weights of this backend) — a progress hook for loaders.
  std::function<void(uint64_t bytes_done)> upload_progress;
  // Print the device's properties (log_info) when the backend starts.
  bool print_properties = true;
  // Tests: pin at most this many bytes of host expert tensors (whole tensors, in mapping order); with
  // stream_experts AUTO the rest stream as if RAM had run out. 0: no limit.
  uint64_t host_pin_limit = 0;
};

// Weight upload totals of a CUDA backend (load-rate reporting).
struct CudaUploadStats {
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  double seconds = 0;  // wall time spent in upload_weight (including the final drain)
  // Weights left in host memory (map_host_weight): pinned for the GPU to read, or streamed from the model file.
  uint64_t host_pinned_bytes = 0, host_streamed_bytes = 0;
  double rate_gbs() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0; }
};

// True when the CUDA runtime finds at least one usable device (false without
// a driver or GPU; never fails).
bool cuda_device_present();
// The usable CUDA devices (0 without a driver or GPU; never fails).
int cuda_device_count();

// A backend on CUDA device `device`. Fails with a clear message when the
// device does not exist or cannot be initialised.
expected<std::unique_ptr<Backend>> make_cuda_backend(int device = 0, const CudaBackendOptions& options = {});

// Upload totals of a backend made by make_cuda_backend (waits for pending copies).
CudaUploadStats cuda_upload_stats(Backend& backend);

}  // namespace dsv4
