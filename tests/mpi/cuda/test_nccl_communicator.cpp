// ditrl-mpi-ranks: 1 2
//
// The NCCL backend; built only with -DDITRL_CUDA=ON and run where GPUs are
// (one per rank on the node). Needs a LibTorch with CUDA to make CUDA tensors.
// A peer that never joins: test_nccl_timeout.cpp (2 ranks only, so that no
// rank count runs it as a case with nothing to check).
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/nccl_communicator.hpp>
#include <ditrl/error.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include "measured.hpp"

namespace ditrl {

namespace {

using Catch::Matchers::Contains;

// This rank's GPU, or -1 (with the reason) when the node has fewer GPUs than
// ranks, which tests/gpu/skip_without_gpu.sh reports as SKIPPED before the run.
int local_device() {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local_rank = 0, local_size = 1, count = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_size(node, &local_size);
  MPI_Comm_free(&node);
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (count < local_size) {
    WARN("NCCL tests need one GPU per rank: " << local_size << " ranks on this node, " << count << " GPUs; not run");
    return -1;
  }
  return local_rank;
}

at::TensorOptions on(int device, c10::ScalarType dtype) {
  return at::TensorOptions().device(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device))).dtype(dtype);
}

}  // namespace

TEST_CASE("nccl: all_gather / reduce_scatter / all_reduce / broadcast / barrier / split on CUDA tensors", "[nccl]") {
  const int device = local_device();
  REQUIRE(device >= 0);
  auto comm = dist::make_nccl_communicator(MPI_COMM_WORLD, {device, 60, 30});
  const int n = comm->size(), r = comm->rank();
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    INFO(c10::toString(dtype));
    at::Tensor out = at::empty({n * 513}, on(device, dtype));
    comm->all_gather(at::full({513}, r + 1.0, on(device, dtype)), out);
    for (int s = 0; s < n; ++s) CHECK(at::equal(out.narrow(0, s * 513, 513).cpu(), at::full({513}, s + 1.0, dtype)));

    at::Tensor input = at::arange(n * 64, on(device, at::kFloat)).add_(r).to(dtype),
               mine = at::empty({64}, on(device, dtype));
    comm->reduce_scatter(input, mine, dist::ReduceOp::Avg);
    const at::Tensor expected = at::arange(r * 64, (r + 1) * 64, at::kFloat).add_((n - 1) / 2.0);
    // Measured: printed ("measured:"), not yet recorded from a GPU run.
    if (r == 0)
      ditrl::test::print_measured(
          fmt::format("{} reduce_scatter Avg against the exact mean, max |diff|", c10::toString(dtype)),
          ditrl::test::max_abs_difference(mine.cpu().to(at::kFloat), expected), "1e-2 + 1e-2 |exact|");
    CHECK(at::allclose(mine.cpu().to(at::kFloat), expected, 1e-2, 1e-2));

    at::Tensor all = at::full({1000}, static_cast<double>(r), on(device, dtype));
    comm->all_reduce(all, dist::ReduceOp::Sum);
    CHECK(at::equal(all.cpu(), at::full({1000}, n * (n - 1) / 2.0, dtype)));
  }
  at::Tensor b = r == 0 ? at::arange(77, on(device, at::kLong)) : at::zeros({77}, on(device, at::kLong));
  comm->broadcast(b, 0);
  CHECK(at::equal(b.cpu(), at::arange(77, at::kLong)));
  comm->barrier();

  auto sub = comm->split(r % 2, r);
  at::Tensor ones = at::ones({8}, on(device, at::kFloat));
  sub->all_reduce(ones, dist::ReduceOp::Sum);
  CHECK(ones.cpu()[0].item<float>() == static_cast<float>(sub->size()));
  at::Tensor host = ones.cpu();
  CHECK_THROWS_WITH(comm->all_reduce(host, dist::ReduceOp::Sum), Contains("contiguous tensor on cuda"));
}

}  // namespace ditrl
