// GGUF v3 reader. Every read goes through `Cursor`, which checks the remaining
// bytes first; the directory is validated completely before `open` returns.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "core/utf8.h"
#include "gguf/gguf.h"

namespace dsv4 {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "?";
}

namespace {

// Fixed size of a scalar value type; 0 for string/array (variable) and unknown.
uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL: return 1;
    case GgufType::U16:
    case GgufType::I16: return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32: return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64: return 8;
    case GgufType::STRING:
    case GgufType::ARRAY: return 0;
  }
  return 0;
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // host is little-endian (x86-64, aarch64)
  return v;
}

class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, uint64_t pos) : base_(base), size_(size), pos_(pos) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* ptr() const { return base_ + pos_; }

  Status need(uint64_t n, const char* what) const {
    if (n > remaining())
      return make_error("truncated file: %s needs %llu bytes at offset %llu but only %llu remain", what,
                        static_cast<unsigned long long>(n), static_cast<unsigned long long>(pos_),
                        static_cast<unsigned long long>(remaining()));
    return {};
  }
  template <class T>
  expected<T> read(const char* what) {
    DSV4_TRY(need(sizeof(T), what));
    T v = load_le<T>(ptr());
    pos_ += sizeof(T);
    return v;
  }
  Status skip(uint64_t n, const char* what) {
    DSV4_TRY(need(n, what));
    pos_ += n;
    return {};
  }
  expected<std::string_view> read_string(const char* what) {
    DSV4_TRY_ASSIGN(uint64_t len, read<uint64_t>(what));
    if (len > remaining())
      return make_error("truncated file: %s claims %llu bytes at offset %llu but only %llu remain", what,
                        static_cast<unsigned long long>(len), static_cast<unsigned long long>(pos_),
                        static_cast<unsigned long long>(remaining()));
    std::string_view s(reinterpret_cast<const char*>(ptr()), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_;
};

// Skips (and validates) one value of `type`; arrays recurse up to the depth cap.
Status skip_value(Cursor& c, GgufType type, int depth) {
  if (type == GgufType::STRING) {
    DSV4_TRY_ASSIGN(auto s, c.read_string("string value"));
    (void)s;
    return {};
  }
  if (type == GgufType::ARRAY) {
    if (depth >= k_gguf_max_array_depth)
      return make_error("arrays nested deeper than %d at offset %llu", k_gguf_max_array_depth,
                        static_cast<unsigned long long>(c.pos()));
    DSV4_TRY_ASSIGN(uint32_t et, c.read<uint32_t>("array element type"));
    if (!valid_value_type(et))
      return make_error("unknown array element type %u at offset %llu", et,
                        static_cast<unsigned long long>(c.pos() - 4));
    DSV4_TRY_ASSIGN(uint64_t count, c.read<uint64_t>("array length"));
    GgufType etype = static_cast<GgufType>(et);
    uint64_t es = scalar_size(etype);
    if (es) {
      if (count > c.remaining() / es)
        return make_error("truncated file: array of %llu %s at offset %llu runs past the end",
                          static_cast<unsigned long long>(count), gguf_type_name(etype),
                          static_cast<unsigned long long>(c.pos()));
      return c.skip(count * es, "array data");
    }
    // Variable-size elements need at least 8 (string length) or 12 (array header) bytes each.
    uint64_t min_elem = etype == GgufType::STRING ? 8 : 12;
    if (count > c.remaining() / min_elem)
      return make_error("absurd array length %llu at offset %llu (file has %llu bytes left)",
                        static_cast<unsigned long long>(count), static_cast<unsigned long long>(c.pos()),
                        static_cast<unsigned long long>(c.remaining()));
    for (uint64_t i = 0; i < count; ++i) DSV4_TRY(skip_value(c, etype, depth + 1));
    return {};
  }
  return c.skip(scalar_size(type), gguf_type_name(type));
}

GgufScalar decode_scalar(GgufType type, const uint8_t* p) {
  GgufScalar s;
  s.type = type;
  switch (type) {
    case GgufType::U8: s.u = load_le<uint8_t>(p); break;
    case GgufType::I8: s.i = load_le<int8_t>(p); break;
    case GgufType::U16: s.u = load_le<uint16_t>(p); break;
    case GgufType::I16: s.i = load_le<int16_t>(p); break;
    case GgufType::U32: s.u = load_le<uint32_t>(p); break;
    case GgufType::I32: s.i = load_le<int32_t>(p); break;
    case GgufType::U64: s.u = load_le<uint64_t>(p); break;
    case GgufType::I64: s.i = load_le<int64_t>(p); break;
    case GgufType::F32: s.f = load_le<float>(p); break;
    case GgufType::F64: s.f = load_le<double>(p); break;
    case GgufType::BOOL: s.u = load_le<uint8_t>(p) != 0; break;
    case GgufType::STRING: {
      uint64_t len = load_le<uint64_t>(p);
      s.s = std::string_view(reinterpret_cast<const char*>(p + 8), static_cast<size_t>(len));
      break;
    }
    case GgufType::ARRAY: break;
  }
  if (type == GgufType::I8 || type == GgufType::I16 || type == GgufType::I32 || type == GgufType::I64)
    s.u = static_cast<uint64_t>(s.i);
  return s;
}

std::string printable(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 64)) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f)
      out += ch;
    else
      out += strfmt("\\x%02x", c);
  }
  if (s.size() > 64) out += "...";
  return out;
}

}  // namespace

bool GgufScalar::is_integer() const {
  switch (type) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::U16:
    case GgufType::I16:
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::U64:
    case GgufType::I64: return true;
    default: return false;
  }
}

std::optional<double> GgufScalar::as_double() const {
  if (is_float()) return f;
  if (type == GgufType::BOOL) return static_cast<double>(u);
  if (!is_integer()) return std::nullopt;
  bool is_signed = type == GgufType::I8 || type == GgufType::I16 || type == GgufType::I32 || type == GgufType::I64;
  return is_signed ? static_cast<double>(i) : static_cast<double>(u);
}

std::optional<uint64_t> GgufScalar::as_u64() const {
  if (!is_integer()) return std::nullopt;
  bool is_signed = type == GgufType::I8 || type == GgufType::I16 || type == GgufType::I32 || type == GgufType::I64;
  if (is_signed) {
    if (i < 0) return std::nullopt;
    return static_cast<uint64_t>(i);
  }
  return u;
}

std::string GgufTensorInfo::shape_string() const {
  std::string s = "[";
  for (uint32_t d = 0; d < n_dims; ++d) s += strfmt(d ? ", %llu" : "%llu", static_cast<unsigned long long>(ne[d]));
  return s + "]";
}

expected<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  DSV4_TRY_ASSIGN(auto file, MappedFile::open(path));
  auto r = parse(std::move(file));
  if (!r) return r.error().with_context(path);
  return r;
}

expected<std::unique_ptr<GgufFile>> GgufFile::from_memory(const void* data, size_t size, std::string name) {
  auto r = parse(MappedFile::from_memory(data, size, name));
  if (!r) return r.error().with_context(name);
  return r;
}

expected<std::unique_ptr<GgufFile>> GgufFile::parse(std::unique_ptr<MappedFile> file) {
  std::unique_ptr<GgufFile> g(new GgufFile());
  const uint8_t* base = file->data();
  const uint64_t size = file->size();
  g->file_ = std::move(file);
  Cursor c(base, size, 0);

  if (size < 24)
    return make_error("not a GGUF file: only %llu bytes (a header needs 24)", static_cast<unsigned long long>(size));
  DSV4_TRY_ASSIGN(uint32_t magic, c.read<uint32_t>("magic"));
  if (magic != k_gguf_magic)
    return make_error("not a GGUF file: bad magic %02x %02x %02x %02x (expected \"GGUF\")", base[0], base[1], base[2],
                      base[3]);
  DSV4_TRY_ASSIGN(g->version_, c.read<uint32_t>("version"));
  if (g->version_ != k_gguf_version)
    return make_error("unsupported GGUF version %u (dsv4 reads version %u)", g->version_, k_gguf_version);
  DSV4_TRY_ASSIGN(uint64_t n_tensors, c.read<uint64_t>("tensor count"));
  DSV4_TRY_ASSIGN(uint64_t n_kv, c.read<uint64_t>("metadata count"));
  // A KV record is at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8 + 4 + 8 + 4 + 8.
  if (n_kv > c.remaining() / 13)
    return make_error("absurd metadata count %llu: cannot fit in the %llu bytes left (truncated or corrupt file)",
                      static_cast<unsigned long long>(n_kv), static_cast<unsigned long long>(c.remaining()));
  if (n_tensors > c.remaining() / 32)
    return make_error("absurd tensor count %llu: cannot fit in the %llu bytes left (truncated or corrupt file)",
                      static_cast<unsigned long long>(n_tensors), static_cast<unsigned long long>(c.remaining()));

  g->kvs_.reserve(static_cast<size_t>(n_kv));
  std::unordered_set<std::string_view> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    GgufKV kv;
    kv.offset = c.pos();
    DSV4_TRY_ASSIGN(kv.key, c.read_string("metadata key"));
    if (kv.key.empty())
      return make_error("empty metadata key at offset %llu", static_cast<unsigned long long>(kv.offset));
    if (!utf8_valid(kv.key))
      return make_error("metadata key at offset %llu is not valid UTF-8: \"%s\"",
                        static_cast<unsigned long long>(kv.offset), printable(kv.key).c_str());
    if (!keys.insert(kv.key).second)
      return make_error("duplicate metadata key \"%s\" at offset %llu", printable(kv.key).c_str(),
                        static_cast<unsigned long long>(kv.offset));
    DSV4_TRY_ASSIGN(uint32_t t, c.read<uint32_t>("metadata value type"));
    if (!valid_value_type(t))
      return make_error("unknown value type %u for metadata key \"%s\"", t, printable(kv.key).c_str());
    kv.type = static_cast<GgufType>(t);
    uint64_t value_pos = c.pos();
    if (kv.type == GgufType::ARRAY) {
      // Peek the array header for the accessors; skip_value validates it.
      DSV4_TRY(c.need(12, "array header"));
      uint32_t et = load_le<uint32_t>(c.ptr());
      kv.elem_type = static_cast<GgufType>(et);
      kv.count = load_le<uint64_t>(c.ptr() + 4);
      kv.payload = base + value_pos + 12;
    } else {
      kv.payload = base + value_pos;
    }
    auto st = skip_value(c, kv.type, 0);
    if (!st) return st.error().with_context(strfmt("metadata key \"%s\"", printable(kv.key).c_str()));
    kv.value = base + value_pos;
    kv.value_bytes = c.pos() - value_pos;
    g->kvs_.push_back(kv);
  }

  if (const GgufKV* a = g->find("general.alignment")) {
    if (a->type != GgufType::U32)
      return make_error("general.alignment must be a u32, found %s", gguf_type_name(a->type));
    uint64_t al = load_le<uint32_t>(a->payload);
    if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
      return make_error("general.alignment = %llu is not a power of two in [1, 2^20]",
                        static_cast<unsigned long long>(al));
    g->alignment_ = al;
  }

  g->tensors_.reserve(static_cast<size_t>(n_tensors));
  std::unordered_set<std::string_view> names;
  for (uint64_t ti = 0; ti < n_tensors; ++ti) {
    GgufTensorInfo t;
    uint64_t at = c.pos();
    DSV4_TRY_ASSIGN(t.name, c.read_string("tensor name"));
    if (t.name.empty()) return make_error("tensor %llu has an empty name", static_cast<unsigned long long>(ti));
    if (!utf8_valid(t.name))
      return make_error("tensor name at offset %llu is not valid UTF-8", static_cast<unsigned long long>(at));
    if (!names.insert(t.name).second) return make_error("duplicate tensor name \"%s\"", printable(t.name).c_str());
    std::string tname = printable(t.name);
    DSV4_TRY_ASSIGN(t.n_dims, c.read<uint32_t>("tensor dimension count"));
    if (t.n_dims == 0 || t.n_dims > k_gguf_max_dims)
      return make_error("tensor \"%s\" has %u dimensions (1..%u allowed)", tname.c_str(), t.n_dims, k_gguf_max_dims);
    uint64_t n_elem = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      DSV4_TRY_ASSIGN(t.ne[d], c.read<uint64_t>("tensor dimension"));
      if (t.ne[d] == 0) return make_error("tensor \"%s\" has a zero dimension", tname.c_str());
      if (t.ne[d] > (1ull << 40) || n_elem > (1ull << 62) / t.ne[d])
        return make_error("tensor \"%s\" element count overflows (%s)", tname.c_str(), t.shape_string().c_str());
      n_elem *= t.ne[d];
    }
    DSV4_TRY_ASSIGN(uint32_t type_id, c.read<uint32_t>("tensor type"));
    auto info = ggml_type_info(type_id);
    if (!info) return make_error("tensor \"%s\" has unknown ggml type %u", tname.c_str(), type_id);
    t.type = info->type;
    if (t.ne[0] % info->block_elems != 0)
      return make_error("tensor \"%s\": row length %llu is not a multiple of the %s block size %u", tname.c_str(),
                        static_cast<unsigned long long>(t.ne[0]), info->name, info->block_elems);
    t.n_bytes = n_elem / info->block_elems * info->block_bytes;
    DSV4_TRY_ASSIGN(t.rel_offset, c.read<uint64_t>("tensor data offset"));
    if (t.rel_offset % g->alignment_ != 0)
      return make_error("tensor \"%s\": data offset %llu is not a multiple of the alignment %llu", tname.c_str(),
                        static_cast<unsigned long long>(t.rel_offset), static_cast<unsigned long long>(g->alignment_));
    g->tensors_.push_back(t);
  }

  uint64_t infos_end = c.pos();
  uint64_t data_offset = (infos_end + g->alignment_ - 1) / g->alignment_ * g->alignment_;
  g->data_offset_ = data_offset;
  if (!g->tensors_.empty()) {
    if (data_offset > size)
      return make_error("truncated file: tensor data would start at %llu but the file has %llu bytes",
                        static_cast<unsigned long long>(data_offset), static_cast<unsigned long long>(size));
    uint64_t data_size = size - data_offset;
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(g->tensors_.size());
    for (const auto& t : g->tensors_) {
      if (t.rel_offset > data_size || t.n_bytes > data_size - t.rel_offset)
        return make_error(
            "truncated file: tensor \"%s\" (%llu bytes at data offset %llu) runs past the end of the file",
            printable(t.name).c_str(), static_cast<unsigned long long>(t.n_bytes),
            static_cast<unsigned long long>(t.rel_offset));
      by_offset.push_back(&t);
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->rel_offset < b->rel_offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const auto* a = by_offset[i - 1];
      const auto* b = by_offset[i];
      if (a->rel_offset + a->n_bytes > b->rel_offset)
        return make_error("tensor data overlaps: \"%s\" [%llu, %llu) and \"%s\" starting at %llu",
                          printable(a->name).c_str(), static_cast<unsigned long long>(a->rel_offset),
                          static_cast<unsigned long long>(a->rel_offset + a->n_bytes), printable(b->name).c_str(),
                          static_cast<unsigned long long>(b->rel_offset));
    }
  }
  return g;
}

uint64_t GgufFile::tensor_data_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.n_bytes;
  return n;
}

const GgufKV* GgufFile::find(std::string_view key) const {
  for (const auto& kv : kvs_)
    if (kv.key == key) return &kv;
  return nullptr;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

GgufScalar GgufFile::scalar(const GgufKV& kv) {
  DSV4_ASSERT(kv.type != GgufType::ARRAY, "scalar() on an array");
  return decode_scalar(kv.type, kv.payload);
}

expected<std::vector<GgufScalar>> GgufFile::array(const GgufKV& kv) {
  if (kv.type != GgufType::ARRAY)
    return make_error("metadata \"%s\" is a %s, not an array", printable(kv.key).c_str(), gguf_type_name(kv.type));
  if (kv.elem_type == GgufType::ARRAY)
    return make_error("metadata \"%s\" is a nested array", printable(kv.key).c_str());
  std::vector<GgufScalar> out;
  out.reserve(static_cast<size_t>(kv.count));  // bounded: the parse checked count against the file size
  const uint8_t* p = kv.payload;
  uint64_t es = scalar_size(kv.elem_type);
  for (uint64_t i = 0; i < kv.count; ++i) {
    out.push_back(decode_scalar(kv.elem_type, p));
    p += es ? es : 8 + load_le<uint64_t>(p);
  }
  return out;
}

expected<GgufScalar> GgufFile::get_scalar(std::string_view key) const {
  const GgufKV* kv = find(key);
  if (!kv) return make_error("missing metadata key \"%.*s\"", static_cast<int>(key.size()), key.data());
  if (kv->type == GgufType::ARRAY)
    return make_error("metadata key \"%.*s\" is an array, expected a single value", static_cast<int>(key.size()),
                      key.data());
  return scalar(*kv);
}

expected<std::string_view> GgufFile::get_string(std::string_view key) const {
  DSV4_TRY_ASSIGN(GgufScalar s, get_scalar(key));
  if (s.type != GgufType::STRING)
    return make_error("metadata key \"%.*s\" is a %s, expected a string", static_cast<int>(key.size()), key.data(),
                      gguf_type_name(s.type));
  return s.s;
}

expected<std::vector<GgufScalar>> GgufFile::get_array(std::string_view key) const {
  const GgufKV* kv = find(key);
  if (!kv) return make_error("missing metadata key \"%.*s\"", static_cast<int>(key.size()), key.data());
  return array(*kv);
}

std::string gguf_value_to_string(const GgufKV& kv, size_t max_array_items) {
  auto one = [](const GgufScalar& s) -> std::string {
    switch (s.type) {
      case GgufType::STRING: {
        std::string q = "\"";
        q += printable(s.s);
        q += "\"";
        return q;
      }
      case GgufType::BOOL: return s.u ? "true" : "false";
      case GgufType::F32:
      case GgufType::F64: return strfmt("%g", s.f);
      case GgufType::I8:
      case GgufType::I16:
      case GgufType::I32:
      case GgufType::I64: return strfmt("%lld", static_cast<long long>(s.i));
      default: return strfmt("%llu", static_cast<unsigned long long>(s.u));
    }
  };
  if (kv.type != GgufType::ARRAY) return one(GgufFile::scalar(kv));
  if (kv.elem_type == GgufType::ARRAY)
    return strfmt("[array of %llu arrays]", static_cast<unsigned long long>(kv.count));
  auto arr = GgufFile::array(kv);
  if (!arr) return "<" + arr.error().message + ">";
  std::string s = strfmt("[%s x %llu: ", gguf_type_name(kv.elem_type), static_cast<unsigned long long>(kv.count));
  for (size_t i = 0; i < arr->size() && i < max_array_items; ++i) s += (i ? ", " : "") + one((*arr)[i]);
  if (arr->size() > max_array_items) s += ", ...";
  return s + "]";
}

}  // namespace dsv4
