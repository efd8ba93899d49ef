// ditrl-mpi-ranks: 1 2 4
#include <ditrl/error.hpp>
#include <ditrl/io/hashed_write.hpp>
#include <ditrl/io/sha256.hpp>

#include <fmt/format.h>
#include <mpi.h>
#include <catch2/catch.hpp>

#include "mpi_world.hpp"
#include "process.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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

// The bytes write_hashed sends through O_DIRECT: the 4 KiB-aligned interior
// of each range of at least 1 MiB (smaller ones go through the page cache).
int64_t direct_interior(const std::vector<io::ByteRange>& ranges) {
  int64_t bytes = 0;
  for (const io::ByteRange& r : ranges) {
    if (r.size < (int64_t{1} << 20)) continue;
    const int64_t first = (r.offset + io::kDirectAlignment - 1) / io::kDirectAlignment * io::kDirectAlignment;
    const int64_t last = (r.offset + r.size) / io::kDirectAlignment * io::kDirectAlignment;
    bytes += std::max<int64_t>(0, last - first);
  }
  return bytes;
}

// Empty when the file system under `dir` takes an aligned O_DIRECT write,
// else why not: the only case in which a direct write may fall back.
std::string o_direct_refusal(const std::string& dir) {
  const std::string path = dir + "/o_direct_probe";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) return fmt::format("open(O_DIRECT) on {}: {}", dir, std::strerror(errno));
  void* block = std::aligned_alloc(io::kDirectAlignment, io::kDirectAlignment);
  std::memset(block, 1, io::kDirectAlignment);
  const ssize_t n = ::pwrite(fd, block, io::kDirectAlignment, 0);
  const int error = errno;
  std::free(block);
  ::close(fd);
  ::unlink(path.c_str());
  return n == io::kDirectAlignment ? "" : fmt::format("O_DIRECT pwrite on {}: {}", dir, std::strerror(error));
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
    const io::HashedWriteResult result = io::write_hashed(path, mine, {3, direct});
    const std::vector<std::string>& digests = result.digests;
    MPI_Barrier(MPI_COMM_WORLD);

    // Every byte is counted once, and goes the way it was asked to: a direct
    // write that quietly fell back to the page cache would still land
    // byte-exact, so the split is what proves O_DIRECT was used.
    int64_t total = 0;
    for (const io::ByteRange& r : mine) total += r.size;
    CHECK(result.direct_bytes + result.buffered_bytes == total);
    const std::string refusal = direct ? o_direct_refusal(std::filesystem::path(path).parent_path().string()) : "";
    if (!refusal.empty()) {
      WARN("O_DIRECT not checked: the file system refuses it (" << refusal << ")");
      CHECK(result.direct_refused != "");
    } else {
      INFO("direct " << direct << ", refused: " << result.direct_refused);
      CHECK(result.direct_refused == "");
      CHECK(result.direct_bytes == (direct ? direct_interior(mine) : 0));
      if (direct) CHECK(result.direct_bytes > 0);
    }

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
