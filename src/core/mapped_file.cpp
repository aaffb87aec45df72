#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

namespace dsv4 {

static const uint8_t k_empty_byte = 0;

expected<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error("cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error("cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error("'%s' is not a regular file", path.c_str());
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  f->stamp_ = file_stamp(st);
  if (f->size_ == 0) {
    f->data_ = &k_empty_byte;
    ::close(fd);
    return f;
  }
  // Shared, read-only: the pages are the page cache's own. A GPU may pin them in place to read routed experts
  // from host memory (Backend::map_host_weight); a private mapping would make that pin copy every page.
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) return make_error("cannot mmap '%s': %s", path.c_str(), std::strerror(e));
  f->data_ = static_cast<const uint8_t*>(p);
  f->owns_mapping_ = true;
  return f;
}

std::unique_ptr<MappedFile> MappedFile::from_memory(const void* data, size_t size, std::string name) {
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->data_ = size ? static_cast<const uint8_t*>(data) : &k_empty_byte;
  f->size_ = size;
  f->path_ = std::move(name);
  return f;
}

MappedFile::~MappedFile() {
  if (owns_mapping_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::prefetch(size_t offset, size_t length) const {
  if (!owns_mapping_ || offset >= size_) return;
  long page = ::sysconf(_SC_PAGESIZE);
  size_t start = offset & ~static_cast<size_t>(page - 1);
  size_t end = std::min(size_, offset + length);
  ::madvise(const_cast<uint8_t*>(data_) + start, end - start, MADV_WILLNEED);
}

}  // namespace dsv4
