// Safetensors files and Hugging Face checkpoint folders (read only, mmap'd).
//
// File layout (https://github.com/huggingface/safetensors, "format"):
//   u64 LE  header_len
//   header  header_len bytes of UTF-8 JSON: {"__metadata__": {str: str}?,
//           "<tensor>": {"dtype": "BF16", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
//   data    the tensors' bytes; data_offsets are relative to the start of this section,
//           row-major (PyTorch order: the LAST dim is contiguous), little-endian, no alignment.
//
// Reader contract: `SafetensorsFile::open` validates the whole header before returning —
// header length against the file size (and a 100 MB cap), JSON syntax, duplicate names,
// every field's type, dtype known, shape × dtype size == end − begin (overflow checked),
// offsets inside the data section, tensors neither overlapping nor leaving holes (the format
// requires the data section to be exactly covered). Any violation is an Error naming the
// tensor; nothing is read outside the mapping. Tensor data is not aligned: readers memcpy.
//
// GGUF relation: a PyTorch tensor [out, in] is GGUF ne = [in, out] with the same bytes order,
// so "rows" below are the last-dim rows of the tensor (all leading dims flattened).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"

namespace dsv4 {

// The whole-byte element types of the safetensors format. Sub-byte types (F4, F6_*) and complex
// types are rejected by name at parse time.
enum class StDtype : uint8_t {
  BOOL,
  U8,
  I8,
  U16,
  I16,
  U32,
  I32,
  U64,
  I64,
  F16,
  BF16,
  F32,
  F64,
  F8_E4M3,
  F8_E5M2,
  F8_E8M0,
};

const char* st_dtype_name(StDtype t);                              // header spelling, e.g. "BF16"
uint32_t st_dtype_size(StDtype t);                                 // bytes per element
bool st_dtype_is_integer(StDtype t);                               // BOOL, U*, I*
std::optional<StDtype> st_dtype_from_name(std::string_view name);  // exact header spelling

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<uint64_t> shape;    // PyTorch order (shape[0] slowest); empty = scalar (1 element)
  uint64_t data_begin = 0;        // data_offsets[0], relative to the data section
  uint64_t n_bytes = 0;           // data_offsets[1] - data_offsets[0]
  const uint8_t* data = nullptr;  // n_bytes bytes inside the mapping, no alignment guarantee

  uint64_t n_elements() const;       // product of shape (validated not to overflow)
  uint64_t row_length() const;       // last dim (1 for a scalar)
  uint64_t n_rows() const;           // n_elements / row_length (0 when the tensor is empty)
  std::string shape_string() const;  // "[4096, 1024]"
};

class SafetensorsFile {
 public:
  static constexpr uint64_t k_max_header_bytes = 100'000'000;  // same cap as the reference library

  static expected<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses caller-owned bytes (tests, fuzzing); they must outlive the object.
  static expected<std::unique_ptr<SafetensorsFile>> from_memory(const void* data, size_t size,
                                                                std::string name = "<memory>");

  const std::string& path() const { return file_->path(); }
  uint64_t file_size() const { return file_->size(); }
  uint64_t data_offset() const { return data_offset_; }              // 8 + header_len
  const std::vector<StTensor>& tensors() const { return tensors_; }  // sorted by data_begin
  const StTensor* find(std::string_view name) const;
  // "__metadata__" entries (string -> string), in header order.
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  static expected<std::unique_ptr<SafetensorsFile>> parse(std::unique_ptr<MappedFile> file);

  std::unique_ptr<MappedFile> file_;
  uint64_t data_offset_ = 0;
  std::vector<StTensor> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

// A checkpoint: one safetensors file, or a folder holding either
// `model.safetensors.index.json` ({"weight_map": {tensor: shard file}}) + its shards, or a single
// `model.safetensors`. Every tensor name is unique across shards, every index entry must resolve
// to that tensor in that shard, and every tensor of a shard must be listed in the index.
class HfCheckpoint {
 public:
  static expected<std::unique_ptr<HfCheckpoint>> open(const std::string& path);

  const std::string& path() const { return path_; }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // All tensors of all shards, sorted by name.
  const std::vector<const StTensor*>& tensors() const { return tensors_; }
  const StTensor* find(std::string_view name) const;

 private:
  HfCheckpoint() = default;
  Status add_file(std::unique_ptr<SafetensorsFile> f);
  void finish();

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<const StTensor*> tensors_;
  std::map<std::string, const StTensor*, std::less<>> by_name_;
};

// ---- element readers --------------------------------------------------------------------------
// All readers take a range of rows (see the file comment) and write n_rows * row_length values.
// Float outputs are checked finite; a NaN/Inf in a checkpoint is an Error naming the element.

// Plain float tensor (F32, F16, BF16, F64, F8_E4M3, F8_E5M2; FP8 without scales) to f32.
Status st_read_rows_f32(const StTensor& t, uint64_t first_row, uint64_t n_rows, float* out);
Status st_read_f32(const StTensor& t, float* out);  // whole tensor

// Block-scaled checkpoint formats (formats.md §7, model-spec.md §9.3):
//  FP8_BLOCK:  w F8_E4M3 [R, C], scale [ceil(R/128), ceil(C/128)];  value = e4m3(w[r][c]) * scale[r/128][c/128]
//  FP4_PACKED: w I8/U8 [R, C/2] (low nibble = even column), scale [R, C/32];
//              value = e2m1(nibble) * scale[r][c/32]
// The scale may be F8_E8M0 (2^(e-127); e = 0xFF is NaN and rejected), F32 or BF16.
enum class StScaledFormat { FP8_BLOCK, FP4_PACKED };
constexpr uint32_t k_fp8_block = 128;
constexpr uint32_t k_fp4_block = 32;
// Logical [R, C] of a scaled pair, or an Error if the shapes/dtypes do not fit the format.
expected<std::pair<uint64_t, uint64_t>> st_scaled_logical_shape(const StTensor& w, const StTensor& scale,
                                                                StScaledFormat fmt);
Status st_read_rows_f32_scaled(const StTensor& w, const StTensor& scale, StScaledFormat fmt, uint64_t first_row,
                               uint64_t n_rows, float* out);

// Integer tensor (BOOL, U8..I64) to int32; values outside int32 are an Error.
Status st_read_rows_i32(const StTensor& t, uint64_t first_row, uint64_t n_rows, int32_t* out);
Status st_read_i32(const StTensor& t, int32_t* out);  // whole tensor

}  // namespace dsv4
