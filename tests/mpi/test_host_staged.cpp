// ditrl-mpi-ranks: 1 2 4
//
// The host-staged MPI data backend ([parallel] data_backend = "mpi",
// dist::make_host_staged_communicator) without a GPU: CPU tensors pass
// straight through, and with staging forced onto CPU tensors (pageable
// buffers in place of pinned ones) every collective, blocking and *_async,
// gives the plain MPI communicator's bytes, buffers are reused across sizes
// and overlapping collectives, and a dropped handle still copies its result
// back. The same on a GPU: tests/mpi/cuda/test_data_backends.cpp.
#include <ditrl/dist/communicator.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "collective_bits.hpp"
#include "mpi_world.hpp"

namespace ditrl {

using Catch::Matchers::Contains;

TEST_CASE("host-staged MPI: CPU tensors pass through and give the MPI communicator's bytes", "[host_staged]") {
  auto mpi = dist::make_mpi_communicator();
  const test::CollectiveResults reference = test::run_collectives(*mpi, c10::kCPU);
  for (const bool stage_cpu : {false, true}) {
    INFO("stage_cpu_tensors = " << stage_cpu);
    auto staged = dist::make_host_staged_communicator(dist::make_mpi_communicator(), stage_cpu);
    CHECK(staged->rank() == mpi->rank());
    CHECK(staged->size() == mpi->size());
    // Twice: the second pass runs on the first one's buffers.
    for (int pass = 0; pass < 2; ++pass) {
      INFO("pass " << pass);
      const std::string differ = test::differing(reference, test::run_collectives(*staged, c10::kCPU));
      INFO(differ);
      CHECK(differ.empty());
    }
  }
}

TEST_CASE("host-staged MPI: a split communicator stages too and a dropped handle still delivers", "[host_staged]") {
  auto staged = dist::make_host_staged_communicator(dist::make_mpi_communicator(), /*stage_cpu_tensors=*/true);
  const int r = staged->rank();
  auto half = staged->split(r % 2, r);
  at::Tensor ones = at::ones({9}, at::kFloat);
  half->all_reduce(ones, dist::ReduceOp::Sum);
  CHECK(at::equal(ones, at::full({9}, static_cast<float>(half->size()))));

  // Several collectives in flight at once, each on its own buffer.
  const int n = staged->size();
  std::vector<at::Tensor> outputs;
  std::vector<dist::Pending> pending;
  for (int k = 0; k < 3; ++k) {
    outputs.push_back(at::empty({n * (k + 1)}, at::kLong));
    pending.push_back(staged->all_gather_async(at::full({k + 1}, int64_t{10} * r + k, at::kLong), outputs.back()));
  }
  pending.clear();  // dropped unwaited: each waits and copies back in its destructor
  for (int k = 0; k < 3; ++k)
    for (int s = 0; s < n; ++s)
      CHECK(at::equal(outputs[k].narrow(0, s * (k + 1), k + 1), at::full({k + 1}, int64_t{10} * s + k, at::kLong)));
  staged->barrier();
}

TEST_CASE("host-staged MPI: a non-contiguous tensor is refused naming the collective", "[host_staged]") {
  auto staged = dist::make_host_staged_communicator(dist::make_mpi_communicator(), /*stage_cpu_tensors=*/true);
  at::Tensor strided = at::zeros({4, 4}, at::kFloat).t();
  CHECK_THROWS_WITH(staged->all_reduce(strided, dist::ReduceOp::Sum),
                    Contains("host-staged)::all_reduce") && Contains("contiguous"));
}

}  // namespace ditrl
