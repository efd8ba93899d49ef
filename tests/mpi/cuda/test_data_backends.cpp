// ditrl-mpi-ranks: 1 2 4
// ditrl-mpi-data-ranks: 2 4
//
// The three data backends give the same bits for the same inputs: MPI on CPU
// tensors, MPI staged through pinned host buffers on CUDA tensors
// ([parallel] data_backend = "mpi") and NCCL in deterministic mode, for the
// collectives a training step uses (tests/support/collective_bits.hpp:
// reduce-scatter, all-reduce, all-gather, all-to-all, broadcast, blocking and
// *_async, fp32 / bf16 / fp16). Every sum is the canonical tree of
// dist/reduction.hpp, so no tolerance applies.
// mpi.test_data_backends.np<N> needs a GPU per rank and holds all three;
// mpi.test_data_backends.mpi_data.np<N> puts every rank on one GPU and holds
// the two MPI paths (NCCL refuses two ranks on one GPU: the [needs_nccl]
// case is left out there).
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/nccl_communicator.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "collective_bits.hpp"
#include "gpu_data.hpp"
#include "mpi_world.hpp"

namespace ditrl {

namespace {

void check_same(const test::CollectiveResults& reference, const test::CollectiveResults& other, const char* what) {
  INFO(what << " against MPI on the CPU at " << test::world() << " ranks");
  REQUIRE(other.size() == reference.size());
  const std::string differ = test::differing(reference, other);
  INFO("differing results:\n" << differ);
  CHECK(differ.empty());
}

}  // namespace

TEST_CASE("data backends: host-staged MPI on the GPU gives the CPU MPI path's bits", "[data_backends]") {
  const c10::Device gpu = test::test_gpu();
  auto mpi = dist::make_mpi_communicator();
  auto staged = dist::make_host_staged_communicator(dist::make_mpi_communicator());
  const test::CollectiveResults on_cpu = test::run_collectives(*mpi, c10::kCPU);
  // Twice: the second pass reuses the first one's pinned buffers.
  for (int pass = 0; pass < 2; ++pass) {
    INFO("pass " << pass);
    check_same(on_cpu, test::run_collectives(*staged, gpu), "host-staged MPI on the GPU");
  }
}

TEST_CASE("data backends: CPU MPI and host-staged MPI and deterministic NCCL give the same bits",
          "[data_backends][needs_nccl]") {
  const c10::Device gpu = test::test_gpu();
  auto mpi = dist::make_mpi_communicator();
  auto staged = dist::make_host_staged_communicator(dist::make_mpi_communicator());
  auto nccl = dist::make_nccl_communicator(MPI_COMM_WORLD, {gpu.index(), 60, 30, /*deterministic=*/true});
  const test::CollectiveResults on_cpu = test::run_collectives(*mpi, c10::kCPU);
  check_same(on_cpu, test::run_collectives(*staged, gpu), "host-staged MPI on the GPU");
  check_same(on_cpu, test::run_collectives(*nccl, gpu), "deterministic NCCL");
}

}  // namespace ditrl
