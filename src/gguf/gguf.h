// GGUF v3 container: bounds-checked reader over an mmap and a streaming writer
// (formats.md §1.1–§1.2).
//
// Reader contract: `GgufFile::open` validates the whole header, every metadata
// record and the tensor directory against the file size before returning.
// Every count, length, offset and size is checked before use; allocations are
// bounded by the file size; a malformed file yields an Error naming the
// problem and the byte offset. Metadata values are decoded lazily, by key.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/ggml_type.h"
#include "core/mapped_file.h"

namespace dsv4 {

enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* gguf_type_name(GgufType t);

constexpr uint32_t k_gguf_magic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t k_gguf_version = 3;
constexpr uint64_t k_gguf_default_alignment = 32;
constexpr uint32_t k_gguf_max_dims = 4;
constexpr int k_gguf_max_array_depth = 8;

// One decoded scalar (or string) value. Strings are views into the mapping.
struct GgufScalar {
  GgufType type = GgufType::U8;
  uint64_t u = 0;  // unsigned ints and bool
  int64_t i = 0;   // signed ints
  double f = 0;    // floats
  std::string_view s;

  bool is_integer() const;
  bool is_float() const { return type == GgufType::F32 || type == GgufType::F64; }
  // Value as double for any numeric type (ints, floats, bool).
  std::optional<double> as_double() const;
  // Value as u64 for any integer type holding a non-negative value.
  std::optional<uint64_t> as_u64() const;
};

struct GgufKV {
  std::string_view key;
  GgufType type;
  GgufType elem_type = GgufType::U8;  // arrays only
  uint64_t count = 0;                 // arrays only
  const uint8_t* payload = nullptr;   // value bytes (array: first element)
  uint64_t offset = 0;                // file offset of the record (for messages)
  const uint8_t* value = nullptr;     // encoded value as stored (array: from its header)
  uint64_t value_bytes = 0;           // size of the encoded value
};

struct GgufTensorInfo {
  std::string_view name;
  GgmlType type;
  uint32_t n_dims = 0;
  uint64_t ne[k_gguf_max_dims] = {1, 1, 1, 1};
  uint64_t rel_offset = 0;  // from the start of the data section
  uint64_t n_bytes = 0;

  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  uint64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  std::string shape_string() const;  // "[4096, 1024]"
};

class GgufFile {
 public:
  static expected<std::unique_ptr<GgufFile>> open(const std::string& path);
  // Parses an in-memory image (tests, fuzzing); the bytes must outlive the object.
  static expected<std::unique_ptr<GgufFile>> from_memory(const void* data, size_t size, std::string name = "<memory>");

  const std::string& path() const { return file_->path(); }
  uint64_t file_size() const { return file_->size(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t tensor_data_bytes() const;  // sum of tensor sizes (no padding)

  const std::vector<GgufKV>& kvs() const { return kvs_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufKV* find(std::string_view key) const;
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  const uint8_t* tensor_data(const GgufTensorInfo& t) const { return file_->data() + data_offset_ + t.rel_offset; }
  const MappedFile& mapping() const { return *file_; }

  // Scalar value of a non-array KV.
  static GgufScalar scalar(const GgufKV& kv);
  // Elements of an array of scalars/strings (nested arrays are an error).
  static expected<std::vector<GgufScalar>> array(const GgufKV& kv);

  // Convenience lookups; an absent key is an error naming it.
  expected<GgufScalar> get_scalar(std::string_view key) const;
  expected<std::string_view> get_string(std::string_view key) const;
  expected<std::vector<GgufScalar>> get_array(std::string_view key) const;

 private:
  GgufFile() = default;
  static expected<std::unique_ptr<GgufFile>> parse(std::unique_ptr<MappedFile> file);

  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = k_gguf_default_alignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  std::vector<GgufTensorInfo> tensors_;
};

// Human-readable rendering of a KV value (arrays abbreviated) for `inspect`.
std::string gguf_value_to_string(const GgufKV& kv, size_t max_array_items = 8);

// ---------------------------------------------------------------------------
// Writer: collects metadata and the tensor directory in memory, then streams
// the file: header, KVs, tensor infos, padding, tensor data (each tensor padded
// to the alignment). Data comes from a per-tensor fill callback called for
// consecutive runs of whole rows, so memory stays bounded for huge tensors.
// The file is written to "<path>.tmp" and renamed into place on success.
class GgufWriter {
 public:
  explicit GgufWriter(uint64_t alignment = k_gguf_default_alignment);

  void set_u8(std::string key, uint8_t v);
  void set_i8(std::string key, int8_t v);
  void set_u16(std::string key, uint16_t v);
  void set_i16(std::string key, int16_t v);
  void set_u32(std::string key, uint32_t v);
  void set_i32(std::string key, int32_t v);
  void set_u64(std::string key, uint64_t v);
  void set_i64(std::string key, int64_t v);
  void set_f32(std::string key, float v);
  void set_f64(std::string key, double v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string_view v);
  void set_array_u32(std::string key, const std::vector<uint32_t>& v);
  void set_array_i32(std::string key, const std::vector<int32_t>& v);
  void set_array_f32(std::string key, const std::vector<float>& v);
  void set_array_string(std::string key, const std::vector<std::string>& v);
  // Raw record: value bytes already encoded for `type` (used to copy KVs verbatim).
  void set_raw(std::string key, GgufType type, std::vector<uint8_t> value_bytes);
  // Copies one KV record from a parsed file byte for byte.
  void copy_kv(const GgufFile& src, const GgufKV& kv);

  // fill(row_begin, n_rows, dst): write n_rows whole rows (ne[0] elements each) into dst.
  using TensorFill = std::function<Status(uint64_t row_begin, uint64_t n_rows, uint8_t* dst)>;
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, TensorFill fill);

  size_t n_tensors() const { return tensors_.size(); }
  uint64_t tensor_data_bytes() const;  // without padding
  uint64_t file_bytes() const;         // exact size of the file write() produces

  // progress(bytes_written, total_bytes) is called now and then.
  Status write(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress = {},
               size_t chunk_bytes = 64ull << 20) const;
  // The same bytes written through a shared mapping of `fd` (an empty file
  // opened read-write; `what` names it in errors): the space is reserved first
  // (posix_fallocate: a full disk is an error here, never a fault later), then
  // each tensor's fill writes straight into the mapping, so fills that run in
  // parallel (synth) are not serialised behind write(). Used for in-memory
  // models (memfd) and by synth_write. The caller syncs and closes `fd`.
  Status write_mapped(int fd, const std::string& what,
                      const std::function<void(uint64_t, uint64_t)>& progress = {}) const;
  // write()'s contract (temp file, fsync, rename; nothing left behind on
  // failure) over write_mapped.
  Status write_mapped(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress = {}) const;

 private:
  struct Kv {
    std::string key;
    GgufType type;
    std::vector<uint8_t> value;
  };
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    uint64_t n_bytes;
    uint64_t rel_offset;
    TensorFill fill;
  };
  void put_kv(std::string key, GgufType type, std::vector<uint8_t> value);
  std::vector<uint8_t> header_bytes() const;

  uint64_t alignment_;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
  uint64_t next_offset_ = 0;
};

}  // namespace dsv4
