// Micro-benchmark: can the CPU compute routed experts from host memory while
// the GPU reads other experts from the same memory over the bus, and how do the
// two rates combine? The question behind CudaOptions::cpu_experts
// (docs/design-notes/expert-offload.md): a second path to the host experts
// pays only if the CPU's reads do not take the GPU's bandwidth.
//
//   built with -DDSV4_CUDA=ON as build/bench/host_contention; scripts/gpu.sh micro runs it.
//
// Host memory: SIZE bytes of anonymous memory (filled, then registered
// read-only and mapped with cudaHostRegister, as the engine registers the model
// file's mapping). Its first half holds the experts the GPU reads; the second
// half the experts the CPU computes: q2 Flash shapes (IQ2_XXS gate and up
// [2048 x 4096], Q2_K down [4096 x 2048], 7.08 MB an expert), random bytes with
// small finite scales. Phases of ~1.5 s each:
//   gpu alone   a streaming kernel (16-byte loads, 4 in flight per thread, 4
//               blocks per SM) reads the GPU half in place, repeatedly: GB/s
//   cpu alone   HostExperts::run (backend/host: Q8_K activations, AVX2 integer
//               dots, all cores but one) on 2 experts of one token at a time,
//               different experts each call: GB/s of expert bytes, ms per call
//   cpu cached  the same on one expert over and over (7 MB, cache-resident: the
//               CPU's compute rate without DRAM)
//   both        gpu alone and cpu alone at the same time: each rate
//   both cached gpu alone and cpu cached at the same time
//
// Usage: host_contention [GiB (default 8)] [cpu threads (default 0: all but one)]
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "backend/host/host_experts.h"
#include "core/float_conv.h"
#include "cuda_check.h"

namespace {

using dsv4::GgmlType;

constexpr int64_t k_d = 4096, k_f = 2048;
constexpr int64_t k_gate_bytes = k_f * (k_d / 256) * 66;  // IQ2_XXS
constexpr int64_t k_down_bytes = k_d * (k_f / 256) * 84;  // Q2_K
constexpr int64_t k_expert_bytes = 2 * k_gate_bytes + k_down_bytes;

__global__ void read_kernel(const uint4* __restrict__ p, int64_t n16, unsigned* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned s = 0;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    s += a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n16; i += stride) s += p[i].x;
  if (s == 0x12345678u) *out = s;  // keeps the loads
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Experts {
  const uint8_t* base;
  int64_t count;
};

// One stacked matrix of `count` experts laid out expert by expert (gate, up, down of an expert adjacent).
dsv4::HostExpertMatrix matrix(const Experts& e, int which) {
  const int64_t off = which == 0 ? 0 : which == 1 ? k_gate_bytes : 2 * k_gate_bytes;
  return {which == 2 ? GgmlType::Q2_K : GgmlType::IQ2_XXS,
          e.base + off,
          which == 2 ? k_d : k_f,
          which == 2 ? k_f : k_d,
          k_expert_bytes,
          e.count};
}

struct CpuResult {
  double gbs = 0, ms_per_call = 0;
};

// HostExperts on 2 experts of one token per call until stop; `cached`: expert 0 every call.
CpuResult cpu_loop(dsv4::HostExperts& he, const Experts& e, bool cached, const std::atomic<bool>& stop,
                   double min_seconds) {
  std::vector<float> x(k_d), y(2 * k_d), w{0.5f, 0.5f};
  for (int64_t i = 0; i < k_d; ++i) x[static_cast<size_t>(i)] = std::sin(0.1f * static_cast<float>(i));
  dsv4::HostExpertTask t;
  t.gate = matrix(e, 0);
  t.up = matrix(e, 1);
  t.down = matrix(e, 2);
  t.n_tokens = 1;
  t.k = cached ? 1 : 2;
  t.x = x.data();
  t.weights = w.data();
  t.y = y.data();
  int32_t ids[2];
  t.experts = ids;
  uint64_t calls = 0, experts = 0;
  const double t0 = now();
  while (!stop.load() || now() - t0 < min_seconds) {
    const int64_t e0 = cached ? 0 : static_cast<int64_t>((calls * 2) % static_cast<uint64_t>(e.count - 1));
    ids[0] = static_cast<int32_t>(-1 - e0);
    ids[1] = static_cast<int32_t>(-2 - e0);
    experts += static_cast<uint64_t>(he.run(t));
    ++calls;
    if (stop.load() && now() - t0 >= min_seconds) break;
  }
  const double s = now() - t0;
  return {static_cast<double>(experts) * static_cast<double>(k_expert_bytes) / s / 1e9,
          1e3 * s / static_cast<double>(calls)};
}

// The GPU reads [p, p + bytes) repeatedly for about `seconds`: GB/s.
double gpu_loop(const uint8_t* dev, size_t bytes, unsigned* out, int sms, double seconds) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double total = 0, secs = 0;
  const double t0 = now();
  while (now() - t0 < seconds) {
    CK(cudaEventRecord(e0));
    read_kernel<<<4 * sms, 256>>>(reinterpret_cast<const uint4*>(dev), static_cast<int64_t>(bytes / 16), out);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    total += static_cast<double>(bytes);
    secs += ms / 1e3;
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return total / secs / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 8.0;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 0;
  const size_t bytes = static_cast<size_t>(gib * (1ull << 30)) / 4096 * 4096;
  auto* host = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (host == MAP_FAILED) {
    std::fprintf(stderr, "host_contention: cannot map %.1f GiB\n", gib);
    return 1;
  }
  // Random bytes; every 2-byte scale field small and finite (IQ2_XXS: d at the block start; Q2_K: d, dmin at 80).
  std::mt19937_64 g(1);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t v = g();
    std::memcpy(host + i, &v, 8);
  }
  const uint16_t d = dsv4::f32_to_f16(1e-3f);
  const size_t half = bytes / 2;
  const Experts cpu_e{host + half, static_cast<int64_t>(half) / k_expert_bytes};
  for (int64_t e = 0; e < cpu_e.count; ++e) {
    uint8_t* x = host + half + static_cast<size_t>(e * k_expert_bytes);
    for (int64_t b = 0; b < 2 * k_gate_bytes; b += 66) std::memcpy(x + b, &d, 2);
    for (int64_t b = 0; b < k_down_bytes; b += 84) {
      std::memcpy(x + 2 * k_gate_bytes + b + 80, &d, 2);
      std::memcpy(x + 2 * k_gate_bytes + b + 82, &d, 2);
    }
  }
  int read_only = 0, sms = 0;
  CK(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaHostRegister(host, bytes, cudaHostRegisterMapped | (read_only ? cudaHostRegisterReadOnly : 0u)));
  void* dev = nullptr;
  CK(cudaHostGetDevicePointer(&dev, host, 0));
  unsigned* out = nullptr;
  CK(cudaMalloc(&out, sizeof(unsigned)));
  dsv4::HostExperts he(threads);
  std::printf(
      "host_contention: %.1f GiB registered; GPU reads %.1f GiB in place, the CPU computes %lld q2 experts "
      "(%d threads)\n",
      gib, static_cast<double>(half) / (1ull << 30), static_cast<long long>(cpu_e.count), he.threads());
  std::printf("%-12s %9s %9s %12s %9s\n", "phase", "gpu GB/s", "cpu GB/s", "cpu ms/call", "sum GB/s");
  auto row = [](const char* name, double gpu, CpuResult cpu) {
    std::printf("%-12s %9.1f %9.1f %12.3f %9.1f\n", name, gpu, cpu.gbs, cpu.ms_per_call, gpu + cpu.gbs);
    std::fflush(stdout);
  };
  std::atomic<bool> stop{true};
  const double secs = 1.5;
  row("gpu alone", gpu_loop(static_cast<const uint8_t*>(dev), half, out, sms, secs), {});
  row("cpu alone", 0, cpu_loop(he, cpu_e, false, stop, secs));
  row("cpu cached", 0, cpu_loop(he, cpu_e, true, stop, secs));
  for (bool cached : {false, true}) {
    stop = false;
    CpuResult c;
    std::thread th([&] { c = cpu_loop(he, cpu_e, cached, stop, 0.0); });
    const double gpu = gpu_loop(static_cast<const uint8_t*>(dev), half, out, sms, secs);
    stop = true;
    th.join();
    row(cached ? "both cached" : "both", gpu, c);
  }
  CK(cudaHostUnregister(host));
  munmap(host, bytes);
  return 0;
}
