#include <ditrl/error.hpp>
#include <ditrl/io/safetensors_shards.hpp>
#include <ditrl/io/text_file.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <boost/json.hpp>

#include <cctype>
#include <filesystem>
#include <regex>
#include <set>

namespace ditrl::io {

namespace fs = std::filesystem;

namespace {

// Greedy in order: a new shard starts when the next tensor would overflow.
std::vector<std::vector<TensorSpec>> split(const std::vector<TensorSpec>& specs, uint64_t max_bytes) {
  std::vector<std::vector<TensorSpec>> shards(1);
  uint64_t size = 0;
  for (const TensorSpec& spec : specs) {
    if (!shards.back().empty() && size + spec.nbytes() > max_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(spec);
    size += spec.nbytes();
  }
  return shards;
}

void remove_stale(const fs::path& dir, const std::string& stem, const std::set<std::string>& keep) {
  const std::regex ours(std::regex_replace(stem, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                        R"((\.safetensors|\.safetensors\.index\.json|-\d{5}-of-\d{5}\.safetensors))");
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, ours) && !keep.count(name)) fs::remove(entry.path());
  }
}

}  // namespace

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    fail("{}: '{}' is not a size (expected e.g. 10GB, 500MB, 2GiB or a number of bytes)", what, text);
  }
  std::string unit = text.substr(end);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::map<std::string, double> units = {
      {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  const auto it = units.find(unit);
  if (it == units.end() || !(value > 0))
    fail("{}: '{}' is not a positive size (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", what, text);
  return static_cast<uint64_t>(value * it->second);
}

std::vector<std::string> write_sharded_safetensors_streamed(const std::string& dir, const std::string& stem,
                                                            const std::vector<TensorSpec>& specs,
                                                            const TensorValues& values, uint64_t max_shard_bytes,
                                                            const std::map<std::string, std::string>& metadata) {
  fs::create_directories(dir);
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "pt";
  const std::vector<std::vector<TensorSpec>> shards = split(specs, max_shard_bytes);
  std::vector<std::string> written;
  std::set<std::string> names;
  if (shards.size() == 1) {
    names.insert(stem + ".safetensors");
    written.push_back((fs::path(dir) / (stem + ".safetensors")).string());
    write_safetensors_streamed(written.back(), shards[0], values, meta);
  } else {
    boost::json::object weight_map;
    uint64_t total = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      const std::string name = fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem, i + 1, shards.size());
      names.insert(name);
      written.push_back((fs::path(dir) / name).string());
      write_safetensors_streamed(written.back(), shards[i], values, meta);
      for (const TensorSpec& spec : shards[i]) {
        weight_map[spec.name] = name;
        total += spec.nbytes();
      }
    }
    boost::json::object index;
    index["metadata"] = boost::json::object{{"total_size", total}};
    index["weight_map"] = std::move(weight_map);
    const std::string index_name = stem + ".safetensors.index.json";
    names.insert(index_name);
    written.push_back((fs::path(dir) / index_name).string());
    write_text_file(written.back(), boost::json::serialize(index) + "\n");
  }
  remove_stale(dir, stem, names);
  return written;
}

std::vector<std::string> write_sharded_safetensors(const std::string& dir, const std::string& stem,
                                                   const NamedTensors& tensors, uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) fail("tensor '{}' is undefined", name);
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
    by_name[name] = t;
  }
  return write_sharded_safetensors_streamed(
      dir, stem, specs, [&by_name](const TensorSpec& spec) { return by_name.at(spec.name); }, max_shard_bytes,
      metadata);
}

}  // namespace ditrl::io
