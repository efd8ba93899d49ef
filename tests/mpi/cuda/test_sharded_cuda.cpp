// ditrl-mpi-ranks: 1 2
// ditrl-mpi-data-ranks: 2 4
//
// A sharded training step on CUDA (slices, gathers with prefetch, overlapped
// reduce-scatters and AdamW on the GPU; the data communicator of
// support/gpu_data.hpp: NCCL in deterministic mode, one GPU per rank, or the
// MPI data backend with every rank on one GPU) against the same step on the
// CPU with the MPI communicator, and against the 1-rank step on the GPU, from
// the same seeded weights and batches.
// Tolerance (fp32 compute; TF32 stays off): per-step loss and gradient norm
// within 1e-5 relative; after 3 AdamW steps, the parameters' distance from
// the CPU run's within 1e-2 of the distance the CPU run moved them. GPU and
// CPU kernels sum in other orders (~1e-7 relative per op), and AdamW's first
// steps normalise each gradient element, so elements whose gradient is near
// 0 may move differently: the bound is on the whole update, not elementwise.
// Measured: not yet on a GPU at 2 or 4 ranks; each case prints its measured
// differences ("measured:") beside the bounds for the next GPU run to record.
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/nccl_communicator.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <torch/torch.h>
#include <catch2/catch.hpp>

#include "block_stack.hpp"
#include "gpu_data.hpp"
#include "mpi_world.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace ditrl {

namespace {

const test::StackShape kShape{16, 96, 384, 8, 3};
constexpr int64_t kBatch = 32;
constexpr int kSteps = 3;
constexpr double kLr = 1e-2;

struct Run {
  std::vector<double> losses, norms;
  std::map<std::string, at::Tensor> params;  // fp32, on the CPU
};

// comm: the data communicator of `device`; host: MPI, for the loss mean.
Run train(dist::Communicator& comm, dist::Communicator& host, const c10::Device& device,
          shard::ShardOptions options = {}) {
  test::BlockStack model(kShape, 3);
  const auto plan =
      precision::PrecisionPlan(at::kFloat, at::kFloat, at::kFloat, {}).compile(test::parameter_names(model));
  options.device = device;
  shard::ShardedParams params(model, model.wrap_units(), plan, comm, options);
  models::ForwardContext ctx;
  ctx.runner = &params;
  Run run;
  const int64_t rows = kBatch / comm.size();
  for (int step = 0; step < kSteps; ++step) {
    torch::manual_seed(500 + step);
    const at::Tensor x = torch::randn({kBatch, kShape.in}).narrow(0, comm.rank() * rows, rows).to(device);
    const at::Tensor y = torch::randn({kBatch, kShape.out}).narrow(0, comm.rank() * rows, rows).to(device);
    params.zero_grad();
    params.begin_step();
    const at::Tensor loss = torch::mse_loss(model.forward(x, ctx), y);
    loss.backward();
    params.finish_backward();
    at::Tensor mean = loss.detach().to(at::kCPU, at::kDouble).reshape({1});
    host.all_reduce(mean, dist::ReduceOp::Avg);
    run.losses.push_back(mean.item<double>());
    run.norms.push_back(params.clip_grad(1.0));
    params.adamw_step(kLr);
  }
  for (const std::string& name : test::parameter_names(model)) run.params[name] = params.gather_full(name).cpu();
  return run;
}

// Worst relative difference of `b` from `a` over the steps.
double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(b[i] - a[i]) / std::abs(a[i]));
  return worst;
}

// Checks `other` against `reference` within the bounds stated at the top and
// prints what was measured (rank 0).
void check_close(const Run& reference, const Run& other, const char* what) {
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    CHECK(other.losses[step] == Approx(reference.losses[step]).epsilon(1e-5));
    CHECK(other.norms[step] == Approx(reference.norms[step]).epsilon(1e-5));
  }
  test::BlockStack initial(kShape, 3);
  double moved = 0, apart = 0;
  for (auto& item : initial.named_parameters()) {
    const at::Tensor& c = reference.params.at(item.key());
    REQUIRE(other.params.at(item.key()).sizes() == c.sizes());
    moved += (c - item.value().detach()).pow(2).sum().item<double>();
    apart += (other.params.at(item.key()) - c).pow(2).sum().item<double>();
  }
  INFO("|other - reference| = " << std::sqrt(apart) << ", |reference - initial| = " << std::sqrt(moved));
  CHECK(moved > 0);
  CHECK(std::sqrt(apart) <= 1e-2 * std::sqrt(moved));
  if (test::rank() == 0)
    std::printf(
        "measured: %s at %d ranks over %s: loss %.3g, norm %.3g relative (bound 1e-5); parameters %.3g of the "
        "update (bound 1e-2)\n",
        what, test::world(), test::data_backend_name(), worst_relative(reference.losses, other.losses),
        worst_relative(reference.norms, other.norms), std::sqrt(apart) / std::sqrt(moved));
}

}  // namespace

TEST_CASE("sharded step on CUDA equals the CPU reference within the stated tolerance", "[sharded_cuda]") {
  auto mpi = dist::make_mpi_communicator();
  auto data = test::data_communicator();
  const Run cpu = train(*mpi, *mpi, c10::kCPU);
  const Run gpu = train(*data, *mpi, test::test_gpu());
  check_close(cpu, gpu, "the GPU step against the CPU step");
}

// At one rank nothing is gathered and no gradient is reduced (docs/design.md
// §3): the sharded step on N ranks is held to the unsharded one on the same
// GPU. Different sums over each rank's rows make it not bitwise.
TEST_CASE("sharded step on CUDA at N ranks tracks the 1-rank step on the GPU", "[sharded_cuda]") {
  const int r = test::rank();
  auto mpi = dist::make_mpi_communicator();
  auto data = test::data_communicator();
  auto alone = data->split(r, 0);
  auto alone_host = mpi->split(r, 0);
  const Run one = train(*alone, *alone_host, test::test_gpu());
  const Run many = train(*data, *mpi, test::test_gpu());
  check_close(one, many, "the sharded GPU step against the 1-rank GPU step");
}

// The order of the data communicator's work: a prefetched gather in flight
// while the previous unit computes, reduce-scatters left in flight through
// the backward (Pending, waited for at finish_backward), and no gather kept
// between forward and backward without recompute. Each ordering must give
// the plain one's bits: the same kernels run on the same data.
TEST_CASE("sharded step on CUDA: prefetch and reshard_after_forward and recompute change no bit", "[sharded_cuda]") {
  auto mpi = dist::make_mpi_communicator();
  auto data = test::data_communicator();
  shard::ShardOptions plain;
  plain.prefetch = false;
  const Run base = train(*data, *mpi, test::test_gpu(), plain);
  for (const bool recompute : {true, false})
    for (const bool reshard : {false, true}) {
      INFO("prefetch, recompute " << recompute << ", reshard_after_forward " << reshard);
      shard::ShardOptions options;
      options.prefetch = true;
      options.recompute = recompute;
      options.reshard_after_forward = reshard;
      const Run run = train(*data, *mpi, test::test_gpu(), options);
      CHECK(run.losses == base.losses);
      CHECK(run.norms == base.norms);
      for (const auto& [name, p] : base.params) CHECK(at::equal(run.params.at(name), p));
    }
}

// The norm's extremes are reduced on the GPU (shard/grad_norm.cpp): a NaN
// input on one rank makes every rank's norm NaN; an infinite one makes it
// non-finite (inf, or NaN where inf - inf meets in a matmul).
TEST_CASE("gradient norm on CUDA: a non-finite gradient on one rank is every rank's norm", "[sharded_cuda]") {
  const int r = test::rank();
  auto data = test::data_communicator();
  const c10::Device gpu = test::test_gpu();
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    INFO("input " << bad);
    test::BlockStack model(kShape, 3);
    const auto plan =
        precision::PrecisionPlan(at::kFloat, at::kFloat, at::kFloat, {}).compile(test::parameter_names(model));
    shard::ShardOptions options;
    options.device = gpu;
    shard::ShardedParams params(model, model.wrap_units(), plan, *data, options);
    models::ForwardContext ctx;
    ctx.runner = &params;
    params.begin_step();
    at::Tensor x = torch::randn({2, kShape.in});
    if (r == data->size() - 1) x[0][0] = bad;
    model.forward(x.to(gpu), ctx).sum().backward();
    params.finish_backward();
    const double norm = params.grad_norm();
    CHECK_FALSE(std::isfinite(norm));
    if (std::isnan(bad)) CHECK(std::isnan(norm));
    params.zero_grad();
    CHECK(params.grad_norm() == 0.0);
  }
}

}  // namespace ditrl
