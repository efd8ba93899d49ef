#pragma once

// What `ditrl train` and `ditrl rollout` build from a deck on every rank, and
// the rollout phase they share. open_run() checks everything a run can get
// wrong up front (batch knobs against the world size, weights file, prompt
// data against the family) before any rank does heavy work.

#include <ditrl/config/deck.hpp>
#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rl/step_strategy.hpp>
#include <ditrl/rollout/prompts.hpp>
#include <ditrl/rollout/reward.hpp>
#include <ditrl/rollout/sampler.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::app {

struct Run {
  config::Config config;
  std::string deck_text;  // the effective deck, stored in checkpoints and metrics
  dist::WorldInfo world;
  std::unique_ptr<dist::Communicator> comm;
  std::shared_ptr<models::Family> family;
  std::unique_ptr<shard::ShardedParams> params;
  std::unique_ptr<rollout::PromptSource> prompts;
  std::unique_ptr<rollout::Reward> reward;
  std::unique_ptr<rl::ParityDump> dump;  // [debug] dump = true: OUT/debug/dump-rank<r>.h5
  diffusion::Schedule schedule;
  std::vector<int64_t> latent_shape;  // one sample's latent (no batch dim)
  rollout::SamplerOptions sampler;
  rl::StepStrategyOptions strategy;
  bool needs_negative = false;  // CFG at some step: the sampler and trainer pass negative prompts

  int64_t samples_per_rollout = 0;  // rollout.batch x rollout.samples_per_prompt
  int64_t samples_per_rank = 0;
  int64_t window_samples = 0;  // samples of one optimizer step on one rank

  models::ForwardContext forward_context() const { return {params.get(), nullptr}; }
};

// `dump_dir`: where [debug] dump files go ("" = OUT/debug, the training run's).
Run open_run(const config::Config& config, const dist::MpiRuntime& mpi, const std::string& dump_dir = "");

// A rank's part of one rollout, scored, with the advantages of its samples
// (normalised over the whole rollout, every rank holding all rewards).
struct RolloutBatch {
  int64_t rollout_id = 0;
  rollout::Trajectories trajectories;
  models::Cond cond;      // [N, ...] conditioning rows of the rank's samples
  models::Cond negative;  // [N, ...] when the run uses CFG
  at::Tensor all_rewards;  // [samples_per_rollout], every rank
  at::Tensor advantages;   // [N] this rank's samples
  double seconds_sampling = 0;
  double seconds_reward = 0;
};

// Samples a rollout with the run's current weights.
RolloutBatch collect_rollout(Run& run, int64_t rollout_id);

// Reads a rollout produced elsewhere (an external engine, or `ditrl rollout`):
// `path` holds every sample; each rank reads its own rows. Rewards come from
// the file when it has them, else from the deck's reward.
RolloutBatch load_rollout(Run& run, const std::string& path, int64_t rollout_id);

// Writes a rollout (all ranks' samples, collectively) as a trajectory file.
void save_rollout(const Run& run, const RolloutBatch& batch, const std::string& path);

}  // namespace ditrl::app
