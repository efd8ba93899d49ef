#pragma once

// Rewards score the final latents of a rollout, one value per sample. Three
// kinds, chosen in the deck's [reward] section:
//  - analytic: closed-form scores for demos and tests (no model needed);
//  - torchscript: a module loaded with torch::jit::load whose forward takes
//    the final latents [N, ...] (and, if it has a second argument, the prompt
//    indices [N] int64) and returns [N] rewards (e.g. a PickScore+VAE export),
//    loaded onto the run's device and fed there;
//  - command: an external program that reads an HDF5 of final latents and
//    prompts and writes an HDF5 with /rewards [N].

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::rollout {

struct RewardOptions {
  std::string kind = "analytic";            // analytic | torchscript | command
  std::string analytic = "target_pattern";  // target_pattern | brightness | smoothness
  std::string module;                       // TorchScript file
  std::string command;                      // program and arguments (no shell); {input}/{output}: file paths
  int64_t target_seed = 1234;
  double timeout_s = 600;
  std::string work_dir = ".";      // where command rewards exchange their files
  c10::Device device = c10::kCPU;  // where a TorchScript module is loaded and runs (the run's device)
};

class Reward {
 public:
  virtual ~Reward() = default;
  virtual std::string name() const = 0;
  // final_latents [N, ...] fp32; prompt_index [N] int64; texts[i] is sample i's prompt.
  virtual at::Tensor score(const at::Tensor& final_latents, const at::Tensor& prompt_index,
                           const std::vector<std::string>& texts) = 0;
};

std::unique_ptr<Reward> make_reward(const RewardOptions& options);

// A command reward's words, split as a shell would split them (blanks
// separate; '...' is literal; "..." and \ escape) but with nothing expanded:
// no variables, globs, pipes or redirections, since no shell runs it.
std::vector<std::string> split_command(const std::string& command);

}  // namespace ditrl::rollout
