// Streaming GGUF v3 writer (see gguf.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "gguf/gguf.h"

namespace dsv4 {

namespace {

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof v);
  out.insert(out.end(), b, b + sizeof v);
}

void put_str(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Writes all of `n` bytes, retrying on short writes and EINTR.
Status write_all(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return make_error("writing '%s' failed: %s", path.c_str(), std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

}  // namespace

GgufWriter::GgufWriter(uint64_t alignment) : alignment_(alignment) {
  DSV4_ASSERT(alignment && (alignment & (alignment - 1)) == 0, "alignment must be a power of two");
  if (alignment != k_gguf_default_alignment) set_u32("general.alignment", static_cast<uint32_t>(alignment));
}

void GgufWriter::put_kv(std::string key, GgufType type, std::vector<uint8_t> value) {
  for (auto& kv : kvs_) {
    if (kv.key == key) {  // replace: keys are unique in a GGUF
      kv.type = type;
      kv.value = std::move(value);
      return;
    }
  }
  kvs_.push_back({std::move(key), type, std::move(value)});
}

#define DSV4_SETTER(fn, T, gt)                          \
  void GgufWriter::fn(std::string key, T v) {           \
    std::vector<uint8_t> b;                             \
    put<T>(b, v);                                       \
    put_kv(std::move(key), GgufType::gt, std::move(b)); \
  }
DSV4_SETTER(set_u8, uint8_t, U8)
DSV4_SETTER(set_i8, int8_t, I8)
DSV4_SETTER(set_u16, uint16_t, U16)
DSV4_SETTER(set_i16, int16_t, I16)
DSV4_SETTER(set_u32, uint32_t, U32)
DSV4_SETTER(set_i32, int32_t, I32)
DSV4_SETTER(set_u64, uint64_t, U64)
DSV4_SETTER(set_i64, int64_t, I64)
DSV4_SETTER(set_f32, float, F32)
DSV4_SETTER(set_f64, double, F64)
#undef DSV4_SETTER

void GgufWriter::set_bool(std::string key, bool v) {
  put_kv(std::move(key), GgufType::BOOL, {static_cast<uint8_t>(v ? 1 : 0)});
}

void GgufWriter::set_string(std::string key, std::string_view v) {
  std::vector<uint8_t> b;
  put_str(b, v);
  put_kv(std::move(key), GgufType::STRING, std::move(b));
}

template <class T>
static std::vector<uint8_t> array_bytes(GgufType et, const std::vector<T>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, static_cast<uint32_t>(et));
  put<uint64_t>(b, v.size());
  for (const T& x : v) put<T>(b, x);
  return b;
}

void GgufWriter::set_array_u32(std::string key, const std::vector<uint32_t>& v) {
  put_kv(std::move(key), GgufType::ARRAY, array_bytes(GgufType::U32, v));
}
void GgufWriter::set_array_i32(std::string key, const std::vector<int32_t>& v) {
  put_kv(std::move(key), GgufType::ARRAY, array_bytes(GgufType::I32, v));
}
void GgufWriter::set_array_f32(std::string key, const std::vector<float>& v) {
  put_kv(std::move(key), GgufType::ARRAY, array_bytes(GgufType::F32, v));
}
void GgufWriter::set_array_string(std::string key, const std::vector<std::string>& v) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(b, v.size());
  for (const auto& s : v) put_str(b, s);
  put_kv(std::move(key), GgufType::ARRAY, std::move(b));
}

void GgufWriter::set_raw(std::string key, GgufType type, std::vector<uint8_t> value_bytes) {
  put_kv(std::move(key), type, std::move(value_bytes));
}

void GgufWriter::copy_kv(const GgufFile&, const GgufKV& kv) {
  put_kv(std::string(kv.key), kv.type, std::vector<uint8_t>(kv.value, kv.value + kv.value_bytes));
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, TensorFill fill) {
  DSV4_ASSERT(!ne.empty() && ne.size() <= k_gguf_max_dims, "bad rank for %s", name.c_str());
  uint64_t n = 1;
  for (auto d : ne) n *= d;
  const auto& info = ggml_type_info(type);
  DSV4_ASSERT(ne[0] % info.block_elems == 0, "%s: ne0 %llu not a multiple of %s block", name.c_str(),
              static_cast<unsigned long long>(ne[0]), info.name);
  uint64_t bytes = n / info.block_elems * info.block_bytes;
  tensors_.push_back({std::move(name), type, std::move(ne), bytes, next_offset_, std::move(fill)});
  next_offset_ = align_up(next_offset_ + bytes, alignment_);
}

uint64_t GgufWriter::tensor_data_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.n_bytes;
  return n;
}

std::vector<uint8_t> GgufWriter::header_bytes() const {
  std::vector<uint8_t> h;
  put<uint32_t>(h, k_gguf_magic);
  put<uint32_t>(h, k_gguf_version);
  put<uint64_t>(h, tensors_.size());
  put<uint64_t>(h, kvs_.size());
  for (const auto& kv : kvs_) {
    put_str(h, kv.key);
    put<uint32_t>(h, static_cast<uint32_t>(kv.type));
    h.insert(h.end(), kv.value.begin(), kv.value.end());
  }
  for (const auto& t : tensors_) {
    put_str(h, t.name);
    put<uint32_t>(h, static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) put<uint64_t>(h, d);
    put<uint32_t>(h, static_cast<uint32_t>(t.type));
    put<uint64_t>(h, t.rel_offset);
  }
  h.resize(align_up(h.size(), alignment_), 0);
  return h;
}

uint64_t GgufWriter::file_bytes() const {
  uint64_t data = tensors_.empty() ? 0 : tensors_.back().rel_offset + align_up(tensors_.back().n_bytes, alignment_);
  return header_bytes().size() + data;
}

Status GgufWriter::write(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress,
                         size_t chunk_bytes) const {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error("cannot create '%s': %s", tmp.c_str(), std::strerror(errno));
  auto fail = [&](Error e) -> Status {
    ::close(fd);
    ::unlink(tmp.c_str());
    return e;
  };

  const uint64_t total = file_bytes();
  uint64_t written = 0;
  std::vector<uint8_t> header = header_bytes();
  if (auto st = write_all(fd, header.data(), header.size(), tmp); !st) return fail(st.error());
  written += header.size();
  if (progress) progress(written, total);

  std::vector<uint8_t> buf;
  static const uint8_t k_zeros[64] = {};
  for (const auto& t : tensors_) {
    uint64_t row_bytes = ggml_row_bytes(t.type, t.ne[0]);
    uint64_t n_rows = t.n_bytes / row_bytes;
    uint64_t rows_per_chunk = std::max<uint64_t>(1, chunk_bytes / row_bytes);
    for (uint64_t r = 0; r < n_rows; r += rows_per_chunk) {
      uint64_t nr = std::min(rows_per_chunk, n_rows - r);
      buf.assign(static_cast<size_t>(nr * row_bytes), 0);
      if (auto st = t.fill(r, nr, buf.data()); !st) return fail(st.error().with_context("tensor " + t.name));
      if (auto st = write_all(fd, buf.data(), buf.size(), tmp); !st) return fail(st.error());
      written += buf.size();
      if (progress) progress(written, total);
    }
    uint64_t pad = align_up(t.n_bytes, alignment_) - t.n_bytes;
    while (pad) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(pad, sizeof k_zeros));
      if (auto st = write_all(fd, k_zeros, n, tmp); !st) return fail(st.error());
      pad -= n;
      written += n;
    }
  }
  if (::fsync(fd) != 0) return fail(make_error("fsync '%s' failed: %s", tmp.c_str(), std::strerror(errno)));
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return make_error("closing '%s' failed: %s", tmp.c_str(), std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return make_error("cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(), std::strerror(e));
  }
  return {};
}

Status GgufWriter::write_mapped(int fd, const std::string& what,
                                const std::function<void(uint64_t, uint64_t)>& progress) const {
  const std::vector<uint8_t> header = header_bytes();
  const uint64_t total = file_bytes();
  if (total > static_cast<uint64_t>(std::numeric_limits<off_t>::max()))
    return make_error("'%s': %llu bytes is too large", what.c_str(), static_cast<unsigned long long>(total));
  if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); e != 0)
    return make_error("cannot reserve %.2f GiB for '%s': %s", static_cast<double>(total) / (1ull << 30), what.c_str(),
                      std::strerror(e));
  void* map = ::mmap(nullptr, static_cast<size_t>(total), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return make_error("cannot map '%s': %s", what.c_str(), std::strerror(errno));
  auto* base = static_cast<uint8_t*>(map);
  // posix_fallocate leaves the reserved range reading as zeros: padding needs no writes.
  std::memcpy(base, header.data(), header.size());
  uint64_t done = header.size();
  if (progress) progress(done, total);
  Status st;
  for (const auto& t : tensors_) {
    const uint64_t row_bytes = ggml_row_bytes(t.type, t.ne[0]);
    const uint64_t n_rows = t.n_bytes / row_bytes;
    if (n_rows) st = t.fill(0, n_rows, base + header.size() + t.rel_offset);
    if (!st) {
      st = st.error().with_context("tensor " + t.name);
      break;
    }
    done += align_up(t.n_bytes, alignment_);
    if (progress) progress(done, total);
  }
  ::munmap(map, static_cast<size_t>(total));
  return st;
}

Status GgufWriter::write_mapped(const std::string& path,
                                const std::function<void(uint64_t, uint64_t)>& progress) const {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error("cannot create '%s': %s", tmp.c_str(), std::strerror(errno));
  Status st = write_mapped(fd, tmp, progress);
  if (st && ::fsync(fd) != 0) st = make_error("fsync '%s' failed: %s", tmp.c_str(), std::strerror(errno));
  if (::close(fd) != 0 && st) st = make_error("closing '%s' failed: %s", tmp.c_str(), std::strerror(errno));
  if (st && ::rename(tmp.c_str(), path.c_str()) != 0)
    st = make_error("cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(), std::strerror(errno));
  if (!st) ::unlink(tmp.c_str());
  return st;
}

}  // namespace dsv4
