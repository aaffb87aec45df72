// Read-only memory mapping of a whole file (RAII).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/file_stamp.h"

namespace dsv4 {

class MappedFile {
 public:
  // Maps `path` read-only. An empty file maps to an empty span (data() != nullptr).
  static expected<std::unique_ptr<MappedFile>> open(const std::string& path);
  // Wraps caller-owned bytes (tests, fuzzing); no copy, the caller keeps them alive.
  static std::unique_ptr<MappedFile> from_memory(const void* data, size_t size, std::string name);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The file as it was when mapped (fstat of the descriptor mmap used); nullopt for memory spans.
  const std::optional<FileStamp>& stamp() const { return stamp_; }

  // Hints the kernel to read the range ahead (MADV_WILLNEED); no-op for memory spans.
  void prefetch(size_t offset, size_t length) const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owns_mapping_ = false;
  std::string path_;
  std::optional<FileStamp> stamp_;
};

}  // namespace dsv4
