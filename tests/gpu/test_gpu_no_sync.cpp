// Work that must not wait for the GPU: under dist::ForbidHostSync (LibTorch's
// sync debug mode set to error, as `debug.forbid_host_sync` sets it) any call
// that synchronises the host with the device (an .item(), a copy to or from
// pageable host memory) throws, so each case runs its code under it and then
// compares the results with the CPU's.
// SKIPPED where no GPU is visible (gpu_main.cpp).
#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/reduction.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rl/metric_buffer.hpp>
#include <ditrl/rl/metrics.hpp>
#include <ditrl/shard/grad_norm.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "measured.hpp"

using namespace ditrl;

namespace {

const c10::Device kGpu(c10::kCUDA, 0);

at::Tensor f32(std::vector<float> v) {
  return at::tensor(v, at::kFloat);
}

}  // namespace

// The NCCL backend's deterministic reduce-scatter runs this on its
// communication stream right after the all-to-all; a host-built index tensor
// copied to the GPU there blocked the host until the transfer had ended.
TEST_CASE("gpu: the canonical sum of chunks does not synchronise the host", "[gpu][dist][tree]") {
  at::Generator gen = at::detail::createCPUGenerator(5);
  for (const c10::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    INFO("dtype " << c10::toString(dtype));
    const at::Tensor host = (at::randn({4, 1000}, gen, at::TensorOptions().dtype(at::kFloat)) * 100).to(dtype);
    at::Tensor expected = at::empty({1000}, host.options());
    dist::tree_sum_of_chunks(host, expected, /*average=*/false);
    const at::Tensor chunks = host.to(kGpu);
    at::Tensor out = at::empty({1000}, chunks.options());
    {
      const dist::ForbidHostSync strict(true, kGpu);
      CHECK_NOTHROW(dist::tree_sum_of_chunks(chunks, out, /*average=*/false));
    }
    CHECK(at::equal(out.cpu(), expected));
  }
}

// The gradient norm reads the agreed extremes and the summed digits once
// each per optimizer step; the digits of each slice stay on the GPU.
TEST_CASE("gpu: the gradient norm's square digits stay on the GPU and equal the CPU loop's", "[gpu][shard][norm]") {
  at::Generator gen = at::detail::createCPUGenerator(11);
  const at::Tensor host = at::randn({(1 << 22) + 12345}, gen, at::TensorOptions().dtype(at::kFloat)) * 1e-3;
  const int scale = -66;  // 2E - 66 with 2^E = 1 above every |g|
  const shard::SquareDigits expected = shard::square_digits(host, scale);
  const at::Tensor on_gpu = host.to(kGpu);
  at::Tensor digits;
  {
    const dist::ForbidHostSync strict(true, kGpu);
    CHECK_NOTHROW(digits = shard::square_digits_by_ops(on_gpu, scale));
  }
  REQUIRE(digits.device() == kGpu);
  const at::Tensor got = digits.cpu();
  CHECK(got[0].item<int64_t>() == expected.hi);
  CHECK(got[1].item<int64_t>() == expected.mid);
  CHECK(got[2].item<int64_t>() == expected.lo);
}

// One device->host copy per optimizer step (MetricBuffer::reduce): an SFT
// micro-batch's metrics read its losses back to pick the sigma buckets.
TEST_CASE("gpu: SFT metrics of a micro-batch stay on the GPU", "[gpu][rl][metrics]") {
  const at::Tensor per_pair = f32({1.0f, 2.0f, 4.0f});
  const at::Tensor host_sigmas = f32({0.1f, 0.15f, 0.9f});
  rl::MetricBuffer on_host(rl::sft_metric_schema(4), c10::kCPU);
  rl::record_sft_metrics(on_host, {at::scalar_tensor(0.0), per_pair}, host_sigmas, 4);
  rl::MetricBuffer on_gpu(rl::sft_metric_schema(4), kGpu);
  // Copied before the strict scope: a copy from pageable host memory waits for the GPU.
  const rl::SftTerms gpu_terms{at::scalar_tensor(0.0, kGpu), per_pair.to(kGpu)};
  {
    const dist::ForbidHostSync strict(true, kGpu);
    CHECK_NOTHROW(rl::record_sft_metrics(on_gpu, gpu_terms, host_sigmas, 4));
  }
  CHECK(on_gpu.local() == on_host.local());
  CHECK_THROWS_WITH(
      rl::record_sft_metrics(on_gpu, {at::scalar_tensor(0.0, kGpu), per_pair.to(kGpu)}, host_sigmas.to(kGpu), 4),
      Catch::Contains("must be the host copy"));
}

// The per-micro-batch and per-denoising-step copies of host data (timesteps,
// sigmas, advantages, noise drawn by CPU generators): many copies queued
// back to back, each from a temporary pinned buffer the allocator must not
// hand out again before its copy has run.
TEST_CASE("gpu: host data reaches the GPU without the host waiting", "[gpu][device]") {
  at::Generator gen = at::detail::createCPUGenerator(9);
  std::vector<at::Tensor> host, on_gpu;
  {
    const dist::ForbidHostSync strict(true, kGpu);
    for (int i = 0; i < 64; ++i) {
      host.push_back(at::randn({3, 257}, gen, at::TensorOptions().dtype(at::kFloat)));
      CHECK_NOTHROW(on_gpu.push_back(dist::host_to_device(host.back(), kGpu)));
    }
  }
  for (size_t i = 0; i < host.size(); ++i) {
    CHECK(on_gpu[i].device() == kGpu);
    CHECK(at::equal(on_gpu[i].cpu(), host[i]));
  }
  CHECK(at::equal(dist::host_to_device(host[0], c10::kCPU), host[0]));
}

// Every training forward picks its prompts' conditioning rows by the batch's
// host prompt indices (Policy::velocity): the index travels to the GPU
// through pinned memory; a plain .to(device) waited for the GPU's queue.
TEST_CASE("gpu: conditioning rows are picked by a host index without the host waiting", "[gpu][models][cond]") {
  at::Generator gen = at::detail::createCPUGenerator(13);
  models::Cond host;
  host.tensors["encoder_hidden_states"] = at::randn({4, 3, 5}, gen, at::TensorOptions().dtype(at::kFloat));
  host.tensors["encoder_hidden_states_mask"] = at::tensor({1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1}, at::kLong).view({4, 3});
  const models::Cond on_gpu = host.to(kGpu);  // once per rollout, where the rows enter
  const at::Tensor index = at::tensor({2, 0, 2}, at::kLong);
  models::Cond picked;
  {
    const dist::ForbidHostSync strict(true, kGpu);
    CHECK_NOTHROW(picked = on_gpu.index_select(index));
  }
  const models::Cond expected = host.index_select(index);
  for (const auto& [name, tensor] : expected.tensors) {
    INFO(name);
    REQUIRE(picked.at(name).device() == kGpu);
    CHECK(at::equal(picked.at(name).cpu(), tensor));
  }
  REQUIRE(picked.on_host("encoder_hidden_states_mask").device().is_cpu());
  CHECK(at::equal(picked.on_host("encoder_hidden_states_mask"), expected.at("encoder_hidden_states_mask")));
}

// The Flow-SDE step scores x_next at every SDE step of a rollout and every
// GRPO micro-batch: its Gaussian log-prob's constant stays a host scalar
// (it was copied to the GPU from pageable memory at each call).
TEST_CASE("gpu: an SDE step's log-prob does not synchronise the host", "[gpu][diffusion][sde]") {
  at::Generator gen = at::detail::createCPUGenerator(17);
  const auto floats = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor x = at::randn({2, 4, 8, 8}, gen, floats);
  const at::Tensor v = at::randn({2, 4, 8, 8}, gen, floats);
  const at::Tensor x_next = at::randn({2, 4, 8, 8}, gen, floats);
  const at::Tensor sigma = f32({0.8f, 0.8f}), sigma_next = f32({0.6f, 0.6f});
  const diffusion::StepKernel kernel{diffusion::SdeType::Sde, 0.7};
  const diffusion::StepResult expected =
      diffusion::sde_step(kernel, v, x, {sigma, sigma_next, 0.95f}, diffusion::StepTarget::score(x_next));
  const diffusion::StepSigmas on_gpu{sigma.to(kGpu), sigma_next.to(kGpu), 0.95f};
  const at::Tensor gx = x.to(kGpu), gv = v.to(kGpu), g_next = x_next.to(kGpu);
  diffusion::StepResult r;
  {
    const dist::ForbidHostSync strict(true, kGpu);
    CHECK_NOTHROW(r = diffusion::sde_step(kernel, gv, gx, on_gpu, diffusion::StepTarget::score(g_next)));
  }
  REQUIRE(r.log_prob.device() == kGpu);
  // Measured: printed ("measured:"), not yet recorded from a GPU run.
  ditrl::test::print_measured("SDE step log-prob, GPU against CPU, max |diff|",
                              ditrl::test::max_abs_difference(r.log_prob, expected.log_prob), "1e-6 + 1e-5 |cpu|");
  ditrl::test::print_measured("SDE step mean, GPU against CPU, max |diff|",
                              ditrl::test::max_abs_difference(r.mean, expected.mean), "1e-6 + 1e-5 |cpu|");
  CHECK(at::allclose(r.log_prob.cpu(), expected.log_prob, 1e-5, 1e-6));
  CHECK(at::allclose(r.mean.cpu(), expected.mean, 1e-5, 1e-6));
}
