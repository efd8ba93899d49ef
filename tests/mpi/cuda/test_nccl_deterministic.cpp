// ditrl-mpi-ranks: 1 2 4
//
// The NCCL backend's deterministic reductions are the MPI backend's
// fixed-order fp32 sums, bit for bit: the same inputs reduced by both give
// equal bytes (run where each rank has a GPU; tests/gpu/skip_without_gpu.sh).
// Inputs span 12 decades, so at 4 ranks any other grouping of the additions
// would round differently; at 1 and 2 ranks every order gives the same sum.
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/nccl_communicator.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "mpi_world.hpp"

namespace ditrl {

namespace {

// fp32 on rank r's GPU (the one its NCCL communicator is bound to).
at::TensorOptions cuda_f32(int rank) {
  return at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(rank))).dtype(at::kFloat);
}

// Values over many magnitudes, so that any other grouping of the additions
// rounds differently: rank r's tensor from its own seed.
at::Tensor inputs_of(int rank, int64_t numel) {
  at::manual_seed(2024 + rank);
  return at::randn({numel}, at::kFloat).mul_(at::pow(10.0, at::randint(-6, 7, {numel}).to(at::kFloat)));
}

}  // namespace

TEST_CASE("nccl deterministic: reduce-scatter and all-reduce equal the MPI backend's bitwise", "[nccl_deterministic]") {
  const int n = test::world(), r = test::rank();
  auto mpi = dist::make_mpi_communicator();
  // One GPU per rank: the skip wrapper made sure there are enough; bind ours.
  auto nccl = dist::make_nccl_communicator(MPI_COMM_WORLD, {r, 60, 30, /*deterministic=*/true});
  for (const int64_t chunk : {1, 1000, 1 << 18, 333333}) {
    INFO("chunk " << chunk << " elements, " << n << " ranks");
    const at::Tensor input = inputs_of(r, n * chunk);
    for (const dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg}) {
      at::Tensor on_cpu = at::empty({chunk}, at::kFloat);
      mpi->reduce_scatter(input, on_cpu, op);
      at::Tensor on_gpu = at::empty({chunk}, cuda_f32(r));
      nccl->reduce_scatter(input.to(cuda_f32(r)), on_gpu, op);
      CHECK(at::equal(on_gpu.cpu(), on_cpu));

      at::Tensor all_cpu = input.clone(), all_gpu = input.to(cuda_f32(r));
      mpi->all_reduce(all_cpu, op);
      nccl->all_reduce(all_gpu, op);
      CHECK(at::equal(all_gpu.cpu(), all_cpu));
    }
    at::Tensor async_out = at::empty({chunk}, cuda_f32(r)), sync_out = at::empty({chunk}, cuda_f32(r));
    const at::Tensor on_device = input.to(cuda_f32(r));
    dist::Pending pending = nccl->reduce_scatter_async(on_device, async_out, dist::ReduceOp::Sum);
    pending.wait();
    nccl->reduce_scatter(on_device, sync_out, dist::ReduceOp::Sum);
    CHECK(at::equal(async_out.cpu(), sync_out.cpu()));
  }
}

}  // namespace ditrl
