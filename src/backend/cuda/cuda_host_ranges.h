// Host memory registered for the GPU (Backend::map_host_weight): each range's device-usable address and its host
// address. One table per backend (CudaContext::host_ranges), read by everything that must reach registered
// experts from the host side: the CPU's share of host experts, expert streaming's mixed ops, the prefill
// prefetch's copies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

namespace dsv4::cuda {

struct HostRange {
  const uint8_t* dev = nullptr;
  const uint8_t* host = nullptr;
  size_t bytes = 0;
  int64_t expert_bytes = 0;  // one expert of the stacked matrix it holds
};

class HostRanges {
 public:
  void add(const HostRange& r) { by_dev_[reinterpret_cast<uintptr_t>(r.dev)] = r; }
  // The range holding device-usable address p; nullptr when none does.
  const HostRange* find(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = by_dev_.upper_bound(a);
    if (it == by_dev_.begin()) return nullptr;
    --it;
    return a - it->first < it->second.bytes ? &it->second : nullptr;
  }
  // The host address of device-usable address p; nullptr when p is in no range.
  const uint8_t* host_of(const void* p) const {
    const HostRange* r = find(p);
    return r ? r->host + (static_cast<const uint8_t*>(p) - r->dev) : nullptr;
  }
  const std::map<uintptr_t, HostRange>& all() const { return by_dev_; }

 private:
  std::map<uintptr_t, HostRange> by_dev_;
};

}  // namespace dsv4::cuda
