#pragma once

// What an algorithm's forwards run on: the family under the sharded
// parameters, called exactly as the rollout called it (the same guidance,
// kernel and parity-dump taps), and the rank's view of one scored rollout.

#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rl/ema.hpp>
#include <ditrl/rl/pairs.hpp>
#include <ditrl/rl/parity_dump.hpp>
#include <ditrl/rl/prepared_batch.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ditrl::rl {

// A rank's samples of one scored rollout, as training reads them.
struct TrainingRollout {
  int64_t rollout_id = 0;
  RolloutView view;          // what pair building reads (latents, log-probs, advantages, snapshot)
  at::Tensor prompt_index;   // [N] int64: each sample's prompt in the prompt store
  at::Tensor model_outputs;  // [N, |S|, ...] the velocities the rollout stepped with, or undefined
  models::Cond cond;         // [N, ...] conditioning rows (TrainPair::prompt_index)
  models::Cond negative;     // [N, ...] when the run uses CFG
};

struct Policy {
  models::Family* family = nullptr;
  shard::ShardedParams* params = nullptr;
  diffusion::StepKernel kernel;  // the rollout's SDE kernel
  models::GuidanceOptions guidance;
  bool needs_negative = false;  // CFG at some step: negative prompts are passed
  int64_t microgroup = 1;       // samples per rollout forward
  ParityDump* dump = nullptr;   // [debug] dump
  std::vector<int64_t> latent_shape;
  const models::Ulysses* ulysses = nullptr;  // the sequence-parallel group, as the rollout used it
  // The rank's share of the samples: its sequence-parallel group and the
  // number of groups (the world rank and size at sequence_parallel = 1).
  // Optimizer windows and the canonical micro-batch order run over these.
  int sample_rank = 0;
  int sample_ranks = 1;

  models::ForwardContext context() const { return {params, nullptr, ulysses}; }
  // The velocity of batch `b` at `latents`; guided: with the rollout's CFG.
  at::Tensor velocity(const TrainingRollout& rollout, const PreparedBatch& b, const at::Tensor& latents, bool guided,
                      const models::ForwardContext& ctx) const;
  at::Tensor velocity(const TrainingRollout& rollout, const PreparedBatch& b, const at::Tensor& latents,
                      bool guided) const {
    return velocity(rollout, b, latents, guided, context());
  }
  // The parity-dump tap of a forward repeating the rollout's on `b`
  // (nullptr when nothing is dumped).
  std::unique_ptr<models::Tap> train_tap(int64_t rollout_id, const PreparedBatch& b) const;
};

// A second set of values for the trainable slices (the KL reference or the
// NFT EMA policy) that forwards run on for the scope's life: swapped into the
// masters and the compute slices re-cast, then swapped back.
class ShadowScope {
 public:
  ShadowScope(EmaShadow& shadow, shard::ShardedParams& params);
  ~ShadowScope();
  ShadowScope(const ShadowScope&) = delete;
  ShadowScope& operator=(const ShadowScope&) = delete;

 private:
  EmaShadow& shadow_;
  shard::ShardedParams& params_;
};

// The masters of the rank's trainable pieces (what a shadow mirrors).
std::vector<at::Tensor> trainable_masters(shard::ShardedParams& params);

}  // namespace ditrl::rl
