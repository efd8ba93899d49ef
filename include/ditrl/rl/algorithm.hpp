#pragma once

// One training objective (grpo, nft, sft) as the training step drives it
// (src/app/train.cpp):
//
//   data = algorithm.prepare(rollout);   pairs -> optimizer windows, no-grad reference pass
//   per micro-batch i of a window:
//     loss_sum = algorithm.micro_batch_loss(rollout, data, batch, i, metrics);
//   algorithm.end_rollout();             once per rollout (NFT: the EMA old policy)
//
// Each algorithm owns its metric schema, how it selects pairs, its reference
// forwards, its loss and metrics, and the per-parameter state a checkpoint
// keeps beside the moments. make_algorithm / algorithm_traits
// (rl/algorithm_traits.hpp) are the only places that look at the loss.

#include <ditrl/rl/algorithm_traits.hpp>
#include <ditrl/rl/loss_window.hpp>
#include <ditrl/rl/metric_buffer.hpp>
#include <ditrl/rl/policy.hpp>
#include <ditrl/rl/prepared_batch.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::rl {

// Per set, one tensor per trainable piece of the rank
// (shard::ShardedParams::pieces() order, frozen pieces left out).
using ExtraState = std::map<std::string, std::vector<at::Tensor>>;

// What one rollout trains on, on one rank.
struct TrainData {
  std::vector<TrainPair> pairs;
  std::vector<OptimizerWindow> windows;
  std::vector<at::Tensor> reference;  // per micro-batch (global index): the reference pass's output
  int64_t pairs_per_sample = 1;

  std::vector<TrainPair> slice(const MicroBatch& mb) const;
  // Every micro-batch of every window, in order.
  std::vector<MicroBatch> micro_batches() const;
};

struct AlgorithmOptions {
  Loss loss = Loss::Grpo;
  int64_t seed = 0;  // [run] seed: keys the pair selection and the pair noise
  int64_t steps_per_rollout = 1;
  int64_t micro_batch = 1;
  bool lora = false;  // the KL reference is the LoRA base instead of a copy of the weights
  double clip_range = 1e-4;
  double adv_clip_max = 5.0;
  double kl_beta = 0.0;
  double timestep_fraction = 0.99;  // NFT
  double nft_beta = 1.0;
  bool nft_adaptive = true;
  bool nft_shuffle_timesteps = true;
  std::string sft_latents;  // SFT targets file; empty = seeded synthetic targets
  int64_t data_seed = 0;    // [data] seed: keys the synthetic SFT targets
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;

  virtual const MetricSchema& metric_schema() const = 0;
  virtual TrainData prepare(const TrainingRollout& rollout) = 0;
  // The summed loss of the micro-batch's pairs (the step backpropagates it
  // divided by the window's pair count); records the micro-batch's metrics.
  virtual at::Tensor micro_batch_loss(const TrainingRollout& rollout, const TrainData& data, const PreparedBatch& b,
                                      size_t micro_batch_index, MetricBuffer& metrics) = 0;
  virtual void end_rollout() {}
  virtual ExtraState extra_state() { return {}; }
  // After a checkpoint of `rollouts_done` rollouts was loaded.
  virtual void resumed(int64_t /*rollouts_done*/) {}
};

// The training pairs one sample yields for a loss whose micro-batches are
// chunks of samples (!microgroup_batches): DiffusionNFT's trained sigmas of
// a `steps`-step rollout, SFT's one. GRPO's are the rollout's SDE steps.
int64_t chunk_pairs_per_sample(Loss loss, int64_t steps, double timestep_fraction);
std::unique_ptr<Algorithm> make_algorithm(const AlgorithmOptions& options, const Policy& policy);

}  // namespace ditrl::rl
