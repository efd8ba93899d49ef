#include <ditrl/error.hpp>
#include <ditrl/rollout/reward.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "process.hpp"

#include <filesystem>
#include <fstream>

using namespace ditrl::rollout;
using Catch::Matchers::Contains;

namespace {

at::Tensor sample_latents() {
  at::Generator gen = at::detail::createCPUGenerator(7);
  return at::randn({3, 4, 6, 6}, gen, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

TEST_CASE("reward: analytic scores are per-sample and finite", "[reward]") {
  const at::Tensor x = sample_latents();
  const at::Tensor index = at::arange(3, at::kLong);
  for (const auto& [name, function] : kAnalyticNames) {
    INFO("reward.analytic = " << name);
    RewardOptions options;
    options.analytic = function;
    auto reward = make_reward(options);
    const at::Tensor all = reward->score(x, index, {"a", "b", "c"});
    REQUIRE(all.sizes() == at::IntArrayRef{3});
    for (int64_t i = 0; i < 3; ++i)  // the same value whatever the batch it is scored in
      CHECK(all[i].item<float>() == reward->score(x.narrow(0, i, 1), index.narrow(0, i, 1), {"a"})[0].item<float>());
  }
}

TEST_CASE("reward: target_pattern is highest at the target and falls with distance", "[reward]") {
  RewardOptions options;
  auto reward = make_reward(options);
  const at::Tensor x = sample_latents();
  // Recover the target: brightness-free check via the closed form r(x) = -mean((x - T)^2).
  const at::Tensor zero = at::zeros_like(x);
  const at::Tensor r0 = reward->score(zero, at::arange(3, at::kLong), {});
  CHECK(at::allclose(r0, r0[0].expand({3})));  // same pattern for every sample
  const at::Tensor near = reward->score(zero.add(0.01), at::arange(3, at::kLong), {});
  const at::Tensor far = reward->score(zero.add(3.0), at::arange(3, at::kLong), {});
  CHECK((far < near).all().item<bool>());
}

TEST_CASE("reward: a TorchScript module / with and without prompt indices", "[reward][torchscript]") {
  const std::string dir = ditrl::test::fresh_output_dir("reward_ts");
  const std::string script = dir + "/make.py";
  std::ofstream(script) << R"(
import sys, torch
class Two(torch.nn.Module):
    def forward(self, latents: torch.Tensor, prompt_index: torch.Tensor) -> torch.Tensor:
        return latents.flatten(1).mean(1) + prompt_index.to(torch.float32)
class One(torch.nn.Module):
    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.flatten(1).abs().amax(1)
class Bad(torch.nn.Module):
    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        return latents.flatten(1)
torch.jit.script(Two()).save(sys.argv[1] + "/two.pt")
torch.jit.script(One()).save(sys.argv[1] + "/one.pt")
torch.jit.script(Bad()).save(sys.argv[1] + "/bad.pt")
)";
  const auto made = ditrl::test::run_process(std::string(DITRL_PYTHON) + " " + script + " " + dir);
  REQUIRE(made.exit_code == 0);
  const at::Tensor x = sample_latents();
  const at::Tensor index = at::tensor({4, 0, 2}, at::kLong);

  RewardOptions options;
  options.kind = RewardKind::TorchScript;
  options.module = dir + "/two.pt";
  CHECK(at::allclose(make_reward(options)->score(x, index, {}), x.flatten(1).mean(1) + index.to(at::kFloat)));
  options.module = dir + "/one.pt";
  CHECK(at::equal(make_reward(options)->score(x, index, {}), x.flatten(1).abs().amax(1)));
  options.module = dir + "/bad.pt";
  CHECK_THROWS_WITH(make_reward(options)->score(x, index, {}), Contains("expected a [3] tensor, got shape [3, 144]"));
  options.module = dir + "/missing.pt";
  CHECK_THROWS_WITH(make_reward(options), Contains("missing.pt: no such file"));
}

TEST_CASE("reward: an external command reading and writing HDF5", "[reward][command]") {
  const std::string dir = ditrl::test::fresh_output_dir("reward_cmd");
  const std::string script = dir + "/score.py";
  std::ofstream(script) << R"(
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    lat = f["latents"][...]
    idx = f["prompt_index"][...]
    texts = [t.decode() if isinstance(t, bytes) else t for t in f["prompts"][...]]
rewards = lat.reshape(lat.shape[0], -1).mean(1) + np.array([len(t) for t in texts]) + 0 * idx
if len(sys.argv) > 3 and sys.argv[3] == "drop-one": rewards = rewards[:-1]
kind = np.int64 if len(sys.argv) > 3 and sys.argv[3] == "int64" else np.float32
with h5py.File(sys.argv[2], "w") as f:
    f["rewards"] = rewards.astype(kind)
)";
  const at::Tensor x = sample_latents();
  RewardOptions options;
  options.kind = RewardKind::Command;
  options.work_dir = dir;
  options.command = std::string(DITRL_PYTHON) + " " + script + " {input} {output}";
  const at::Tensor r = make_reward(options)->score(x, at::arange(3, at::kLong), {"a", "bb", "ccc"});
  CHECK(at::allclose(r, x.flatten(1).mean(1) + at::tensor({1.0f, 2.0f, 3.0f})));

  options.command = std::string(DITRL_PYTHON) + " " + script + " {input} {output} drop-one";
  CHECK_THROWS_WITH(make_reward(options)->score(x, at::arange(3, at::kLong), {"a", "b", "c"}),
                    Contains("expected a [3] tensor, got shape [2]"));
  options.command = std::string(DITRL_PYTHON) + " " + script + " {input} {output} int64";
  CHECK_THROWS_WITH(make_reward(options)->score(x, at::arange(3, at::kLong), {"a", "b", "c"}),
                    Contains("rewards must be floating-point, got Long"));
  // No shell: its syntax is an argument like any other, so a shell is named explicitly.
  options.command = "sh -c 'exit 3'";
  CHECK_THROWS_WITH(make_reward(options)->score(x, at::arange(3, at::kLong), {"a", "b", "c"}),
                    Contains("exited with status 3"));
  options.command = "no-such-reward-program {input}";
  CHECK_THROWS_WITH(make_reward(options)->score(x, at::arange(3, at::kLong), {"a", "b", "c"}),
                    Contains("cannot run no-such-reward-program: No such file or directory"));
  options.command = "sleep 5";
  options.timeout_s = 0.3;
  CHECK_THROWS_WITH(make_reward(options)->score(x, at::arange(3, at::kLong), {"a", "b", "c"}),
                    Contains("timed out after 0.3 s"));
}

TEST_CASE("reward: command paths with spaces and shell characters reach the program as one argument",
          "[reward][command]") {
  // A run folder with a space, a quote and a `;` in it: pasted into /bin/sh
  // it would split or run `touch`.
  const std::string dir = ditrl::test::fresh_output_dir("reward_cmd_quoting") + "/run dir 'x';touch pwned";
  std::filesystem::create_directories(dir);
  const std::string script = dir + "/score.py";
  std::ofstream(script) << R"(
import sys, h5py, numpy as np
assert len(sys.argv) == 3, sys.argv
with h5py.File(sys.argv[1], "r") as f:
    n = f["latents"].shape[0]
with h5py.File(sys.argv[2], "w") as f:
    f["rewards"] = np.arange(n, dtype=np.float32)
)";
  RewardOptions options;
  options.kind = RewardKind::Command;
  options.work_dir = dir;
  options.command = std::string(DITRL_PYTHON) + " \"" + script + "\" {input} {output}";
  const at::Tensor r = make_reward(options)->score(sample_latents(), at::arange(3, at::kLong), {"a", "b", "c"});
  CHECK(at::equal(r, at::arange(3, at::kFloat)));
  CHECK_FALSE(std::filesystem::exists("pwned"));
}

TEST_CASE("reward: command words split like a shell's - nothing expanded", "[reward][command]") {
  using V = std::vector<std::string>;
  CHECK(split_command("python3 score.py {input} {output}") == V{"python3", "score.py", "{input}", "{output}"});
  CHECK(split_command("  a   'b c'  \"d \\\" e\" f\\ g ") == V{"a", "b c", "d \" e", "f g"});
  CHECK(split_command("echo $HOME *.py | x") == V{"echo", "$HOME", "*.py", "|", "x"});
  CHECK(split_command("''") == V{""});
  CHECK_THROWS_WITH(split_command("a 'b"), Contains("unterminated ' quote"));
  CHECK_THROWS_WITH(split_command("   "), Contains("reward.command is empty"));
}
