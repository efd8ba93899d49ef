#pragma once

// The velocity the sampler steps with and the trainer scores: the family's
// noise_pred, with classifier-free guidance when the family supports it and
// the scale at this step is > 1. Rollout and training both call this one
// function, so the two sides run the same batch layout (a joint [pos; neg]
// forward) and the same combine.

#include <ditrl/models/family.hpp>

namespace ditrl::models {

struct GuidedInputs {
  at::Tensor latents;    // (B, ...) fp32
  at::Tensor timesteps;  // (B,) snapshot t
  at::Tensor sigmas;     // (B,) snapshot sigma at the same indices
  const Cond* cond = nullptr;
  const Cond* negative = nullptr;  // required when guidance applies
  // timesteps[0] as a host value: every pair of a batch shares one step
  // (phase-pure micro-batches), so it decides the guidance of the batch
  // without reading the device.
  double step_timestep = 0;
};

// True when this step runs two predictions (pos, neg) and combines them.
bool uses_cfg(const Family& family, const GuidanceOptions& guidance, double timestep);

// The (guided) velocity, in the dtype the family returns. Gradients flow
// through the positive half only (the negative half is detached before the
// combine, as flow_grpo's training does), which leaves the forward values
// unchanged.
at::Tensor guided_velocity(Family& family, const GuidedInputs& inputs, const GuidanceOptions& guidance,
                           const ForwardContext& ctx);

// The family's prediction without CFG (DiffusionNFT, SFT; `negative` is
// not read). A guidance-distilled family still embeds guidance.scale, as
// flow_grpo's FLUX NFT trains at the sampling guidance.
at::Tensor unguided_velocity(Family& family, const GuidedInputs& inputs, const GuidanceOptions& guidance,
                             const ForwardContext& ctx);

}  // namespace ditrl::models
