// test_cuda_memory: the CUDA backend when device memory runs out while its
// split-weight cache (GemmWeightCache, cuda_gemm.cuh) holds some: the cache
// must give way, so the allocation succeeds instead of failing, and the
// matmuls keep their bits (they split W per call from then on).
//
//   1. a backend whose cache keeps no reserve (gemm_cache_reserve = 0);
//   2. a Q8_0 weight of 8192 x 4096 and a matmul of 256 tokens: the cuBLAS
//      path makes W's split (E = 6 bytes per weight = 201 MB); device memory
//      drops by at least E (else the cuBLAS path is not in use here: skipped);
//   3. the test takes the device's free memory in 16 MiB blocks until
//      cudaMalloc fails, then asks the backend for a tensor of E / 2 bytes —
//      it exists only if the cache was released;
//   4. the same matmul again (W split per call now): bitwise equal to step 2;
//   5. the blocks are given back; a matmul of 512 tokens still runs and
//      matches one on a backend without the cache, bitwise.
//
//   test_cuda_memory [--seed N]
//
// Exit code non-zero on any failure, 77 without a CUDA device or cuBLAS.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

using namespace dsv4;
using namespace dsv4::cudatest;

namespace {

int g_ok = 0, g_fail = 0;

void check(bool good, const std::string& what) {
  std::printf("%-72s %s\n", what.c_str(), good ? "ok" : "FAIL");
  std::fflush(stdout);
  (good ? g_ok : g_fail)++;
}

size_t free_bytes() {
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) return 0;
  return f;
}

constexpr int64_t k_rows = 8192, k_cols = 4096;

struct Fixture {
  std::unique_ptr<Backend> be;
  Tensor w, x;
};

// A backend (the cache on or off) with the test's weight and an input of n tokens.
bool make(Fixture& f, bool cache, const std::vector<uint8_t>& w_bytes, const std::vector<float>& x_host, int64_t n) {
  CudaBackendOptions o;
  o.print_properties = false;
  o.gemm_weight_cache = cache;
  o.gemm_cache_reserve = 0;
  auto be = make_cuda_backend(0, o);
  if (!be) {
    std::printf("make_cuda_backend: %s\n", be.error().message.c_str());
    return false;
  }
  f.be = std::move(*be);
  const int64_t ne[4] = {k_cols, k_rows, 1, 1};
  auto w = f.be->upload_weight(w_bytes.data(), GgmlType::Q8_0, ne);
  if (!w) {
    std::printf("upload_weight: %s\n", w.error().message.c_str());
    return false;
  }
  f.w = *w;
  f.x = f.be->alloc(GgmlType::F32, k_cols, n);
  f.be->write(f.x, x_host.data(), static_cast<size_t>(n * k_cols) * sizeof(float));
  return true;
}

std::vector<float> matmul(Fixture& f, int64_t n) {
  Tensor out = f.be->alloc(GgmlType::F32, k_rows, n);
  f.be->matmul({out, f.w, f.x.rows(0, n)});
  std::vector<float> host(static_cast<size_t>(n * k_rows));
  f.be->read(out, host.data(), host.size() * sizeof(float));
  f.be->free(out);
  return host;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc)
      seed = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: test_cuda_memory [--seed N]\n");
      return 2;
    }
  }
  if (!cuda_device_present()) {
    std::printf("test_cuda_memory: no CUDA device, skipped\n");
    return 77;
  }
  Rng r(seed);
  const std::vector<uint8_t> w_bytes = random_weight(r, GgmlType::Q8_0, k_cols, k_rows);
  const int64_t n_max = 512;
  std::vector<float> x_host(static_cast<size_t>(n_max * k_cols));
  for (auto& v : x_host) v = r.normal();
  const size_t split_bytes = static_cast<size_t>(k_rows) * 3 * k_cols * 2;  // A' = [hi | lo | hi] f16

  // The reference of step 5 (no cache at all), and what its first matmul takes (the scratch).
  std::vector<float> ref512;
  size_t plain_took = 0;
  {
    Fixture plain;
    if (!make(plain, false, w_bytes, x_host, n_max)) return 1;
    const size_t f0 = free_bytes();
    (void)matmul(plain, 256);
    plain_took = f0 - free_bytes();
    ref512 = matmul(plain, n_max);
  }

  // Step 2: the same on a backend with the cache takes the split's bytes more.
  Fixture f;
  if (!make(f, true, w_bytes, x_host, n_max)) return 1;
  const size_t f0 = free_bytes();
  const std::vector<float> first = matmul(f, 256);
  const size_t cached_took = f0 - free_bytes();
  std::printf(
      "the first matmul of 256 tokens took %.1f MiB without the cache, %.1f MiB with it (the split: %.1f MiB)\n",
      static_cast<double>(plain_took) / (1 << 20), static_cast<double>(cached_took) / (1 << 20),
      static_cast<double>(split_bytes) / (1 << 20));
  if (cached_took < plain_took + split_bytes) {
    std::printf("test_cuda_memory: no split-weight cache here (no cuBLAS path?): skipped\n");
    return 77;
  }

  // Step 3: take the free memory.
  std::vector<void*> blocks;
  const size_t block = size_t{16} << 20;
  for (;;) {
    void* p = nullptr;
    if (cudaMalloc(&p, block) != cudaSuccess) {
      (void)cudaGetLastError();
      break;
    }
    blocks.push_back(p);
    if (blocks.size() > (size_t{1} << 16)) break;  // 1 TiB: something is wrong with the count
  }
  const size_t left = free_bytes();
  std::printf("took %zu blocks of 16 MiB; %.1f MiB left free; the split holds %.1f MiB\n", blocks.size(),
              static_cast<double>(left) / (1 << 20), static_cast<double>(split_bytes) / (1 << 20));
  if (left >= split_bytes / 2) {  // the allocation below would succeed without a release
    std::printf("test_cuda_memory: %.1f MiB still free after taking the device: cannot test\n",
                static_cast<double>(left) / (1 << 20));
    for (void* p : blocks) (void)cudaFree(p);
    return 1;
  }
  Tensor big = f.be->alloc(GgmlType::F32, static_cast<int64_t>(split_bytes / 2 / sizeof(float)));
  check(static_cast<bool>(big), "out of memory: a tensor of half the split's bytes is allocated (cache released)");
  check(free_bytes() > left, "out of memory: free memory after the release and the allocation exceeds what was left");

  // Step 4: the same matmul, W now split per call.
  check(same(matmul(f, 256), first), "after the release: matmul of 256 tokens bitwise equal to the cached one");
  f.be->free(big);
  for (void* p : blocks) (void)cudaFree(p);

  // Step 5: the scratch grows (512 tokens) with the cache released; against the backend that never had one.
  check(same(matmul(f, n_max), ref512), "after the release: matmul of 512 tokens bitwise equal to no cache");

  std::printf("SUMMARY test_cuda_memory: %d passed, %d failed (seed %llu)\n", g_ok, g_fail,
              static_cast<unsigned long long>(seed));
  return g_fail == 0 ? 0 : 1;
}
