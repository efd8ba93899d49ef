// ditrl-mpi-ranks: 1 2 4
#include <ditrl/io/h5.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "mpi_world.hpp"
#include "process.hpp"

namespace h5 = ditrl::io::h5;
using Catch::Matchers::Contains;

using ditrl::test::rank;
using ditrl::test::world;

namespace {

// A directory every rank sees, made fresh by rank 0.
std::string shared_dir(const std::string& name) {
  const std::string dir = std::string(DITRL_TEST_OUTPUT_DIR) + "/" + name + "-np" + std::to_string(world());
  if (rank() == 0) ditrl::test::fresh_output_dir(name + "-np" + std::to_string(world()));
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// Rows owned by rank r when `rows` are split as evenly as possible.
std::pair<int64_t, int64_t> row_range(int64_t rows, int r, int n) {
  const int64_t base = rows / n, extra = rows % n;
  const int64_t begin = r * base + std::min<int64_t>(r, extra);
  return {begin, base + (r < extra ? 1 : 0)};
}

}  // namespace

TEST_CASE("h5: every rank writes its rows of one dataset collectively / rank 0 reads it back exactly", "[h5]") {
  const std::string path = shared_dir("h5_collective") + "/matrix.h5";
  const int64_t rows = 37, cols = 5;  // uneven split on purpose
  const at::Tensor full = at::arange(rows * cols, at::kFloat).reshape({rows, cols}).mul_(0.25).add_(-3.0);
  {
    h5::File file = h5::File::create(path, MPI_COMM_WORLD);
    const auto [begin, count] = row_range(rows, rank(), world());
    h5::write_rows_collective(file, "/weights/matrix", rows, full.narrow(0, begin, count), begin);
    file.set_attr("writer_ranks", static_cast<int64_t>(world()));
    h5::Group group = file.open_group("weights");
    group.set_attr("note", "written collectively");
    // bf16 and int64 row blocks through the same path.
    h5::write_rows_collective(file, "/weights/matrix_bf16", rows, full.narrow(0, begin, count).to(at::kBFloat16),
                              begin);
    h5::write_rows_collective(file, "/index", rows, at::arange(begin, begin + count, at::kLong).reshape({count, 1}),
                              begin);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) {
    h5::File file = h5::File::open(path);
    const at::Tensor back = file.open_dataset("/weights/matrix").read();
    CHECK(back.sizes() == full.sizes());
    CHECK(at::equal(back, full));
    CHECK(file.int_attr("writer_ranks") == world());
    CHECK(file.open_group("/weights").string_attr("note") == "written collectively");
    h5::Dataset bf16 = file.open_dataset("/weights/matrix_bf16");
    CHECK(bf16.dtype() == at::kBFloat16);
    CHECK(at::equal(bf16.read(), full.to(at::kBFloat16)));
    CHECK(at::equal(file.open_dataset("/index").read().flatten(), at::arange(rows, at::kLong)));
    CHECK(file.children() == std::vector<std::string>{"index", "weights"});

    // The file is plain HDF5 that h5dump reads.
    const auto dump = ditrl::test::run_process("h5dump -d /weights/matrix -A 0 " + path);
    CHECK(dump.exit_code == 0);
    CHECK_THAT(dump.output, Contains("DATASPACE  SIMPLE { ( 37, 5 ) / ( 37, 5 ) }"));
    CHECK_THAT(dump.output, Contains("(36,0): 42, 42.25, 42.5, 42.75, 43"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("h5: a metrics series appends step by step and survives reopening", "[h5]") {
  const std::string path = shared_dir("h5_series") + "/metrics.h5";
  if (rank() == 0) {
    {
      h5::File file = h5::File::create(path);
      h5::Series loss = h5::Series::open_or_create(file, "/metrics/train/loss");
      for (int i = 0; i < 3; ++i) loss.append(1.0 / (i + 1));
      CHECK(loss.size() == 3);
    }
    {
      h5::File file = h5::File::open(path, h5::File::Mode::ReadWrite);
      h5::Series loss = h5::Series::open_or_create(file, "/metrics/train/loss");
      loss.append(0.125);
    }
    h5::File file = h5::File::open(path);
    h5::Series loss = h5::Series::open_or_create(file, "/metrics/train/loss");
    CHECK(loss.read() == std::vector<double>{1.0, 0.5, 1.0 / 3.0, 0.125});
    const auto dump = ditrl::test::run_process("h5dump -d /metrics/train/loss " + path);
    CHECK(dump.exit_code == 0);
    CHECK_THAT(dump.output, Contains("( 4 ) / ( H5S_UNLIMITED )"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("h5: failures name the file and the object and carry HDF5's reason", "[h5]") {
  const std::string dir = shared_dir("h5_errors");
  if (rank() == 0) {
    try {
      h5::File::open(dir + "/absent.h5");
      FAIL("opening a missing file must throw");
    } catch (const h5::Error& e) {
      CHECK_THAT(std::string(e.what()), Contains(dir + "/absent.h5"));
      CHECK_THAT(std::string(e.what()), Contains("cannot open file"));
      CHECK_THAT(std::string(e.what()), Contains("H5Fopen"));
    }
    h5::File file = h5::File::create(dir + "/small.h5");
    file.create_dataset("/a/b", at::kFloat, {2, 2});
    CHECK_THROWS_WITH(file.open_dataset("/a/missing"), Contains("small.h5:/: no dataset '/a/missing'"));
    CHECK_THROWS_WITH(file.create_dataset("/a/b", at::kFloat, {1}), Contains("H5Dcreate2(/a/b)"));
    CHECK_THROWS_WITH(file.string_attr("none"), Contains("no attribute 'none'"));
    h5::Dataset d = file.open_dataset("/a/b");
    CHECK_THROWS_WITH(d.write_rows(1, at::zeros({2, 2})), Contains("rows [1, 3) outside [0, 2)"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("h5: datasets with a zero extent are written and read collectively", "[h5]") {
  // A pure-ODE rollout's /sde_steps [0] and /log_probs [N, 0]: a collective
  // MPI-IO transfer of nothing must not be attempted (it fails), the shape
  // is all the dataset holds.
  const std::string path = shared_dir("h5_empty") + "/empty.h5";
  const int64_t rows = 3 * world();
  {
    h5::File file = h5::File::create(path, MPI_COMM_WORLD);
    file.create_dataset("steps", at::kLong, {0}).write(at::empty({0}, at::kLong));
    h5::Dataset lp = file.create_dataset("log_probs", at::kFloat, {static_cast<hsize_t>(rows), 0});
    lp.write_rows(3 * rank(), at::empty({3, 0}, at::kFloat));
    h5::Dataset none = file.create_dataset("none", at::kFloat, {0, 4});
    none.write_rows(0, at::empty({0, 4}, at::kFloat));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  h5::File file = h5::File::open(path, h5::File::Mode::ReadOnly, MPI_COMM_WORLD);
  CHECK(file.open_dataset("steps").read().numel() == 0);
  CHECK(file.open_dataset("log_probs").shape() == std::vector<hsize_t>{static_cast<hsize_t>(rows), 0});
  CHECK(file.open_dataset("log_probs").read_rows(3 * rank(), 3, /*collective=*/true).sizes() == at::IntArrayRef{3, 0});
  CHECK(file.open_dataset("none").read_rows(0, 0, true).sizes() == at::IntArrayRef{0, 4});
}
