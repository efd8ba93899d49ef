#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

using namespace ditrl::io;
using Catch::Matchers::Contains;

namespace {

// The error a parse of `bytes` throws, or "" when it parses.
std::string parse_error(const std::vector<uint8_t>& bytes, const std::string& source = "hostile.safetensors") {
  try {
    SafetensorsFile::from_bytes(bytes, source);
  } catch (const ditrl::Error& e) {
    return e.what();
  }
  return "";
}

// A file made of a raw header text and `data_bytes` zero bytes.
std::vector<uint8_t> raw_file(const std::string& header, size_t data_bytes, uint64_t header_len = UINT64_MAX) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header_len == UINT64_MAX ? header.size() : header_len;
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

NamedTensors sample_tensors() {
  return {{"weight", at::arange(6, at::kFloat).reshape({2, 3})},
          {"half", at::linspace(-1, 1, 5).to(at::kHalf)},
          {"brain", at::linspace(-3, 3, 7).to(at::kBFloat16)},
          {"index", at::arange(-2, 3, at::kLong)},
          {"int32", at::arange(4, at::kInt)},
          {"bytes", at::arange(3, at::kByte)},
          {"mask", at::arange(3, at::kLong).remainder(2).eq(0)},
          {"double", at::tensor({1.5, -2.25}, at::kDouble)},
          {"scalar", at::scalar_tensor(3.5)},
          {"empty", at::empty({0, 4})}};
}

}  // namespace

TEST_CASE("safetensors: every dtype / scalars / empty tensors and metadata round-trip", "[io][safetensors]") {
  const std::string dir = ditrl::test::fresh_output_dir("safetensors_roundtrip");
  const std::string path = dir + "/t.safetensors";
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"config", R"({"a": [1, 2]})"}};
  write_safetensors(path, sample_tensors(), meta);
  const SafetensorsFile file(path);
  CHECK(file.metadata() == meta);
  CHECK(file.tensors().size() == sample_tensors().size());
  for (const auto& [name, tensor] : sample_tensors()) {
    INFO(name);
    const at::Tensor got = file.get(name);
    CHECK(got.scalar_type() == tensor.scalar_type());
    CHECK(got.sizes() == tensor.sizes());
    CHECK(at::equal(got, tensor));
    CHECK(at::equal(file.view(name), tensor));
  }
  // Layout of the writer: header padded to 8 bytes, data sorted by alignment
  // (descending) then name, contiguous from 0.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  CHECK(header_len % 8 == 0);
  std::vector<std::string> order;
  for (const TensorInfo& t : file.tensors()) order.push_back(t.name);
  CHECK(order == std::vector<std::string>{"double", "index", "empty", "int32", "scalar", "weight", "brain", "half",
                                          "bytes", "mask"});
  CHECK(std::filesystem::file_size(path) == 8 + header_len + file.tensors().back().end);
}

TEST_CASE("safetensors: views share the mapping and writes to them stay private", "[io][safetensors]") {
  const std::string dir = ditrl::test::fresh_output_dir("safetensors_view");
  const std::string path = dir + "/v.safetensors";
  write_safetensors(path, {{"x", at::ones({4, 4})}});
  at::Tensor view;
  {
    const SafetensorsFile file(path);
    view = file.view("x");
  }  // the tensor keeps the mapping alive
  CHECK(view.sum().item<double>() == 16.0);
  view.fill_(2.0);
  CHECK(at::equal(SafetensorsFile(path).get("x"), at::ones({4, 4})));
}

TEST_CASE("safetensors: the fixture checkpoints parse", "[io][safetensors]") {
  const SafetensorsFile weights(std::string(DITRL_FIXTURES_DIR) + "/sd3/weights.safetensors");
  CHECK(weights.info("pos_embed.pos_embed").shape == std::vector<int64_t>{1, 256, 64});
  CHECK(weights.info("pos_embed.pos_embed").dtype == "F32");
  CHECK(weights.metadata().at("format") == "pt");
  const SafetensorsFile bf16(std::string(DITRL_FIXTURES_DIR) + "/sd3/case_bf16.safetensors");
  CHECK(bf16.get("hidden_states").scalar_type() == at::kBFloat16);
  CHECK(bf16.get("timestep").scalar_type() == at::kFloat);
}

TEST_CASE("safetensors: sharded checkpoints through their index", "[io][safetensors]") {
  const std::string dir = ditrl::test::fresh_output_dir("safetensors_sharded");
  write_safetensors(dir + "/model-00001-of-00002.safetensors", {{"a", at::ones({2})}, {"b", at::zeros({3})}});
  write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"c", at::arange(4, at::kFloat)}});
  const auto write_index = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
    return dir + "/" + name;
  };
  const std::string index = write_index("model.safetensors.index.json", R"({
    "metadata": {"total_size": 36},
    "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  const Checkpoint ckpt(index);
  CHECK(ckpt.names() == std::vector<std::string>{"a", "b", "c"});
  CHECK(at::equal(ckpt.get("c"), at::arange(4, at::kFloat)));
  CHECK_THAT(ckpt.file_of("c"), Contains("model-00002-of-00002.safetensors"));
  CHECK(ckpt.metadata().at("total_size") == "36");

  const auto error = [](const std::string& path) -> std::string {
    try {
      Checkpoint{path};
    } catch (const ditrl::Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string missing = write_index("missing.index.json", R"({"weight_map": {"a": "model-00009.safetensors"}})");
  CHECK_THAT(error(missing),
             Contains("missing.index.json") && Contains("model-00009.safetensors") && Contains("does not exist"));
  const std::string wrong =
      write_index("wrong.index.json", R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})");
  CHECK_THAT(error(wrong), Contains("weight_map puts 'a'"));
  const std::string no_map = write_index("nomap.index.json", R"({"metadata": {}})");
  CHECK_THAT(error(no_map), Contains("weight_map"));
  write_safetensors(dir + "/dup.safetensors", {{"a", at::ones({1})}});
  const std::string dup = write_index(
      "dup.index.json", R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "x": "dup.safetensors"}})");
  CHECK_THAT(error(dup), Contains("'a' is in both"));
}

TEST_CASE("safetensors: hostile files are clear errors naming the file and tensor", "[io][safetensors]") {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE(parse_error(raw_file(ok, 8)).empty());

  CHECK_THAT(parse_error({1, 2, 3}), Contains("hostile.safetensors") && Contains("too short"));
  CHECK_THAT(parse_error(raw_file(ok, 8, 1'000'000'000)), Contains("exceeds the 100000000-byte limit"));
  CHECK_THAT(parse_error(raw_file(ok, 8, ok.size() + 9)), Contains("runs past the end of the file"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32",)", 8)),
             Contains("hostile.safetensors") && Contains("not valid JSON"));
  CHECK_THAT(parse_error(raw_file("[1, 2]", 0)), Contains("must be a JSON object"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", 8)),
             Contains("tensor 't'") && Contains("unknown dtype 'F17'"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)),
             Contains("truncated"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12)),
             Contains("trailing"));
  CHECK_THAT(parse_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                                      "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                  12)),
             Contains("tensor 'b'") && Contains("overlap"));
  CHECK_THAT(parse_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                                      "b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                  12)),
             Contains("tensor 'b'") && Contains("gap"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
             Contains("tensor 't'") && Contains("need 12 bytes but data_offsets span 8"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8)),
             Contains("before begin"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)),
             Contains("shape dimension"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8)),
             Contains("shape dimension"));
  CHECK_THAT(
      parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})", 8)),
      Contains("too large"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2)),
             Contains("not a whole number of bytes"));
  CHECK_THAT(parse_error(raw_file(R"({"t":{"dtype":"F32","shape":[2]}})", 8)), Contains("no 'data_offsets'"));
  CHECK_THAT(parse_error(raw_file(R"({"__metadata__":{"a":1}})", 0)), Contains("__metadata__ value 'a'"));
  // Valid header, dtype this LibTorch cannot hold: listing works, loading names the tensor.
  const SafetensorsFile fp8 = SafetensorsFile::from_bytes(
      raw_file(R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", 4), "fp8.safetensors");
  CHECK(fp8.info("w").dtype == "F8_E4M3");
  CHECK_THROWS_WITH(fp8.get("w"), Contains("tensor 'w' of fp8.safetensors") && Contains("F8_E4M3"));
  CHECK_THROWS_WITH(fp8.get("nope"), Contains("fp8.safetensors has no tensor 'nope'"));
  CHECK_THROWS_WITH(SafetensorsFile("/nonexistent/x.safetensors"), Contains("/nonexistent/x.safetensors"));
  const std::string on_disk = ditrl::test::fresh_output_dir("safetensors_hostile") + "/bad.safetensors";
  write_bytes(on_disk, raw_file(R"({"t":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8));
  CHECK_THROWS_WITH(SafetensorsFile(on_disk), Contains(on_disk) && Contains("tensor 't'"));
  write_bytes(on_disk, {});
  CHECK_THROWS_WITH(SafetensorsFile(on_disk), Contains(on_disk) && Contains("too short"));
}

TEST_CASE("safetensors: thousands of truncated and mutated files give only ditrl errors", "[io][safetensors]") {
  const std::vector<uint8_t> base = serialize_safetensors(
      {{"alpha", at::ones({2, 3})}, {"beta", at::ones({4}).to(at::kBFloat16)}, {"gamma", at::arange(2, at::kLong)}},
      {{"format", "pt"}});
  uint64_t header_len = 0;
  std::memcpy(&header_len, base.data(), 8);
  std::mt19937_64 rng(20240605);
  const std::string interesting = "0123456789-.eE\"{}[],: \\ux";
  int cases = 0, parsed = 0, foreign_errors = 0;
  const auto attempt = [&](const std::vector<uint8_t>& bytes) {
    ++cases;
    try {
      const SafetensorsFile file = SafetensorsFile::from_bytes(bytes, "fuzz.safetensors");
      ++parsed;
      for (const TensorInfo& t : file.tensors()) {
        try {
          (void)file.get(t.name).sum();
          (void)file.view(t.name).sum();
        } catch (const ditrl::Error&) {
        }
      }
    } catch (const ditrl::Error&) {
    } catch (...) {
      ++foreign_errors;
    }
  };
  for (size_t n = 0; n < base.size(); ++n) attempt(std::vector<uint8_t>(base.begin(), base.begin() + n));
  for (int i = 0; i < 4000; ++i) {
    std::vector<uint8_t> bytes = base;
    const int kind = i % 4;
    if (kind == 0) {  // overwrite header characters with JSON-significant ones
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n; ++k)
        bytes[8 + rng() % header_len] = static_cast<uint8_t>(interesting[rng() % interesting.size()]);
    } else if (kind == 1) {  // arbitrary bytes anywhere
      for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n; ++k)
        bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    } else if (kind == 2) {  // delete or insert header text, keeping the length field consistent
      std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(header_len));
      const size_t at = rng() % header.size();
      if (rng() % 2)
        header.erase(at, 1 + rng() % 6);
      else
        header.insert(at, std::string(1 + rng() % 3, interesting[rng() % interesting.size()]));
      std::vector<uint8_t> rebuilt(8 + header.size());
      const uint64_t n = header.size();
      std::memcpy(rebuilt.data(), &n, 8);
      std::memcpy(rebuilt.data() + 8, header.data(), header.size());
      rebuilt.insert(rebuilt.end(), base.begin() + 8 + static_cast<long>(header_len), base.end());
      bytes = rebuilt;
    } else {  // a random header length
      const uint64_t n = rng() % 4 == 0 ? rng() : rng() % (base.size() + 16);
      std::memcpy(bytes.data(), &n, 8);
    }
    attempt(bytes);
  }
  INFO(cases << " cases, " << parsed << " still parsed");
  CHECK(cases > 4000);
  CHECK(foreign_errors == 0);
  CHECK(parsed < cases);
}

TEST_CASE("safetensors: regroup presents row ranges of stored tensors under other names", "[io][safetensors]") {
  // Black Forest Labs' layout in small: a fused qkv split in three, a pair of
  // halves swapped, a tensor renamed whole; across the shards of an index.
  const std::string dir = ditrl::test::fresh_output_dir("regroup");
  const at::Tensor qkv = at::arange(24, at::kFloat).reshape({6, 4});
  const at::Tensor mod = at::arange(8, at::kFloat).to(at::kBFloat16).reshape({4, 2});
  write_safetensors(dir + "/a.safetensors", {{"qkv", qkv}, {"kept", at::ones({3})}});
  write_safetensors(dir + "/b.safetensors", {{"mod", mod}, {"bias", at::arange(3, at::kFloat)}});
  {
    std::ofstream index(dir + "/m.safetensors.index.json");
    index << R"({"weight_map": {"qkv": "a.safetensors", "kept": "a.safetensors", "mod": "b.safetensors",
                                "bias": "b.safetensors"}})";
  }
  const std::map<std::string, std::vector<StoredRows>> table{{"q", {{"qkv", 0, 2}}},
                                                             {"k", {{"qkv", 2, 4}}},
                                                             {"v", {{"qkv", 4, 6}}},
                                                             {"swapped", {{"mod", 2, 4}, {"mod", 0, 2}}},
                                                             {"renamed", {{"bias", 0, 3}}}};
  Checkpoint c(dir + "/m.safetensors.index.json");
  c.regroup(table);
  CHECK(c.regrouped() == 3);
  CHECK(c.names() == std::vector<std::string>{"k", "kept", "q", "renamed", "swapped", "v"});
  CHECK_FALSE(c.contains("qkv"));
  CHECK(c.info("k").shape == std::vector<int64_t>{2, 4});
  CHECK(c.info("swapped").dtype == "BF16");
  CHECK(at::equal(c.view("k"), qkv.slice(0, 2, 4)));
  CHECK(at::equal(c.get("v"), qkv.slice(0, 4, 6)));
  const at::Tensor swapped = at::cat({mod.slice(0, 2, 4), mod.slice(0, 0, 2)});
  CHECK(at::equal(c.view("swapped"), swapped));
  CHECK(at::equal(c.view("renamed"), at::arange(3, at::kFloat)));
  // Element ranges across the two runs of bytes, as sliced loading reads them.
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 8}, {3, 5}, {1, 7}, {4, 8}, {2, 2}}) {
    INFO("[" << begin << ", " << end << ")");
    CHECK(at::equal(c.read_range("swapped", begin, end), swapped.reshape(-1).slice(0, begin, end)));
  }
  CHECK(c.file_offset("k").has_value());
  CHECK_FALSE(c.file_offset("swapped").has_value());  // two runs: not mappable as one
  CHECK(c.file_of("swapped") == dir + "/b.safetensors");
  CHECK(*c.file_offset("k") == *Checkpoint(dir + "/m.safetensors.index.json").file_offset("qkv") + 2 * 4 * 4);
  // Negative control: the same ranges unswapped are not what was read.
  CHECK_FALSE(at::equal(c.view("swapped"), mod));

  auto refused = [&](const std::map<std::string, std::vector<StoredRows>>& bad) {
    Checkpoint fresh(dir + "/m.safetensors.index.json");
    try {
      fresh.regroup(bad);
    } catch (const ditrl::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(refused({{"q", {{"qkv", 0, 2}}}, {"k", {{"qkv", 2, 4}}}}),
             Contains("m.safetensors.index.json") && Contains("rows [4, 6) of 'qkv' are left out"));
  CHECK_THAT(refused({{"q", {{"qkv", 0, 4}}}, {"k", {{"qkv", 2, 6}}}}),
             Contains("rows [2, 4) of 'qkv' are used twice"));
  CHECK_THAT(refused({{"q", {{"qkv", 0, 7}}}}), Contains("rows [0, 7) of 'qkv'") && Contains("within its 6 rows"));
  CHECK_THAT(refused({{"q", {{"qkv", 0, 6}, {"mod", 0, 4}}}}), Contains("'q' joins 'mod' (BF16 [4, 2])"));
  CHECK_THAT(refused({{"kept", {{"bias", 0, 3}}}}), Contains("would hide the stored tensor"));
  CHECK_THAT(refused({{"q", {{"missing", 0, 1}}}}), Contains("has no tensor 'missing'"));
  CHECK_THROWS_WITH(c.regroup(table), Contains("regrouped twice"));
}
