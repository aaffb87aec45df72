// Helpers shared by the Hugging Face checkpoint tests (test_hf.cpp, test_hf_config.cpp): safetensors
// files built byte by byte, little-endian/bf16/f16 images of typed vectors, a scratch directory.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/float_conv.h"

namespace dsv4::hftest {

namespace fs = std::filesystem;

// ---- safetensors files built by hand (8-byte header length, JSON header, data) ----

struct Entry {
  std::string name;
  std::string dtype;  // header spelling
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

inline std::string shape_json(const std::vector<uint64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// 8-byte LE header length + header + data.
inline std::vector<uint8_t> raw_file(const std::string& header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  for (char ch : header) out.push_back(static_cast<uint8_t>(ch));
  for (uint8_t b : data) out.push_back(b);
  return out;
}

// A valid file: tensors stored back to back in the given order; optional header padding.
inline std::vector<uint8_t> build(const std::vector<Entry>& entries, const std::string& metadata = "", size_t pad = 0) {
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + metadata;
  std::vector<uint8_t> data;
  for (const auto& e : entries) {
    if (h.size() > 1) h += ",";
    uint64_t b = data.size();
    data.insert(data.end(), e.bytes.begin(), e.bytes.end());
    h += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":" + shape_json(e.shape) + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(data.size()) + "]}";
  }
  h += "}";
  h += std::string(pad, ' ');
  return raw_file(h, data);
}

template <class T>
std::vector<uint8_t> le_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

inline std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(f32_to_bf16(x));
  return le_bytes(h);
}

inline std::vector<uint8_t> f16_bytes(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(f32_to_f16(x));
  return le_bytes(h);
}

// Parses an in-memory file; the bytes are kept alive for the whole test run because the parsed
// tensors point into them.

struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / ("dsv4_test_hf_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }
  std::string write_text(const std::string& name, const std::string& text) const {
    return write(name, std::vector<uint8_t>(text.begin(), text.end()));
  }
};

}  // namespace dsv4::hftest
