#pragma once

// Rewards score the final latents of a rollout, one value per sample. Four
// kinds, chosen in the deck's [reward] table or each [[reward]] entry:
//  - analytic: closed-form scores for demos and tests (no model needed);
//  - torchscript: a module loaded with torch::jit::load whose forward takes
//    the final latents [N, ...] (and, if it has a second argument, the prompt
//    indices [N] int64) and returns [N] rewards (e.g. a PickScore+VAE export),
//    loaded onto the run's device and fed there;
//  - command: an external program that reads an HDF5 of final latents and
//    prompts and writes an HDF5 with /rewards [N];
//  - http: a reward server (rollout/http_reward.hpp, docs/rewards.md).

#include <ditrl/rollout/reward_kind.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::rollout {

struct RewardOptions {
  std::string name = "reward";  // the [[reward]] entry's name (metrics, messages)
  RewardKind kind = RewardKind::Analytic;
  double weight = 1.0;  // in the run's reward, the weighted sum of several
  AnalyticFunction analytic = AnalyticFunction::TargetPattern;
  std::string module;   // TorchScript file
  std::string command;  // program and arguments (no shell); {input}/{output}: file paths
  int64_t target_seed = 1234;
  double timeout_s = 600;          // a command's limit; an http request's deadline
  std::string work_dir = ".";      // where command rewards exchange their files
  c10::Device device = c10::kCPU;  // where a TorchScript module (or http decoder) is loaded and runs
  // kind = http
  std::string url;
  RewardInput input = RewardInput::Latents;
  std::string decoder;     // TorchScript latents -> uint8 RGB, for input = images
  int64_t batch_size = 0;  // samples per request; 0 = all of a call's
  int64_t retries = 3;
  double backoff_s = 1.0;
  std::string family;  // the model family, which names the latents' layout to a server
};

class Reward {
 public:
  virtual ~Reward() = default;
  virtual std::string name() const = 0;
  // final_latents [N, ...] fp32; prompt_index [N] int64; texts[i] is sample i's prompt.
  virtual at::Tensor score(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                           const std::vector<std::string>& texts) = 0;
  // A reward that waits on something outside the process (a server) starts
  // scoring here and returns at once, so the next micro-group samples while
  // it waits; the others score when asked. Default: score now.
  virtual bool asynchronous() const { return false; }
  // The rollout the next calls score (a reward server is told it).
  virtual void begin_rollout(int64_t /*rollout_id*/) {}
  virtual std::future<at::Tensor> start(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                                        const std::vector<std::string>& texts);
};

std::unique_ptr<Reward> make_reward(const RewardOptions& options);

// One finite float per sample, as a contiguous fp32 CPU tensor [samples]:
// what every kind's output must be before it can become an advantage.
at::Tensor checked_rewards(const at::Tensor& rewards, int64_t samples, const std::string& source);

// A command reward's words, split as a shell would split them (blanks
// separate; '...' is literal; "..." and \ escape) but with nothing expanded:
// no variables, globs, pipes or redirections, since no shell runs it.
std::vector<std::string> split_command(const std::string& command);

}  // namespace ditrl::rollout
