// Staging a checkpoint range into a tensor of another dtype or device
// (models::stage_range_into, sliced loading's path where a slice is not the
// file's bytes): any chunk size gives bitwise what one cast of the whole range
// gives, fp64 rounding through fp32 as the unsliced path's fp32 parameter does.
#include <ditrl/error.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/parameter_source.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>

#include "process.hpp"
#include "same_bits.hpp"

using namespace ditrl;
using Catch::Matchers::Contains;
using test::same_bits;

TEST_CASE("stage_range_into: every chunk size casts a stored range as one whole cast does", "[io][sliced]") {
  const std::string path = test::fresh_output_dir("stage_range") + "/w.safetensors";
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor values = at::randn({1000}, gen, at::TensorOptions().dtype(at::kDouble)) * 3;
  io::write_safetensors(path, {{"bf16", values.to(at::kBFloat16)},
                               {"fp16", values.to(at::kHalf)},
                               {"fp32", values.to(at::kFloat)},
                               {"fp64", values}});
  const io::Checkpoint file(path);
  for (const char* name : {"bf16", "fp16", "fp32", "fp64"})
    for (const c10::ScalarType into : {at::kFloat, at::kBFloat16})
      for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 1000}, {137, 911}, {500, 500}})
        for (const size_t chunk : {size_t{1}, size_t{6}, size_t{100}, models::kStagingChunkBytes}) {
          INFO(name << " into " << c10::toString(into) << " [" << begin << ", " << end << ") chunks of " << chunk
                    << " bytes");
          const at::Tensor stored = file.read_range(name, begin, end);
          const at::Tensor expected = (stored.scalar_type() == at::kDouble ? stored.to(at::kFloat) : stored).to(into);
          const at::Tensor out = at::full({end - begin}, 42, at::TensorOptions().dtype(into));
          models::stage_range_into(file, name, begin, end, out, chunk);
          CHECK(same_bits(out, expected));
        }
  // A part of a larger tensor (a slice of a flat group), the rest untouched.
  const at::Tensor group = at::zeros({40}, at::kFloat);
  models::stage_range_into(file, "bf16", 10, 30, group.narrow(0, 5, 20), 8);
  CHECK(same_bits(group.narrow(0, 5, 20), file.read_range("bf16", 10, 30).to(at::kFloat)));
  CHECK(group.narrow(0, 0, 5).eq(0).all().item<bool>());
  CHECK(group.narrow(0, 25, 15).eq(0).all().item<bool>());
  CHECK_THROWS_WITH(
      models::stage_range_into(file, "fp32", 0, 10, at::empty({9})),
      Contains("tensor 'fp32' elements [0, 10) need a 1-D tensor of 10 elements, got [9]") && Contains(path));
}

// The frozen slices' mapping (sliced loading maps a rank's part of a frozen
// group from its file): the bytes of any element range, at any offset within
// a page, and writes to them stay in this process.
TEST_CASE("map_private: a file's element range as a tensor / writes to it stay private", "[io][sliced]") {
  const std::string path = test::fresh_output_dir("map_private") + "/w.safetensors";
  const at::Tensor values = at::arange(5000, at::kFloat).to(at::kBFloat16);
  io::write_safetensors(path, {{"a", values}});
  const io::Checkpoint file(path);
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 5000}, {1, 2}, {2047, 4099}}) {
    INFO("[" << begin << ", " << end << ")");
    const at::Tensor mapped =
        io::map_private(path, *file.file_offset("a") + begin * 2, (end - begin) * 2, at::kBFloat16);
    REQUIRE(mapped.defined());
    CHECK(same_bits(mapped, values.narrow(0, begin, end - begin)));
    mapped.fill_(-1);
  }
  CHECK(same_bits(io::Checkpoint(path).get("a"), values));  // the file kept its values
  CHECK_THROWS_WITH(io::map_private(path, 1, 4, at::kBFloat16), Contains("are not whole BFloat16 elements"));
}
