// ditrl-mpi-ranks: 2
//
// An NCCL collective that a peer never joins times out and aborts the
// communicator instead of hanging. Two ranks only: at one rank there is no
// peer to be missing, and the case would pass without checking anything. Run
// where each rank has a GPU; SKIPPED with the reason otherwise
// (tests/gpu/skip_without_gpu.sh). The MPI data backend's stuck-rank case is
// the watchdog's (gpu.faults.stopped_rank.mpi_data).
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/nccl_communicator.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "gpu_data.hpp"
#include "mpi_world.hpp"

namespace ditrl {

using Catch::Matchers::Contains;

TEST_CASE("nccl: a collective a peer never joins times out and aborts instead of hanging", "[nccl]") {
  REQUIRE(test::world() >= 2);
  const c10::Device gpu = test::test_gpu();
  auto comm = dist::make_nccl_communicator(MPI_COMM_WORLD, {gpu.index(), 60, 2.0});
  if (test::rank() == 0) {
    at::Tensor t = at::ones({1024}, at::TensorOptions().device(gpu));
    comm->all_reduce(t, dist::ReduceOp::Sum);  // rank 1 never joins
    CHECK_THROWS_WITH(comm->barrier(), Contains("did not complete within 2 s") && Contains("communicator aborted"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace ditrl
