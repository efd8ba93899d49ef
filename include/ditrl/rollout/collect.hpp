#pragma once

// The rollout phase of a training iteration: a rank's share of one rollout
// (its contiguous slice of the samples; the prompts a seeded permutation per
// epoch) sampled with the current sharded weights, or read from a trajectory
// file an external engine or `ditrl rollout` wrote; scored by the reward;
// turned into group advantages over the whole rollout (groups may span
// ranks, so every rank gathers every reward).

#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rl/advantages.hpp>
#include <ditrl/rl/step_strategy.hpp>
#include <ditrl/rollout/prompts.hpp>
#include <ditrl/rollout/reward_set.hpp>
#include <ditrl/rollout/sampler.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ditrl::rollout {

// A rank's part of one rollout, scored, with the advantages of its samples.
struct RolloutBatch {
  int64_t rollout_id = 0;
  Trajectories trajectories;
  models::Cond cond;             // [N, ...] conditioning rows of the rank's samples
  models::Cond negative;         // [N, ...] when the run uses CFG
  at::Tensor all_rewards;        // [samples_per_rollout], every rank: the run's reward
  at::Tensor all_reward_values;  // [samples_per_rollout, K], every rank: each [[reward]] entry's (else undefined)
  at::Tensor advantages;         // [N] this rank's samples
  double seconds_sampling = 0;
  double seconds_reward = 0;
};

struct CollectOptions {
  int64_t prompts_per_rollout = 1;  // rollout.batch
  int64_t samples_per_prompt = 1;
  int64_t seed = 0;       // [run] seed: noise and SDE steps
  int64_t data_seed = 0;  // [data] seed: prompt order
  bool keep_gathered = false;
  SamplerOptions sampler;
  rl::StepStrategyOptions strategy;
  rl::AdvantageOptions advantages;
  bool needs_negative = false;  // CFG at some step
};

// What a collector works with; it owns none of it.
struct CollectParts {
  models::Family* family = nullptr;
  shard::ShardedParams* params = nullptr;
  PromptSource* prompts = nullptr;
  RewardSet* rewards = nullptr;
  dist::Communicator* comm = nullptr;        // the ranks holding different samples (dist::SequenceGroups::samples)
  const models::Ulysses* ulysses = nullptr;  // the sequence-parallel group sharing this rank's samples, if any
  MPI_Comm io_comm = MPI_COMM_NULL;          // collective trajectory files
};

class Collector {
 public:
  Collector(const CollectOptions& options, const CollectParts& parts, diffusion::Schedule schedule,
            std::vector<int64_t> latent_shape);

  // Samples rollout `rollout_id` with the current weights.
  RolloutBatch collect(int64_t rollout_id);
  // The sampler's SamplerOptions::before_step from now on.
  void set_before_step(std::function<void(int64_t step)> before_step) {
    options_.sampler.before_step = std::move(before_step);
  }
  // Reads a rollout produced elsewhere: `path` holds every sample, each rank
  // reads its own rows. Rewards come from the file when it has them, else
  // from the reward.
  RolloutBatch load(const std::string& path, int64_t rollout_id);
  // Writes a rollout (all ranks' samples, collectively) as a trajectory file.
  void save(const RolloutBatch& batch, const std::string& path, const std::map<std::string, std::string>& text_attrs,
            const std::map<std::string, double>& number_attrs) const;

  // rollout/reward/* statistics over the whole rollout (the run's reward;
  // rollout/reward/<name>/* each [[reward]] entry's raw values) and rollout/step.
  std::map<std::string, double> metrics(const RolloutBatch& batch) const;

  int64_t samples_per_rollout() const { return options_.prompts_per_rollout * options_.samples_per_prompt; }
  int64_t samples_per_rank() const { return samples_per_rollout() / parts_.comm->size(); }
  const diffusion::Schedule& schedule() const { return schedule_; }

 private:
  void score_and_normalise(RolloutBatch& out);
  std::vector<std::string> texts(const at::Tensor& prompt_index) const;

  CollectOptions options_;
  CollectParts parts_;
  diffusion::Schedule schedule_;
  std::vector<int64_t> latent_shape_;
  bool memory_logged_ = false;
};

}  // namespace ditrl::rollout
