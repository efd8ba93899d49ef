// ditrl-mpi-ranks: 1 2 4
#include <ditrl/error.hpp>
#include <ditrl/io/hashed_write.hpp>
#include <ditrl/io/sha256.hpp>

#include <fmt/format.h>
#include <mpi.h>
#include <catch2/catch.hpp>

#include "mpi_world.hpp"
#include "process.hpp"

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace io = ditrl::io;

using ditrl::test::rank;
using ditrl::test::world;

namespace {

// Back-to-back ranges of the sizes a checkpoint's slabs have around the 4 KiB
// direct-I/O block and the 8 MiB staging buffer, starting at odd and aligned
// offsets, so that neighbouring ranges (of other ranks) share blocks.
std::vector<std::pair<int64_t, int64_t>> layout() {
  const std::vector<int64_t> sizes = {1,
                                      100,
                                      4095,
                                      4096,
                                      4097,
                                      12288,
                                      (3 << 20) + 5,
                                      8 << 20,
                                      (9 << 20) + 123,
                                      0,
                                      7,
                                      65536 - 4,
                                      8192,
                                      (16 << 20) + 4096};
  std::vector<std::pair<int64_t, int64_t>> ranges;  // offset, size
  int64_t offset = 13;
  for (int64_t size : sizes) {
    ranges.emplace_back(offset, size);
    offset += size;
    if (size == 4096) offset = (offset + 4095) / 4096 * 4096;  // an aligned start too, after a gap
  }
  return ranges;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("write_hashed: ranks' ranges land byte-exact / digests are of the bytes / direct and buffered",
          "[io][hashed_write]") {
  const auto ranges = layout();
  const int64_t end = ranges.back().first + ranges.back().second;
  std::string source(static_cast<size_t>(end), '\0');
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<char>((i * 2654435761u) >> 13);

  for (bool direct : {true, false}) {
    const std::string name = fmt::format("hashed_write-np{}-{}", world(), direct ? "direct" : "buffered");
    const std::string path = std::string(DITRL_TEST_OUTPUT_DIR) + "/" + name + "/file.bin";
    if (rank() == 0) {
      ditrl::test::fresh_output_dir(name);
      std::ofstream(path, std::ios::binary);  // exists, empty: writers fill holes and extend it
    }
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<io::ByteRange> mine;
    for (size_t k = rank(); k < ranges.size(); k += world())
      mine.push_back({ranges[k].first, source.data() + ranges[k].first, ranges[k].second});
    const std::vector<std::string> digests = io::write_hashed(path, mine, {3, direct});
    MPI_Barrier(MPI_COMM_WORLD);

    REQUIRE(digests.size() == mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      INFO("range at " << mine[i].offset << ", " << mine[i].size << " bytes, direct " << direct);
      CHECK(digests[i] == io::sha256(mine[i].data, static_cast<size_t>(mine[i].size)));
    }
    const std::string written = read_file(path);
    REQUIRE(written.size() == source.size());
    for (const auto& [offset, size] : ranges) {
      INFO("range at " << offset << ", " << size << " bytes, direct " << direct);
      CHECK(written.compare(offset, size, source, offset, size) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("write_hashed: a file that cannot be opened is an error naming it", "[io][hashed_write]") {
  const std::string path = std::string(DITRL_TEST_OUTPUT_DIR) + "/no-such-dir/file.bin";
  const char byte = 1;
  try {
    io::write_hashed(path, {{0, &byte, 1}});
    FAIL("no error");
  } catch (const ditrl::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("cannot open"));
  }
}
