// ditrl-mpi-ranks: 2 4
// ditrl-mpi-data-ranks: 2 4
//
// Ulysses sequence parallelism on CUDA over the data communicator of
// support/gpu_data.hpp: NCCL where each rank has a GPU
// (tests/gpu/skip_without_gpu.sh), or the MPI data backend with every rank on
// one GPU (mpi.test_nccl_ulysses.mpi_data.np<N>): the all-to-all of raw bytes
// against the CPU MPI backend's, the exchange's round trip in fp32 and bf16, and a Wan forward and
// backward at sequence_parallel = 2 against the unsplit one on the same GPU,
// with an all-gather of the world communicator in flight across it (two NCCL
// communicators in use at once, issued in the same order on every rank, as a
// training step does with the parameter prefetch and the group's all-to-alls).
// The model comparison has a tolerance: cuBLAS may pick other kernels for the
// split's smaller row counts (the CPU test, tests/mpi/test_ulysses.cpp, is bitwise).
// Measured: not yet on a GPU; the case prints its worst difference
// ("measured:") beside the bound for the next GPU run to record.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/nccl_communicator.hpp>
#include <ditrl/dist/sequence_parallel.hpp>
#include <ditrl/models/ulysses.hpp>
#include <ditrl/models/wan/wan.hpp>
#include <ditrl/models/weights.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <map>

#include "gpu_data.hpp"
#include "mpi_world.hpp"
#include "ulysses_case.hpp"

namespace ditrl {

namespace {

c10::Device gpu(int device) {
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
}

// This rank's GPU (support/gpu_data.hpp) as an index.
int local_device() {
  return test::test_gpu().index();
}

std::unique_ptr<dist::Communicator> data_world() {
  return test::data_communicator(/*collective_timeout_s=*/60);
}

// Rank r's values: distinct per rank and element, every bit pattern used.
at::Tensor rank_values(int64_t numel, c10::ScalarType dtype) {
  at::manual_seed(77 + test::rank());
  if (dtype == at::kLong) return at::randint(-(int64_t{1} << 40), int64_t{1} << 40, {numel}, at::kLong);
  return at::randn({numel}, at::kFloat).mul_(1000).to(dtype);
}

}  // namespace

TEST_CASE("cuda ulysses: all_to_all moves fp32 and bf16 and int64 chunks bit for bit as the MPI backend does",
          "[nccl_ulysses]") {
  const int device = local_device();
  auto data = data_world();
  auto mpi = dist::make_mpi_communicator();
  const int64_t n = data->size();
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    for (const int64_t chunk : {int64_t{1}, int64_t{1000}, int64_t{333333}}) {
      INFO(c10::toString(dtype) << ", chunks of " << chunk << " elements");
      const at::Tensor send = rank_values(n * chunk, dtype);
      at::Tensor on_cpu = at::empty_like(send);
      mpi->all_to_all(send, on_cpu);
      at::Tensor on_gpu = at::empty({n * chunk}, send.options().device(gpu(device)));
      data->all_to_all(send.to(gpu(device)), on_gpu);
      CHECK(at::equal(on_gpu.cpu(), on_cpu));
    }
  }
}

TEST_CASE("cuda ulysses: the all-to-all round trip and its backward restore the token split on the GPU",
          "[nccl_ulysses]") {
  const int device = local_device();
  auto world = data_world();
  const models::Ulysses ulysses(*world);
  const int n = world->size();
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO(c10::toString(dtype));
    at::manual_seed(3);
    // (B, H, L, Dh) of the whole sequence, the same on every rank.
    const at::Tensor full = at::randn({2, 4 * n, 8 * n, 5}).to(dtype).to(gpu(device));
    const at::Tensor local = ulysses.shard(full, 2).clone().requires_grad_(true);
    const at::Tensor heads = ulysses.tokens_to_heads(local);
    CHECK(at::equal(heads.detach(), full.narrow(1, world->rank() * 4, 4)));
    const at::Tensor back = ulysses.heads_to_tokens(heads);
    CHECK(at::equal(back.detach(), local.detach()));
    CHECK(at::equal(ulysses.gather(local, 2).detach(), full));
    // The exchange and its inverse compose to the identity, so do their adjoints.
    const at::Tensor weight = at::randn(local.sizes()).to(dtype).to(gpu(device));
    (back * weight).sum().backward();
    CHECK(at::equal(local.grad(), weight));
  }
}

TEST_CASE("cuda ulysses: wan at sequence_parallel = 2 tracks the unsplit forward with a world all-gather in flight",
          "[nccl_ulysses]") {
  const int device = local_device();
  // fp32 throughout: no TF32 in cuBLAS or cuDNN (the patch embedding's conv).
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  auto world = data_world();
  dist::SequenceGroups groups(*world, 2);

  auto wan = test::make_wan(4, gpu(device));
  const test::Inputs in = test::make_inputs(*wan, test::Grid{}, /*per_token=*/false, gpu(device));

  const test::Pass ref = test::run(*wan, in, nullptr);
  // A world collective issued before the group's all-to-alls and waited for
  // after them, as a training step's parameter prefetch is.
  const int64_t numel = 1 << 16;
  const at::Tensor mine =
      at::full({numel}, static_cast<double>(world->rank()), at::TensorOptions().device(gpu(device)));
  at::Tensor all = at::empty({world->size() * numel}, mine.options());
  dist::Pending prefetch = world->all_gather_async(mine, all);
  const models::Ulysses ulysses(groups.group());
  const test::Pass sp = test::run(*wan, in, &ulysses);
  prefetch.wait();
  for (int r = 0; r < world->size(); ++r)
    CHECK(at::equal(all.narrow(0, r * numel, numel).cpu(), at::full({numel}, static_cast<double>(r))));

  double worst = test::relative_difference(sp.output, ref.output);
  CHECK(worst < 1e-4);
  // Each rank's latents gradient covers its own tokens, N times over (the
  // gathered output's backward): the group's mean is the whole one.
  worst = std::max(worst, test::relative_difference(test::group_mean(groups.group(), sp.d_latents), ref.d_latents));
  CHECK(worst < 1e-4);
  REQUIRE(sp.grads.size() == ref.grads.size());
  for (const auto& [name, g] : ref.grads) {
    INFO("parameter " << name);
    const double d = test::relative_difference(test::group_mean(groups.group(), sp.grads.at(name)), g);
    CHECK(d < 1e-4);
    worst = std::max(worst, d);
  }
  if (test::rank() == 0)
    std::printf(
        "measured: cuda ulysses over %s: wan SP 2 of %d ranks on the GPU: worst difference %.3g of its max "
        "(bound 1e-4)\n",
        test::data_backend_name(), world->size(), worst);
}

}  // namespace ditrl
