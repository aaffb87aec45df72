// Fuzz target: the Hugging Face checkpoint readers that `dsv4 convert` runs on downloaded files
// (hf/safetensors.h, hf/hf_config.h). The first byte picks the reader, the rest is its input:
//   even: a safetensors file. An accepted header must describe tensors that lie inside the data
//         section, sorted, without gaps or overlaps (the reader's contract); each small enough
//         tensor is then read whole by the element reader its dtype takes (floats checked finite,
//         integers range checked), and every FP8 / FP4 pair of tensors through the scaled reader
//         when their shapes fit.
//   odd:  a config.json text, parsed and validated.
// Every path must return a value or an Error, never crash, read outside the input or allocate
// beyond what the input can describe.
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "hf/hf_config.h"
#include "hf/safetensors.h"

namespace {

constexpr uint64_t k_max_elements = 1 << 16;  // tensors read whole by the harness

void read_tensors(const dsv4::SafetensorsFile& f, size_t size) {
  uint64_t next = 0;
  for (const auto& t : f.tensors()) {
    // Sorted by data_begin, exactly covering the data section, every byte inside the input.
    if (t.data_begin != next || f.data_offset() + t.data_begin + t.n_bytes > size) std::abort();
    next = t.data_begin + t.n_bytes;
    if (f.find(t.name) != &t) std::abort();
    const uint64_t n = t.n_elements();
    if (n > k_max_elements) continue;
    if (dsv4::st_dtype_is_integer(t.dtype)) {
      std::vector<int32_t> out(n);
      (void)dsv4::st_read_i32(t, out.data());
    } else {
      std::vector<float> out(n);
      (void)dsv4::st_read_f32(t, out.data());
    }
  }
  if (f.data_offset() + next != size) std::abort();
  // Scaled pairs: each tensor against each other as (weight, scale) in both formats.
  const auto& ts = f.tensors();
  for (size_t i = 0; i < ts.size() && i < 8; ++i)
    for (size_t j = 0; j < ts.size() && j < 8; ++j)
      for (auto fmt : {dsv4::StScaledFormat::FP8_BLOCK, dsv4::StScaledFormat::FP4_PACKED}) {
        auto rc = dsv4::st_scaled_logical_shape(ts[i], ts[j], fmt);
        if (!rc || rc->first == 0 || rc->second > k_max_elements) continue;
        const uint64_t rows = rc->first < 4 ? rc->first : 4;  // the first rows only
        std::vector<float> out(rows * rc->second);
        (void)dsv4::st_read_rows_f32_scaled(ts[i], ts[j], fmt, 0, rows, out.data());
      }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  if (data[0] % 2 == 0) {
    auto f = dsv4::SafetensorsFile::from_memory(body, n, "fuzz.safetensors");
    if (f) read_tensors(**f, n);
  } else {
    auto c = dsv4::hf_config_parse(std::string_view(reinterpret_cast<const char*>(body), n));
    if (c) (void)dsv4::hf_config_validate(*c);
  }
  return 0;
}
