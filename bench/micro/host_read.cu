// Micro-benchmark: how fast can the GPU read weights that stay in host memory?
// The question behind running the model where it does not fit (routed experts
// in host memory, docs/design-notes/expert-offload.md): copy the chosen experts
// over PCIe before use, or let the expert kernels read host memory in place
// (zero copy), and at what rate each.
//
//   built with -DDSV4_CUDA=ON as build/bench/host_read (or: nvcc -O3 -arch=sm_90 -o host_read
//   bench/micro/host_read.cu); scripts/gpu.sh micro runs it.
//
// Host memory as the engine would hold it: a file in /dev/shm (the model file's
// own pages; a disk file in the page cache behaves alike), mapped with mmap and
// registered with cudaHostRegister (read-only, mapped) — no second copy — and,
// for comparison, a cudaMallocHost buffer. Cases (GB/s over SIZE bytes):
//   memcpy    cudaMemcpyAsync host -> device, whole buffer, and in 7 MiB pieces
//             (one q2 routed expert is 7.07 MB) from random offsets
//   kernel    a streaming read kernel (16-byte loads, U loads in flight per
//             thread, B blocks of 256 threads) over the mapped pointer: what an
//             expert matvec reading its weights in place could reach; the same
//             kernel over device memory for reference
// Every kernel read is checked: the 32-bit sum of the words read must equal
// the host's (WRONG and exit code 1 otherwise).
//
// Usage: host_read [GiB (default 4)] [path (default /dev/shm/dsv4-host-read)]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.h"

namespace {

// Sums every 32-bit word of [p, p + n16 * 16) into *sum (wrapping); U 16-byte loads in flight per thread.
template <int U>
__global__ void __launch_bounds__(256) read_kernel(const uint4* __restrict__ p, size_t n16, unsigned* sum) {
  unsigned acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = p[i + u * stride];
#pragma unroll
    for (int u = 0; u < U; ++u) acc += v[u].x + v[u].y + v[u].z + v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = p[i];
    acc += v.x + v.y + v.z + v.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, acc);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
  }
  void start() { CK(cudaEventRecord(a)); }
  double stop() {  // seconds
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    return ms / 1e3;
  }
};

int failures = 0;

// Streams `bytes` from p with the kernel; checks the sum; prints GB/s.
template <int U>
void kernel_case(const char* what, const void* p, size_t bytes, unsigned want, int blocks, unsigned* d_sum) {
  Timer t;
  double best = 1e30;
  unsigned got = 0;
  for (int rep = 0; rep < 3; ++rep) {
    CK(cudaMemset(d_sum, 0, sizeof(unsigned)));
    t.start();
    read_kernel<U><<<blocks, 256>>>(static_cast<const uint4*>(p), bytes / 16, d_sum);
    CK(cudaGetLastError());
    best = std::min(best, t.stop());
    CK(cudaMemcpy(&got, d_sum, sizeof(unsigned), cudaMemcpyDeviceToHost));
  }
  const bool ok = got == want;
  if (!ok) ++failures;
  std::printf("kernel  %-22s U=%d blocks=%5d  %7.1f GB/s%s\n", what, U, blocks, bytes / best / 1e9,
              ok ? "" : "  WRONG (sum differs)");
}

}  // namespace

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 4.0;
  const std::string path = argc > 2 ? argv[2] : "/dev/shm/dsv4-host-read";
  const size_t bytes = static_cast<size_t>(gib * (1ull << 30)) / 4096 * 4096;
  if (bytes < (64u << 20)) {
    std::fprintf(stderr, "host_read: %.2f GiB is too small (at least 64 MiB)\n", gib);
    return 2;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("host_read: %s, %.2f GiB from %s (mmap + cudaHostRegister) and from cudaMallocHost\n", prop.name,
              bytes / double(1ull << 30), path.c_str());

  // The file: filled with a pattern, mapped, registered.
  const auto t0 = std::chrono::steady_clock::now();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    std::fprintf(stderr, "host_read: cannot create %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  auto* map = static_cast<uint32_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  if (map == MAP_FAILED) {
    std::fprintf(stderr, "host_read: mmap: %s\n", std::strerror(errno));
    return 1;
  }
  unsigned want = 0;
  for (size_t i = 0; i < bytes / 4; ++i) {
    map[i] = static_cast<uint32_t>(i * 2654435761u);
    want += map[i];
  }
  std::printf("file written and summed in %.1f s\n", seconds_since(t0));
  auto t1 = std::chrono::steady_clock::now();
  CK(cudaHostRegister(map, bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly));
  std::printf("cudaHostRegister of the mapping: %.2f s\n", seconds_since(t1));
  void* mapped_dev = nullptr;
  CK(cudaHostGetDevicePointer(&mapped_dev, map, 0));

  void* pinned = nullptr;
  CK(cudaMallocHost(&pinned, bytes));
  std::memcpy(pinned, map, bytes);
  void* dev = nullptr;
  CK(cudaMalloc(&dev, bytes));
  unsigned* d_sum = nullptr;
  CK(cudaMalloc(&d_sum, sizeof(unsigned)));

  // Copies.
  Timer t;
  for (int src = 0; src < 2; ++src) {
    const void* h = src == 0 ? static_cast<const void*>(map) : pinned;
    const char* name = src == 0 ? "registered mmap" : "cudaMallocHost";
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      t.start();
      CK(cudaMemcpyAsync(dev, h, bytes, cudaMemcpyHostToDevice));
      best = std::min(best, t.stop());
    }
    std::printf("memcpy  %-22s whole        %7.1f GB/s\n", name, bytes / best / 1e9);
    // 7 MiB pieces from random offsets (experts chosen by the router), back to back on one stream.
    const size_t piece = 7u << 20, pieces = std::min<size_t>(bytes / piece, 256);
    std::mt19937_64 rng(1);
    t.start();
    for (size_t k = 0; k < pieces; ++k) {
      const size_t off = rng() % (bytes / piece) * piece;
      CK(cudaMemcpyAsync(static_cast<char*>(dev) + k % (bytes / piece) * piece, static_cast<const char*>(h) + off,
                         piece, cudaMemcpyHostToDevice));
    }
    std::printf("memcpy  %-22s 7 MiB pieces %7.1f GB/s\n", name, pieces * piece / t.stop() / 1e9);
  }
  CK(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice));

  // Kernels reading in place.
  const int sms = prop.multiProcessorCount;
  for (int mult : {1, 2, 4, 8}) {
    kernel_case<1>("registered mmap", mapped_dev, bytes, want, sms * mult, d_sum);
    kernel_case<4>("registered mmap", mapped_dev, bytes, want, sms * mult, d_sum);
  }
  void* pinned_dev = nullptr;
  CK(cudaHostGetDevicePointer(&pinned_dev, pinned, 0));
  kernel_case<4>("cudaMallocHost", pinned_dev, bytes, want, sms * 4, d_sum);
  kernel_case<4>("device memory", dev, bytes, want, sms * 4, d_sum);

  CK(cudaHostUnregister(map));
  munmap(map, bytes);
  close(fd);
  unlink(path.c_str());
  CK(cudaFreeHost(pinned));
  CK(cudaFree(dev));
  CK(cudaFree(d_sum));
  std::printf("host_read: %s\n", failures ? "WRONG results above" : "all sums checked");
  return failures ? 1 : 0;
}
