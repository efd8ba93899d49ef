#include <ditrl/error.hpp>
#include <ditrl/io/h5.hpp>
#include <ditrl/rollout/http_reward.hpp>
#include <ditrl/rollout/reward.hpp>

#include <ATen/ATen.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/script.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace ditrl::rollout {

// Every kind's output goes through the same checks before it can become an
// advantage: one finite float per sample.
at::Tensor checked_rewards(const at::Tensor& rewards, int64_t samples, const std::string& source) {
  if (!rewards.defined() || rewards.dim() != 1 || rewards.size(0) != samples)
    fail("reward {}: expected a [{}] tensor, got {}", source, samples,
         rewards.defined() ? fmt::format("shape [{}]", fmt::join(rewards.sizes(), ", ")) : "nothing");
  // An integer score is almost always a bug upstream (a class id, a count):
  // casting it silently would train on it.
  if (!at::isFloatingType(rewards.scalar_type()))
    fail("reward {}: rewards must be floating-point, got {}", source, c10::toString(rewards.scalar_type()));
  const at::Tensor values = rewards.to(at::kFloat).cpu().contiguous();
  if (!at::isfinite(values).all().item<bool>())
    fail("reward {}: non-finite reward values {}", source,
         fmt::join(std::vector<float>(values.data_ptr<float>(), values.data_ptr<float>() + samples), ", "));
  return values;
}

std::future<at::Tensor> Reward::start(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                                      const std::vector<std::string>& texts) {
  std::promise<at::Tensor> scored;
  scored.set_value(score(final_latents, prompt_index, texts));
  return scored.get_future();
}

namespace {

// Analytic rewards are functions of a single sample's latent, so they do not
// depend on how samples are split across ranks or micro-groups.
class AnalyticReward final : public Reward {
 public:
  AnalyticReward(AnalyticFunction function, int64_t seed) : function_(function), seed_(seed) {}
  std::string name() const override { return "analytic/" + std::string(name_of(kAnalyticNames, function_)); }

  at::Tensor score(const at::Tensor& final_latents, const at::Tensor&, const std::vector<std::string>&) override {
    const at::Tensor x = final_latents.to(at::kFloat).flatten(1);
    at::Tensor r;
    switch (function_) {
      case AnalyticFunction::TargetPattern:
        // -mean squared distance to a fixed seeded pattern of the latent's shape
        // (drawn on the host, where the latents may not be).
        r = -(x - target(x.size(1)).to(x.device())).pow(2).mean(1);
        break;
      case AnalyticFunction::Brightness:
        r = x.mean(1);
        break;
      case AnalyticFunction::Smoothness:
        r = -(final_latents.to(at::kFloat).diff(1, -1)).pow(2).flatten(1).mean(1);
        break;
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

  AnalyticFunction function_;
  int64_t seed_;
  at::Tensor target_;
};

class TorchScriptReward final : public Reward {
 public:
  TorchScriptReward(const std::string& path, c10::Device device) : path_(path), device_(device) {
    if (!std::filesystem::exists(path)) fail("reward module {}: no such file", path);
    try {
      module_ = torch::jit::load(path, device);
    } catch (const c10::Error& e) {
      fail("reward module {}: torch::jit::load onto {} failed: {}", path, device.str(), e.what_without_backtrace());
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
    std::vector<torch::jit::IValue> inputs{final_latents.to(device_, at::kFloat)};
    if (arguments_ == 2) inputs.emplace_back(prompt_index.to(device_, at::kLong));
    torch::jit::IValue out;
    try {
      out = module_.forward(inputs);
    } catch (const std::exception& e) {
      // A traced module bakes the tensors it created while tracing into its
      // graph on the tracing device; it cannot follow the run to another one.
      fail("reward module {}: forward on {} failed{}: {}", path_, device_.str(),
           device_.is_cpu() ? ""
                            : " (a traced module may hold constants of the device it was traced on: script it, or "
                              "create its tensors on the input's device)",
           e.what());
    }
    if (!out.isTensor()) fail("reward module {}: forward must return a tensor", path_);
    return checked_rewards(out.toTensor(), final_latents.size(0), name());
  }

 private:
  std::string path_;
  c10::Device device_;
  torch::jit::Module module_;
  int arguments_ = 1;
};

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::string shown(const std::vector<std::string>& argv) {
  std::string text;
  for (const std::string& word : argv) text += (text.empty() ? "" : " ") + word;
  return text;
}

// Runs argv (no shell), killing its process group after `timeout_s`.
// exec's own failure comes back through a close-on-exec pipe.
int run_with_timeout(const std::vector<std::string>& argv, double timeout_s) {
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) fail("reward command: pipe failed: {}", std::strerror(errno));
  std::vector<char*> args;
  for (const std::string& word : argv) args.push_back(const_cast<char*>(word.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) fail("reward command: fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    close(report[0]);
    setpgid(0, 0);
    execvp(args[0], args.data());
    const int error = errno;
    (void)!write(report[1], &error, sizeof(error));
    _exit(127);
  }
  close(report[1]);
  int exec_error = 0;
  const bool exec_failed = read(report[0], &exec_error, sizeof(exec_error)) == sizeof(exec_error);
  close(report[0]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      fail("reward command timed out after {} s: {}", timeout_s, shown(argv));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (exec_failed) fail("reward command: cannot run {}: {} (errno {})", argv[0], std::strerror(exec_error), exec_error);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

class CommandReward final : public Reward {
 public:
  CommandReward(std::string command, double timeout_s, std::string work_dir)
      : command_(std::move(command)),
        words_(split_command(command_)),
        timeout_s_(timeout_s),
        work_dir_(std::move(work_dir)) {}
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
    // Each word gets the paths substituted after splitting: a path with a
    // space or a quote stays one argument, and nothing reaches a shell.
    std::vector<std::string> argv;
    for (const std::string& word : words_)
      argv.push_back(replace_all(replace_all(word, "{input}", input), "{output}", output));
    const int code = run_with_timeout(argv, timeout_s_);
    const std::string command = shown(argv);
    if (code != 0) fail("reward command exited with status {}: {}", code, command);
    if (!std::filesystem::exists(output)) fail("reward command wrote no {}: {}", output, command);
    at::Tensor rewards = io::h5::File::open(output).open_dataset("rewards").read();
    std::filesystem::remove(input);
    std::filesystem::remove(output);
    return checked_rewards(rewards, final_latents.size(0), name());
  }

 private:
  std::string command_;
  std::vector<std::string> words_;
  double timeout_s_;
  std::string work_dir_;
  int64_t calls_ = 0;
};

}  // namespace

std::vector<std::string> split_command(const std::string& command) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < command.size(); ++i) {
    const char c = command[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        word += c;
    } else if (quote == '"') {
      if (c == '"')
        quote = 0;
      else if (c == '\\' && i + 1 < command.size() && (command[i + 1] == '"' || command[i + 1] == '\\'))
        word += command[++i];
      else
        word += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == '\\' && i + 1 < command.size()) {
      word += command[++i];
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote) fail("reward.command: unterminated {} quote in \"{}\"", quote, command);
  if (in_word) words.push_back(word);
  if (words.empty()) fail("reward.command is empty: it needs a program to run");
  return words;
}

std::unique_ptr<Reward> make_reward(const RewardOptions& options) {
  switch (options.kind) {
    case RewardKind::Analytic:
      return std::make_unique<AnalyticReward>(options.analytic, options.target_seed);
    case RewardKind::TorchScript:
      return std::make_unique<TorchScriptReward>(options.module, options.device);
    case RewardKind::Command:
      return std::make_unique<CommandReward>(options.command, options.timeout_s, options.work_dir);
    case RewardKind::Http:
      return make_http_reward(options);
  }
  fail("reward {}: no reward kind {}", options.name, static_cast<int>(options.kind));
}

}  // namespace ditrl::rollout
