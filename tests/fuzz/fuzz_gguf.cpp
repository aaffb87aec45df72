// Fuzz target: the GGUF reader must reject or accept any byte string without
// crashing, reading out of bounds or allocating without bound; on success every
// metadata value and tensor is walked.
#include <cstdint>
#include <cstring>

#include "gguf/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = dsv4::GgufFile::from_memory(data, size, "fuzz");
  if (!f) return 0;
  size_t sink = 0;
  for (const auto& kv : (*f)->kvs()) {
    sink += dsv4::gguf_value_to_string(kv, 4).size();
    if (kv.type == dsv4::GgufType::ARRAY) {
      auto arr = dsv4::GgufFile::array(kv);
      if (arr) sink += arr->size();
    }
  }
  for (const auto& t : (*f)->tensors()) {
    const uint8_t* p = (*f)->tensor_data(t);
    if (t.n_bytes) sink += p[0] + p[t.n_bytes - 1];
  }
  volatile size_t keep = sink;  // keeps the reads from being optimised away
  (void)keep;
  return 0;
}
