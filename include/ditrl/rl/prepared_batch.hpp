#pragma once

// A micro-batch of training pairs ready for the DiT forward and the loss
// (docs/algorithms.md §3.2, §6.3). It carries both time domains taken from the
// rollout's snapshot at the same index: the trajectory timesteps t (SD3, Wan
// read these) and the sigmas (LTX, Qwen-Image read these, and the kernels).

#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/diffusion/sde_step.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ditrl::rl {

// One trained step of one sample, as the data conversion produces it.
struct TrainPair {
  at::Tensor latent;       // no batch dim. GRPO: x_i. NFT/SFT: the clean x0.
  at::Tensor next_latent;  // GRPO: x_{i+1}; undefined for NFT/SFT
  float timestep = 0;      // the snapshot's t of this step (NFT: from lookup_timesteps)
  float log_prob_old = 0;  // GRPO: the rollout's log-prob of x_i -> x_{i+1}
  float advantage = 0;     // the sample's advantage (unclamped; the losses clamp)
  int64_t sample_index = 0;
  int64_t prompt_index = 0;                             // conditioning: row of the prompt in the cond store
  std::shared_ptr<const diffusion::Schedule> snapshot;  // the schedule the sample was rolled out on
};

struct PreparedBatch {
  at::Tensor latents;       // (B, ...) fp32
  at::Tensor next_latents;  // (B, ...) fp32, or undefined when the pairs have none
  at::Tensor timesteps;     // (B,) fp32 snapshot t
  at::Tensor sigmas;        // (B,) fp32 snapshot sigma at the same index
  at::Tensor sigmas_next;   // (B,) fp32 snapshot sigma at index + 1
  at::Tensor log_prob_old;  // (B,) fp32
  at::Tensor advantages;    // (B,) fp32
  // Host bookkeeping (CPU tensors on every device: reading them is no sync).
  at::Tensor step_indices;                              // (B,) int64 index into the snapshot
  at::Tensor sample_indices;                            // (B,) int64
  at::Tensor prompt_indices;                            // (B,) int64 rows of the cond store
  at::Tensor host_timesteps;                            // (B,) fp32 timesteps, for the forward's per-batch decisions
  at::Tensor host_sigmas;                               // (B,) fp32 sigmas, for per-pair metric buckets
  float step_timestep = 0;                              // timesteps[0], which decides the guidance
  std::shared_ptr<const diffusion::Schedule> snapshot;  // shared by every pair

  int64_t size() const { return timesteps.defined() ? timesteps.size(0) : 0; }
  // The kernel's sigmas for these pairs (sigma == 1 substitutes the snapshot's sigmas[1]).
  diffusion::StepSigmas step_sigmas() const;
};

// Stacks the pairs (latents upcast to fp32), checks every pair carries a
// snapshot bitwise equal to the first pair's, and looks each pair's t up in it.
// The tensors are placed on `device`, except the host bookkeeping.
PreparedBatch prepare_batch(const std::vector<TrainPair>& pairs, c10::Device device);

}  // namespace ditrl::rl
