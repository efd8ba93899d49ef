// Rewards scoring latents that a GPU rollout left on the device: the
// analytic ones compute there (target_pattern with its host-drawn pattern
// moved over), a TorchScript module is loaded onto the GPU and fed there.
// Each gives the CPU's scores. SKIPPED where no GPU is visible (gpu_main.cpp).
#include <ditrl/rollout/reward.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <fstream>

#include "measured.hpp"

using namespace ditrl::rollout;

namespace {

const c10::Device kGpu(c10::kCUDA, 0);

at::Tensor latents() {
  at::Generator gen = at::detail::createCPUGenerator(11);
  return at::randn({4, 4, 8, 8}, gen, at::TensorOptions().dtype(at::kFloat));
}

// The scores of the latents on the host and on the GPU (both come back on the host).
void check_same_scores(Reward& reward, const at::Tensor& index) {
  const at::Tensor x = latents();
  const at::Tensor on_host = reward.score(x, index, {"a", "b", "c", "d"});
  const at::Tensor on_gpu = reward.score(x.to(kGpu), index, {"a", "b", "c", "d"});
  CHECK(on_gpu.device().is_cpu());
  // Measured: printed ("measured:"), not yet recorded from a GPU run.
  ditrl::test::print_measured("reward scores, GPU against host, max |diff|",
                              ditrl::test::max_abs_difference(on_gpu, on_host), "1e-6 + 1e-5 |host|");
  CHECK(at::allclose(on_gpu, on_host, 1e-5, 1e-6));
}

}  // namespace

TEST_CASE("gpu: the analytic rewards score latents on the GPU as on the CPU", "[gpu][reward]") {
  for (const auto& [name, function] : ditrl::rollout::kAnalyticNames) {
    INFO("reward.analytic = " << name);
    RewardOptions options;
    options.analytic = function;
    check_same_scores(*make_reward(options), at::arange(4, at::kLong));
  }
}

TEST_CASE("gpu: a TorchScript reward module runs on the GPU and scores as on the CPU", "[gpu][reward][torchscript]") {
  const std::string dir = ditrl::test::fresh_output_dir("gpu_reward_ts");
  // The module refuses host inputs, so a pass shows it ran on the device.
  std::ofstream(dir + "/make.py") << R"(
import sys, torch
class Two(torch.nn.Module):
    def forward(self, latents: torch.Tensor, prompt_index: torch.Tensor) -> torch.Tensor:
        torch._assert(latents.is_cuda and prompt_index.is_cuda, "reward inputs are on the host")
        return latents.flatten(1).mean(1) + prompt_index.to(torch.float32)
torch.jit.script(Two()).save(sys.argv[1] + "/two.pt")
)";
  const auto made = ditrl::test::run_process(std::string(DITRL_PYTHON) + " " + dir + "/make.py " + dir);
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  RewardOptions options;
  options.kind = ditrl::rollout::RewardKind::TorchScript;
  options.module = dir + "/two.pt";
  options.device = kGpu;
  const at::Tensor index = at::tensor({3, 0, 2, 1}, at::kLong);
  check_same_scores(*make_reward(options), index);
  const at::Tensor x = latents();
  const at::Tensor scored = make_reward(options)->score(x, index, {"a", "b", "c", "d"});
  const at::Tensor formula = x.flatten(1).mean(1) + index.to(at::kFloat);
  // Measured: printed ("measured:"), not yet recorded from a GPU run.
  ditrl::test::print_measured("TorchScript reward against its formula, max |diff|",
                              ditrl::test::max_abs_difference(scored, formula), "1e-6 + 1e-5 |formula|");
  CHECK(at::allclose(scored, formula, 1e-5, 1e-6));
  options.device = c10::kCPU;
  CHECK_THROWS_WITH(make_reward(options)->score(x, index, {"a", "b", "c", "d"}),
                    Catch::Contains("reward inputs are on the host"));
}
