#include "hf/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/float_conv.h"
#include "hf/json_check.h"

namespace dsv4 {

// ---- dtypes -----------------------------------------------------------------------------------

namespace {

struct DtypeInfo {
  StDtype type;
  const char* name;
  uint32_t size;
  bool integer;
};

constexpr DtypeInfo k_dtypes[] = {
    {StDtype::BOOL, "BOOL", 1, true},
    {StDtype::U8, "U8", 1, true},
    {StDtype::I8, "I8", 1, true},
    {StDtype::U16, "U16", 2, true},
    {StDtype::I16, "I16", 2, true},
    {StDtype::U32, "U32", 4, true},
    {StDtype::I32, "I32", 4, true},
    {StDtype::U64, "U64", 8, true},
    {StDtype::I64, "I64", 8, true},
    {StDtype::F16, "F16", 2, false},
    {StDtype::BF16, "BF16", 2, false},
    {StDtype::F32, "F32", 4, false},
    {StDtype::F64, "F64", 8, false},
    {StDtype::F8_E4M3, "F8_E4M3", 1, false},
    {StDtype::F8_E5M2, "F8_E5M2", 1, false},
    {StDtype::F8_E8M0, "F8_E8M0", 1, false},
};

const DtypeInfo& info(StDtype t) {
  for (const auto& d : k_dtypes)
    if (d.type == t) return d;
  DSV4_UNREACHABLE();
}

}  // namespace

const char* st_dtype_name(StDtype t) { return info(t).name; }
uint32_t st_dtype_size(StDtype t) { return info(t).size; }
bool st_dtype_is_integer(StDtype t) { return info(t).integer; }

std::optional<StDtype> st_dtype_from_name(std::string_view name) {
  for (const auto& d : k_dtypes)
    if (name == d.name) return d.type;
  return std::nullopt;
}

// ---- StTensor ---------------------------------------------------------------------------------

uint64_t StTensor::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // validated at parse time not to overflow
  return n;
}

uint64_t StTensor::row_length() const { return shape.empty() ? 1 : shape.back(); }

uint64_t StTensor::n_rows() const {
  uint64_t len = row_length();
  return len == 0 ? 0 : n_elements() / len;
}

std::string StTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ---- SafetensorsFile --------------------------------------------------------------------------

expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  DSV4_TRY_ASSIGN(auto file, MappedFile::open(path));
  return parse(std::move(file));
}

expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_memory(const void* data, size_t size,
                                                                        std::string name) {
  return parse(MappedFile::from_memory(data, size, std::move(name)));
}

const StTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

namespace {

// Reads a non-negative integer JSON value (no floats, no negatives).
bool json_u64(const nlohmann::json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return true;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

}  // namespace

expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(std::unique_ptr<MappedFile> file) {
  const std::string& fname = file->path();
  const uint64_t size = file->size();
  auto fail = [&](const Error& e) { return e.with_context("safetensors '" + fname + "'"); };
  if (size < 8)
    return fail(make_error("file is %llu bytes, shorter than the 8-byte header length", (unsigned long long)size));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file->data()[i];  // little-endian u64
  if (header_len == 0) return fail(make_error("header length is 0 (no JSON header)"));
  if (header_len > k_max_header_bytes)
    return fail(make_error("header length %llu exceeds the %llu-byte limit (corrupt length?)",
                           (unsigned long long)header_len, (unsigned long long)k_max_header_bytes));
  if (header_len > size - 8)
    return fail(make_error("header length %llu runs past the end of the %llu-byte file", (unsigned long long)header_len,
                           (unsigned long long)size));

  std::string_view text(reinterpret_cast<const char*>(file->data()) + 8, header_len);
  auto parsed = json_parse_checked(text);
  if (!parsed) return fail(parsed.error().with_context("header"));
  const nlohmann::json header = std::move(parsed).value();
  if (!header.is_object()) return fail(make_error("header JSON is not an object"));

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->data_offset_ = 8 + header_len;
  const uint64_t data_size = size - f->data_offset_;
  const uint8_t* data = file->data() + f->data_offset_;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& v = it.value();
    if (key == "__metadata__") {
      if (!v.is_object()) return fail(make_error("\"__metadata__\" is not an object"));
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return fail(make_error("\"__metadata__\" entry \"%s\" is not a string", m.key().c_str()));
        f->metadata_.emplace_back(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    auto tfail = [&](const Error& e) { return fail(e.with_context("tensor '" + key + "'")); };
    if (key.empty()) return fail(make_error("a tensor has an empty name"));
    if (!v.is_object()) return tfail(make_error("entry is not an object"));
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return tfail(make_error("missing or non-string \"dtype\""));
    if (sh == v.end() || !sh->is_array()) return tfail(make_error("missing or non-array \"shape\""));
    if (off == v.end() || !off->is_array() || off->size() != 2)
      return tfail(make_error("missing \"data_offsets\" or not an array of 2 integers"));
    for (auto k = v.begin(); k != v.end(); ++k)
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        return tfail(make_error("unknown field \"%s\"", k.key().c_str()));

    StTensor t;
    t.name = key;
    const std::string dts = dt->get<std::string>();
    auto dtype = st_dtype_from_name(dts);
    if (!dtype) return tfail(make_error("unsupported dtype \"%s\"", dts.c_str()));
    t.dtype = *dtype;
    uint64_t n_elem = 1;
    for (const auto& d : *sh) {
      uint64_t dim = 0;
      if (!json_u64(d, dim))
        return tfail(make_error("shape %s has a non-integer or negative dimension", sh->dump().c_str()));
      if (mul_overflows(n_elem, dim, n_elem))
        return tfail(make_error("shape %s overflows 64 bits", sh->dump().c_str()));
      t.shape.push_back(dim);
    }
    uint64_t expect_bytes = 0;
    if (mul_overflows(n_elem, st_dtype_size(t.dtype), expect_bytes))
      return tfail(make_error("shape %s x %s overflows 64 bits", sh->dump().c_str(), dts.c_str()));
    uint64_t begin = 0, end = 0;
    if (!json_u64((*off)[0], begin) || !json_u64((*off)[1], end))
      return tfail(make_error("data_offsets %s are not non-negative integers", off->dump().c_str()));
    if (end < begin)
      return tfail(make_error("data_offsets [%llu, %llu] end before they begin", (unsigned long long)begin,
                              (unsigned long long)end));
    if (end - begin != expect_bytes)
      return tfail(make_error("dtype %s x shape %s = %llu bytes, but data_offsets [%llu, %llu] span %llu bytes",
                              dts.c_str(), t.shape_string().c_str(), (unsigned long long)expect_bytes,
                              (unsigned long long)begin, (unsigned long long)end, (unsigned long long)(end - begin)));
    if (end > data_size)
      return tfail(make_error("data_offsets [%llu, %llu] run past the %llu-byte data section",
                              (unsigned long long)begin, (unsigned long long)end, (unsigned long long)data_size));
    t.data_begin = begin;
    t.n_bytes = end - begin;
    t.data = data + begin;
    f->tensors_.push_back(std::move(t));
  }

  // The data section must be covered exactly: sorted by offsets, each tensor starts where the
  // previous one ended (zero-size tensors included), and the last one ends at the file end.
  std::stable_sort(f->tensors_.begin(), f->tensors_.end(), [](const StTensor& a, const StTensor& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.n_bytes < b.n_bytes;
  });
  uint64_t pos = 0;
  const StTensor* prev = nullptr;
  for (const StTensor& t : f->tensors_) {
    if (t.data_begin < pos)
      return fail(make_error("tensors '%s' and '%s' overlap (bytes %llu..%llu of the data section)", prev->name.c_str(),
                             t.name.c_str(), (unsigned long long)t.data_begin, (unsigned long long)pos));
    if (t.data_begin > pos)
      return fail(make_error("gap of %llu bytes before tensor '%s' (data section bytes %llu..%llu are not covered)",
                             (unsigned long long)(t.data_begin - pos), t.name.c_str(), (unsigned long long)pos,
                             (unsigned long long)t.data_begin));
    pos = t.data_begin + t.n_bytes;
    prev = &t;
  }
  if (pos != data_size)
    return fail(make_error("%llu trailing bytes after the last tensor (data section %llu bytes, tensors end at %llu)",
                           (unsigned long long)(data_size - pos), (unsigned long long)data_size,
                           (unsigned long long)pos));
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->by_name_.emplace(f->tensors_[i].name, i);
  f->file_ = std::move(file);
  return f;
}

// ---- HfCheckpoint -----------------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

expected<std::string> read_text_file(const std::string& path) {
  DSV4_TRY_ASSIGN(auto m, MappedFile::open(path));
  return std::string(reinterpret_cast<const char*>(m->data()), m->size());
}

// A shard file name from an index: relative, no "..", not empty.
bool safe_relative(const std::string& p) {
  if (p.empty() || p.front() == '/') return false;
  for (const auto& part : fs::path(p))
    if (part == "..") return false;
  return true;
}

}  // namespace

Status HfCheckpoint::add_file(std::unique_ptr<SafetensorsFile> f) {
  for (const StTensor& t : f->tensors()) {
    auto [it, fresh] = by_name_.emplace(t.name, &t);
    if (!fresh)
      return make_error("tensor '%s' appears in two files (%s and another shard)", t.name.c_str(), f->path().c_str());
  }
  files_.push_back(std::move(f));
  return {};
}

void HfCheckpoint::finish() {
  tensors_.clear();
  for (const auto& [name, t] : by_name_) tensors_.push_back(t);
}

const StTensor* HfCheckpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

expected<std::unique_ptr<HfCheckpoint>> HfCheckpoint::open(const std::string& path) {
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return make_error("checkpoint '%s' does not exist", path.c_str());
  std::unique_ptr<HfCheckpoint> ck(new HfCheckpoint());
  ck->path_ = path;
  if (fs::is_regular_file(st)) {
    DSV4_TRY_ASSIGN(auto f, SafetensorsFile::open(path));
    DSV4_TRY(ck->add_file(std::move(f)));
    ck->finish();
    return ck;
  }
  if (!fs::is_directory(st)) return make_error("checkpoint '%s' is neither a file nor a folder", path.c_str());

  const fs::path dir(path);
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";
  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec))
      return make_error("folder '%s' has neither model.safetensors.index.json nor model.safetensors", path.c_str());
    DSV4_TRY_ASSIGN(auto f, SafetensorsFile::open(single_path.string()));
    DSV4_TRY(ck->add_file(std::move(f)));
    ck->finish();
    return ck;
  }

  auto ifail = [&](const Error& e) { return e.with_context("index '" + index_path.string() + "'"); };
  DSV4_TRY_ASSIGN(std::string text, read_text_file(index_path.string()));
  auto parsed = json_parse_checked(text);
  if (!parsed) return ifail(parsed.error());
  const nlohmann::json index = std::move(parsed).value();
  if (!index.is_object()) return ifail(make_error("not a JSON object"));
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return ifail(make_error("missing \"weight_map\" object"));
  if (wm->empty()) return ifail(make_error("\"weight_map\" is empty"));
  std::map<std::string, std::string> tensor_to_shard;
  std::set<std::string> shards;
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      return ifail(make_error("weight_map entry '%s' is not a file name string", it.key().c_str()));
    std::string shard = it.value().get<std::string>();
    if (!safe_relative(shard))
      return ifail(
          make_error("weight_map entry '%s' names an unsafe shard path '%s'", it.key().c_str(), shard.c_str()));
    tensor_to_shard.emplace(it.key(), shard);
    shards.insert(shard);
  }
  std::map<std::string, const SafetensorsFile*> shard_files;
  for (const std::string& shard : shards) {
    DSV4_TRY_ASSIGN(auto f, SafetensorsFile::open((dir / shard).string()));
    const SafetensorsFile* raw = f.get();
    if (auto added = ck->add_file(std::move(f)); !added) return ifail(added.error());
    shard_files.emplace(shard, raw);
  }
  for (const auto& [name, shard] : tensor_to_shard) {
    if (!shard_files.at(shard)->find(name))
      return ifail(make_error("tensor '%s' is listed in shard '%s' but that shard does not contain it", name.c_str(),
                              shard.c_str()));
  }
  for (const auto& [shard, f] : shard_files) {
    for (const StTensor& t : f->tensors()) {
      auto it = tensor_to_shard.find(t.name);
      if (it == tensor_to_shard.end() || it->second != shard)
        return ifail(make_error("shard '%s' holds tensor '%s' that the weight_map does not assign to it", shard.c_str(),
                                t.name.c_str()));
    }
  }
  ck->finish();
  return ck;
}

// ---- element readers --------------------------------------------------------------------------

namespace {

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // host is little-endian (x86-64 / aarch64), as the format
  return v;
}

float fp8_e5m2_to_f32(uint8_t b) {
  // e5m2 is the top byte of an IEEE binary16.
  return f16_to_f32(static_cast<uint16_t>(b) << 8);
}

Status check_rows(const StTensor& t, uint64_t first_row, uint64_t n_rows) {
  uint64_t total = t.n_rows();
  if (first_row > total || n_rows > total - first_row)
    return make_error("tensor '%s' %s: rows [%llu, %llu) out of range (%llu rows)", t.name.c_str(),
                      t.shape_string().c_str(), (unsigned long long)first_row, (unsigned long long)(first_row + n_rows),
                      (unsigned long long)total);
  return {};
}

Status non_finite(const StTensor& t, uint64_t flat_index) {
  return make_error("tensor '%s' holds a non-finite value at element %llu", t.name.c_str(),
                    (unsigned long long)flat_index);
}

// Decodes one element of a float dtype.
float decode_float(StDtype dt, const uint8_t* p) {
  switch (dt) {
    case StDtype::F32: return load_le<float>(p);
    case StDtype::F64: return static_cast<float>(load_le<double>(p));
    case StDtype::F16: return f16_to_f32(load_le<uint16_t>(p));
    case StDtype::BF16: return bf16_to_f32(load_le<uint16_t>(p));
    case StDtype::F8_E4M3: return fp8_e4m3_decode(*p);
    case StDtype::F8_E5M2: return fp8_e5m2_to_f32(*p);
    case StDtype::F8_E8M0: return *p == 0xFF ? NAN : e8m0_decode(*p);
    case StDtype::BOOL:
    case StDtype::U8:
    case StDtype::I8:
    case StDtype::U16:
    case StDtype::I16:
    case StDtype::U32:
    case StDtype::I32:
    case StDtype::U64:
    case StDtype::I64: break;
  }
  DSV4_UNREACHABLE();
}

bool scale_dtype_ok(StDtype dt) { return dt == StDtype::F8_E8M0 || dt == StDtype::F32 || dt == StDtype::BF16; }

}  // namespace

Status st_read_rows_f32(const StTensor& t, uint64_t first_row, uint64_t n_rows, float* out) {
  if (st_dtype_is_integer(t.dtype) || t.dtype == StDtype::F8_E8M0)
    return make_error("tensor '%s' has dtype %s, not a float weight type", t.name.c_str(), st_dtype_name(t.dtype));
  DSV4_TRY(check_rows(t, first_row, n_rows));
  const uint64_t len = t.row_length(), size = st_dtype_size(t.dtype);
  const uint64_t first = first_row * len, n = n_rows * len;
  const uint8_t* p = t.data + first * size;
  for (uint64_t i = 0; i < n; ++i) {
    float v = decode_float(t.dtype, p + i * size);
    if (!std::isfinite(v)) return non_finite(t, first + i);
    out[i] = v;
  }
  return {};
}

Status st_read_f32(const StTensor& t, float* out) { return st_read_rows_f32(t, 0, t.n_rows(), out); }

expected<std::pair<uint64_t, uint64_t>> st_scaled_logical_shape(const StTensor& w, const StTensor& scale,
                                                                StScaledFormat fmt) {
  auto bad = [&](const char* why) {
    return make_error("tensor '%s' %s %s with scale '%s' %s %s: %s", w.name.c_str(), st_dtype_name(w.dtype),
                      w.shape_string().c_str(), scale.name.c_str(), st_dtype_name(scale.dtype),
                      scale.shape_string().c_str(), why);
  };
  if (!scale_dtype_ok(scale.dtype)) return bad("scale dtype must be F8_E8M0, F32 or BF16");
  if (w.shape.size() != 2 || scale.shape.size() != 2) return bad("weight and scale must be 2-D");
  const uint64_t R = w.shape[0];
  switch (fmt) {
    case StScaledFormat::FP8_BLOCK: {
      if (w.dtype != StDtype::F8_E4M3) return bad("FP8 block format needs an F8_E4M3 weight");
      const uint64_t C = w.shape[1];
      const uint64_t sr = (R + k_fp8_block - 1) / k_fp8_block, sc = (C + k_fp8_block - 1) / k_fp8_block;
      if (scale.shape[0] != sr || scale.shape[1] != sc) return bad("scale must be [ceil(rows/128), ceil(cols/128)]");
      return std::pair<uint64_t, uint64_t>{R, C};
    }
    case StScaledFormat::FP4_PACKED: {
      if (w.dtype != StDtype::I8 && w.dtype != StDtype::U8) return bad("packed FP4 needs an I8/U8 weight");
      const uint64_t C = w.shape[1] * 2;
      if (C % k_fp4_block != 0) return bad("FP4 row length must be a multiple of 32");
      if (scale.shape[0] != R || scale.shape[1] != C / k_fp4_block) return bad("scale must be [rows, cols/32]");
      return std::pair<uint64_t, uint64_t>{R, C};
    }
  }
  DSV4_UNREACHABLE();
}

Status st_read_rows_f32_scaled(const StTensor& w, const StTensor& scale, StScaledFormat fmt, uint64_t first_row,
                               uint64_t n_rows, float* out) {
  DSV4_TRY_ASSIGN(auto rc, st_scaled_logical_shape(w, scale, fmt));
  const auto [R, C] = rc;
  if (first_row > R || n_rows > R - first_row)
    return make_error("tensor '%s': rows [%llu, %llu) out of range (%llu rows)", w.name.c_str(),
                      (unsigned long long)first_row, (unsigned long long)(first_row + n_rows), (unsigned long long)R);
  const uint64_t ssize = st_dtype_size(scale.dtype), scols = scale.shape[1];
  auto scale_at = [&](uint64_t sr, uint64_t sc) -> float {
    return decode_float(scale.dtype, scale.data + (sr * scols + sc) * ssize);
  };
  for (uint64_t r = first_row; r < first_row + n_rows; ++r) {
    float* dst = out + (r - first_row) * C;
    for (uint64_t c = 0; c < C; ++c) {
      float v = 0.0f;
      float s = 0.0f;
      switch (fmt) {
        case StScaledFormat::FP8_BLOCK:
          v = fp8_e4m3_decode(w.data[r * C + c]);
          s = scale_at(r / k_fp8_block, c / k_fp8_block);
          break;
        case StScaledFormat::FP4_PACKED: {
          uint8_t byte = w.data[r * (C / 2) + c / 2];
          v = fp4_e2m1_decode(static_cast<uint8_t>((c & 1) ? byte >> 4 : byte & 0xF));
          s = scale_at(r, c / k_fp4_block);
          break;
        }
      }
      if (!std::isfinite(s)) return make_error("scale tensor '%s' holds a non-finite scale", scale.name.c_str());
      float x = v * s;
      if (!std::isfinite(x)) return non_finite(w, r * C + c);
      dst[c] = x;
    }
  }
  return {};
}

Status st_read_rows_i32(const StTensor& t, uint64_t first_row, uint64_t n_rows, int32_t* out) {
  if (!st_dtype_is_integer(t.dtype))
    return make_error("tensor '%s' has dtype %s, not an integer type", t.name.c_str(), st_dtype_name(t.dtype));
  DSV4_TRY(check_rows(t, first_row, n_rows));
  const uint64_t len = t.row_length(), size = st_dtype_size(t.dtype);
  const uint64_t first = first_row * len, n = n_rows * len;
  const uint8_t* p = t.data + first * size;
  constexpr int64_t lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t* e = p + i * size;
    int64_t v = 0;
    bool range_ok = true;
    switch (t.dtype) {
      case StDtype::BOOL:
        v = *e;
        range_ok = *e <= 1;
        break;
      case StDtype::U8: v = *e; break;
      case StDtype::I8: v = static_cast<int8_t>(*e); break;
      case StDtype::U16: v = load_le<uint16_t>(e); break;
      case StDtype::I16: v = load_le<int16_t>(e); break;
      case StDtype::U32: v = load_le<uint32_t>(e); break;
      case StDtype::I32: v = load_le<int32_t>(e); break;
      case StDtype::I64: v = load_le<int64_t>(e); break;
      case StDtype::U64: {
        uint64_t u = load_le<uint64_t>(e);
        range_ok = u <= static_cast<uint64_t>(hi);
        v = range_ok ? static_cast<int64_t>(u) : 0;
        break;
      }
      case StDtype::F16:
      case StDtype::BF16:
      case StDtype::F32:
      case StDtype::F64:
      case StDtype::F8_E4M3:
      case StDtype::F8_E5M2:
      case StDtype::F8_E8M0: DSV4_UNREACHABLE();
    }
    if (!range_ok || v < lo || v > hi)
      return make_error("tensor '%s' element %llu does not fit int32", t.name.c_str(), (unsigned long long)(first + i));
    out[i] = static_cast<int32_t>(v);
  }
  return {};
}

Status st_read_i32(const StTensor& t, int32_t* out) { return st_read_rows_i32(t, 0, t.n_rows(), out); }

}  // namespace dsv4
