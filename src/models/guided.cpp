#include <ditrl/error.hpp>
#include <ditrl/models/guided.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

bool uses_cfg(const Family& family, const GuidanceOptions& guidance, double timestep) {
  return family.supports_cfg() && family.guidance_scale(guidance, timestep) > 1.0;
}

at::Tensor guided_velocity(Family& family, const GuidedInputs& in, const GuidanceOptions& guidance,
                           const ForwardContext& ctx) {
  const double t = in.step_timestep;
  if (!uses_cfg(family, guidance, t)) return family.noise_pred(in.latents, in.timesteps, in.sigmas, *in.cond, ctx);
  if (!in.negative)
    fail("{}: guidance scale {} > 1 needs negative-prompt conditioning", family.family_name(),
         family.guidance_scale(guidance, t));
  ForwardContext joint_ctx = ctx;
  if (ctx.host_timesteps.defined()) joint_ctx.host_timesteps = at::cat({ctx.host_timesteps, ctx.host_timesteps}, 0);
  const at::Tensor v =
      family.noise_pred(at::cat({in.latents, in.latents}, 0), at::cat({in.timesteps, in.timesteps}, 0),
                        at::cat({in.sigmas, in.sigmas}, 0), Cond::cat(*in.cond, *in.negative), joint_ctx);
  const int64_t b = in.latents.size(0);
  return family.cfg_combine(v.narrow(0, 0, b), v.narrow(0, b, b).detach(), guidance, t);
}

}  // namespace ditrl::models
