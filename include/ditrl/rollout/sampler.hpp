#pragma once

// The rollout sampler: denoises a rank's samples with the same family code,
// parameters and kernels the trainer uses, and records what training needs.
// Each sample owns a CPU generator keyed by its seed: it draws the initial
// noise, then one eps per SDE step, in step order, so a sample's trajectory
// does not depend on which rank or micro-group it runs in. Samples run in
// micro-groups of `microgroup` (the trainer's micro-batch), so the training
// forward of a step sees the very batch the rollout forward saw.

#include <ditrl/diffusion/schedule.hpp>
#include <ditrl/diffusion/sde_step.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/rl/parity_dump.hpp>
#include <ditrl/rl/step_strategy.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace ditrl::rollout {

struct SamplerOptions {
  diffusion::StepKernel kernel;  // used on the SDE steps; every other step is ODE
  models::GuidanceOptions guidance;
  int64_t microgroup = 1;
  rl::ParityDump* dump = nullptr;  // [debug] dump: records the chosen samples' forwards
  c10::Device device = c10::kCPU;  // where latents live (the runtime's); noise is drawn on the CPU and copied
  // Called before each denoising step with the step's index, on every rank in
  // the same order; it may throw to abandon the rollout (`train` does on an
  // agreed stop signal). Empty: never called.
  std::function<void(int64_t step)> before_step;
  // Called with each micro-group's first sample and final latents [m, ...]
  // as soon as they are sampled (the rollout starts a reward server's
  // requests there). Empty: never called.
  std::function<void(int64_t first, const at::Tensor& final_latents)> after_microgroup;
};

// A rank's samples of one rollout.
struct Trajectories {
  std::shared_ptr<const diffusion::Schedule> snapshot;  // t and sigma exactly as the DiT consumed them
  rl::StepSelection steps;                              // SDE steps and kept latents, shared by all samples
  at::Tensor latents;        // [N, K, ...] fp32: x_i for i in steps.return_latents (x_0 = initial noise)
  at::Tensor log_probs;      // [N, |S|] fp32: log-prob of x_i -> x_{i+1} for i in steps.sde_steps
  at::Tensor model_outputs;  // [N, |S|, ...] fp32: the (guided) velocity the kernel stepped with
  at::Tensor final_latents;  // [N, ...] fp32: x_T
  at::Tensor prompt_index;   // [N] int64
  at::Tensor sample_index;   // [N] int64: global sample id of the rollout
  at::Tensor rewards;        // [N] fp32, after scoring: the run's reward (several: their weighted sum)
  at::Tensor reward_values;  // [N, K] fp32: each [[reward]] entry's raw value (undefined for a single reward)

  int64_t size() const { return prompt_index.defined() ? prompt_index.size(0) : 0; }
  // Position of latent x_step in `latents` (error if the rollout did not keep it).
  int64_t latent_slot(int64_t step) const;
  // Position of SDE step `step` in log_probs / model_outputs.
  int64_t sde_slot(int64_t step) const;
};

struct SampleBatch {
  models::Cond cond;                  // [N, ...] the samples' prompt conditioning
  const models::Cond* negative;       // [N, ...] negative prompt, or nullptr without CFG
  std::vector<uint64_t> seeds;        // per sample noise seed
  at::Tensor prompt_index;            // [N]
  at::Tensor sample_index;            // [N]
  std::vector<int64_t> latent_shape;  // one sample's latent shape (no batch dim)
  int64_t rollout_id = 0;             // names parity dumps
};

Trajectories sample(models::Family& family, const models::ForwardContext& ctx, const diffusion::Schedule& schedule,
                    const rl::StepSelection& steps, const SampleBatch& batch, const SamplerOptions& options);

}  // namespace ditrl::rollout
