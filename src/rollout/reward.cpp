#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/rollout/reward.hpp>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

namespace ditrl::rollout {

namespace {

// Every kind's output goes through the same checks before it can become an
// advantage: one finite float per sample.
at::Tensor checked_rewards(const at::Tensor& rewards, int64_t samples, const std::string& source) {
  if (!rewards.defined() || rewards.dim() != 1 || rewards.size(0) != samples)
    fail("reward {}: expected a [{}] tensor, got {}", source, samples,
         rewards.defined() ? fmt::format("shape [{}]", fmt::join(rewards.sizes(), ", ")) : "nothing");
  const at::Tensor values = rewards.to(at::kFloat).cpu().contiguous();
  if (!at::isfinite(values).all().item<bool>())
    fail("reward {}: non-finite reward values {}", source,
         fmt::join(std::vector<float>(values.data_ptr<float>(), values.data_ptr<float>() + samples), ", "));
  return values;
}

// Analytic rewards are functions of a single sample's latent, so they do not
// depend on how samples are split across ranks or micro-groups.
class AnalyticReward final : public Reward {
 public:
  AnalyticReward(std::string kind, int64_t seed) : kind_(std::move(kind)), seed_(seed) {}
  std::string name() const override { return "analytic/" + kind_; }

  at::Tensor score(const at::Tensor& final_latents, const at::Tensor&, const std::vector<std::string>&) override {
    const at::Tensor x = final_latents.to(at::kFloat).flatten(1);
    at::Tensor r;
    if (kind_ == "target_pattern") {
      // -mean squared distance to a fixed seeded pattern of the latent's shape.
      r = -(x - target(x.size(1))).pow(2).mean(1);
    } else if (kind_ == "brightness") {
      r = x.mean(1);
    } else if (kind_ == "smoothness") {
      r = -(final_latents.to(at::kFloat).diff(1, -1)).pow(2).flatten(1).mean(1);
    } else {
      fail("unknown analytic reward '{}': expected target_pattern, brightness or smoothness", kind_);
    }
    return checked_rewards(r, final_latents.size(0), name());
  }

 private:
  at::Tensor target(int64_t numel) {
    if (!target_.defined() || target_.numel() != numel) {
      at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed_));
      target_ = at::randn({numel}, gen, at::TensorOptions().dtype(at::kFloat)).mul_(0.5);
    }
    return target_;
  }

  std::string kind_;
  int64_t seed_;
  at::Tensor target_;
};

class TorchScriptReward final : public Reward {
 public:
  explicit TorchScriptReward(const std::string& path) : path_(path) {
    if (!std::filesystem::exists(path)) fail("reward module {}: no such file", path);
    try {
      module_ = torch::jit::load(path, at::kCPU);
    } catch (const c10::Error& e) {
      fail("reward module {}: torch::jit::load failed: {}", path, e.what_without_backtrace());
    }
    module_.eval();
    const auto& schema = module_.get_method("forward").function().getSchema();
    arguments_ = static_cast<int>(schema.arguments().size()) - 1;  // without self
    if (arguments_ < 1 || arguments_ > 2)
      fail("reward module {}: forward must take (latents) or (latents, prompt_index), it takes {} arguments", path,
           arguments_);
  }
  std::string name() const override { return "torchscript:" + path_; }

  at::Tensor score(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                   const std::vector<std::string>&) override {
    torch::NoGradGuard no_grad;
    std::vector<torch::jit::IValue> inputs{final_latents.to(at::kFloat)};
    if (arguments_ == 2) inputs.emplace_back(prompt_index.to(at::kLong));
    torch::jit::IValue out;
    try {
      out = module_.forward(inputs);
    } catch (const std::exception& e) {
      fail("reward module {}: forward failed: {}", path_, e.what());
    }
    if (!out.isTensor()) fail("reward module {}: forward must return a tensor", path_);
    return checked_rewards(out.toTensor(), final_latents.size(0), name());
  }

 private:
  std::string path_;
  torch::jit::Module module_;
  int arguments_ = 1;
};

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// Runs `command` through /bin/sh, killing it after `timeout_s`.
int run_with_timeout(const std::string& command, double timeout_s) {
  const pid_t pid = fork();
  if (pid < 0) fail("reward command: fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      fail("reward command timed out after {} s: {}", timeout_s, command);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class CommandReward final : public Reward {
 public:
  CommandReward(std::string command, double timeout_s, std::string work_dir)
      : command_(std::move(command)), timeout_s_(timeout_s), work_dir_(std::move(work_dir)) {}
  std::string name() const override { return "command:" + command_; }

  at::Tensor score(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                   const std::vector<std::string>& texts) override {
    std::filesystem::create_directories(work_dir_);
    const std::string stem = fmt::format("{}/reward-{}-{}", work_dir_, getpid(), calls_++);
    const std::string input = stem + "-in.h5", output = stem + "-out.h5";
    {
      io::h5::File file = io::h5::File::create(input);
      const at::Tensor latents = final_latents.to(at::kFloat).contiguous();
      std::vector<hsize_t> dims(latents.sizes().begin(), latents.sizes().end());
      file.create_dataset("latents", at::kFloat, dims).write(latents);
      file.create_dataset("prompt_index", at::kLong, {static_cast<hsize_t>(prompt_index.numel())})
          .write(prompt_index.to(at::kLong));
      file.write_strings("prompts", texts);
    }
    std::filesystem::remove(output);
    const std::string command = replace_all(replace_all(command_, "{input}", input), "{output}", output);
    const int code = run_with_timeout(command, timeout_s_);
    if (code != 0) fail("reward command exited with status {}: {}", code, command);
    if (!std::filesystem::exists(output)) fail("reward command wrote no {}: {}", output, command);
    at::Tensor rewards = io::h5::File::open(output).open_dataset("rewards").read();
    std::filesystem::remove(input);
    std::filesystem::remove(output);
    return checked_rewards(rewards, final_latents.size(0), name());
  }

 private:
  std::string command_;
  double timeout_s_;
  std::string work_dir_;
  int64_t calls_ = 0;
};

}  // namespace

std::unique_ptr<Reward> make_reward(const RewardOptions& options) {
  if (options.kind == "analytic") return std::make_unique<AnalyticReward>(options.analytic, options.target_seed);
  if (options.kind == "torchscript") return std::make_unique<TorchScriptReward>(options.module);
  if (options.kind == "command")
    return std::make_unique<CommandReward>(options.command, options.timeout_s, options.work_dir);
  fail("unknown reward kind '{}': expected analytic, torchscript or command", options.kind);
}

}  // namespace ditrl::rollout
