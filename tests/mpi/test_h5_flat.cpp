// ditrl-mpi-ranks: 1 2 4
#include <ditrl/io/h5.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "mpi_world.hpp"
#include "process.hpp"

namespace h5 = ditrl::io::h5;

using ditrl::test::rank;
using ditrl::test::world;

TEST_CASE("h5 flat ranges: ranks write arbitrary flat slices of N-D datasets / any split reads them back",
          "[h5][flat]") {
  const std::string dir = std::string(DITRL_TEST_OUTPUT_DIR) + "/h5_flat-np" + std::to_string(world());
  if (rank() == 0) ditrl::test::fresh_output_dir("h5_flat-np" + std::to_string(world()));
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string path = dir + "/flat.h5";
  const std::vector<std::vector<int64_t>> shapes{{5, 7, 3}, {11}, {2, 3, 4, 5}, {1, 1}, {64, 3}};
  // Shard size rounded up as a sharded parameter would be; the last rank may own a short or empty range.
  auto range = [](int64_t numel, int r, int n) {
    const int64_t shard = (numel + n - 1) / n;
    const int64_t begin = std::min(numel, r * shard);
    return std::make_pair(begin, std::min(numel, begin + shard) - begin);
  };
  {
    h5::File file = h5::File::create(path, MPI_COMM_WORLD);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const at::Tensor full = at::arange(c10::multiply_integers(shapes[i]), at::kFloat).reshape(shapes[i]);
      std::vector<hsize_t> dims(shapes[i].begin(), shapes[i].end());
      h5::Dataset d = file.create_dataset("p" + std::to_string(i), at::kFloat, dims);
      const auto [begin, count] = range(full.numel(), rank(), world());
      d.write_flat_range(begin, full.flatten().narrow(0, begin, count));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  h5::File file = h5::File::open(path, h5::File::Mode::ReadOnly, MPI_COMM_WORLD);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const at::Tensor full = at::arange(c10::multiply_integers(shapes[i]), at::kFloat).reshape(shapes[i]);
    h5::Dataset d = file.open_dataset("p" + std::to_string(i));
    // Read back with every other split too (a checkpoint loaded at another rank count).
    for (int n : {1, 3, 4, 7}) {
      for (int r = 0; r < n; ++r) {
        const auto [begin, count] = range(full.numel(), r, n);
        CHECK(at::equal(d.read_flat_range(begin, count, false), full.flatten().narrow(0, begin, count)));
      }
    }
    // Every odd window, to exercise partial leading and trailing blocks.
    for (int64_t b = 0; b < full.numel(); b += 3)
      for (int64_t len : {int64_t(1), int64_t(4), full.numel() - b})
        if (b + len <= full.numel())
          CHECK(at::equal(d.read_flat_range(b, len, false), full.flatten().narrow(0, b, len)));
  }
}
