#pragma once

// Minimal safetensors reader for the tests' reference fixtures (F32, F64, I64,
// BF16). Test-only stand-in until io::safetensors lands; replace its uses then.
// Format: 8-byte little-endian header length N, N bytes of JSON
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the data.

#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <boost/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace ditrl::test {

struct SafetensorsFile {
  std::string path;
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;

  const at::Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) fail("{}: no tensor '{}'", path, name);
    return it->second;
  }
  bool has(const std::string& name) const { return tensors.count(name) > 0; }
};

inline SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (bytes.size() < 8) fail("{}: shorter than the 8-byte header length", path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[i]);
  if (8 + header_len > bytes.size()) fail("{}: header length {} exceeds the file", path, header_len);
  const boost::json::object header = boost::json::parse(std::string(bytes.data() + 8, header_len)).as_object();
  const char* data = bytes.data() + 8 + header_len;
  const uint64_t data_len = bytes.size() - 8 - header_len;

  SafetensorsFile file;
  file.path = path;
  for (const auto& [key, value] : header) {
    const boost::json::object& entry = value.as_object();
    if (key == "__metadata__") {
      for (const auto& [mk, mv] : entry) file.metadata[std::string(mk)] = std::string(mv.as_string());
      continue;
    }
    const std::string dtype(entry.at("dtype").as_string());
    at::ScalarType type;
    if (dtype == "F32")
      type = at::kFloat;
    else if (dtype == "F64")
      type = at::kDouble;
    else if (dtype == "I64")
      type = at::kLong;
    else if (dtype == "BF16")
      type = at::kBFloat16;
    else
      fail("{}: tensor '{}' has unsupported dtype {}", path, std::string(key), dtype);
    std::vector<int64_t> shape;
    for (const auto& d : entry.at("shape").as_array()) shape.push_back(d.to_number<int64_t>());
    const auto& offsets = entry.at("data_offsets").as_array();
    const auto begin = offsets.at(0).to_number<uint64_t>();
    const auto end = offsets.at(1).to_number<uint64_t>();
    at::Tensor t = at::empty(shape, type);
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (end > data_len || end < begin || end - begin != nbytes)
      fail("{}: tensor '{}' offsets [{}, {}) do not hold {} bytes", path, std::string(key), begin, end, nbytes);
    std::memcpy(t.data_ptr(), data + begin, nbytes);  // little-endian host, as the file
    file.tensors[std::string(key)] = t;
  }
  return file;
}

}  // namespace ditrl::test
