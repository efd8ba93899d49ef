#include <ditrl/error.hpp>
#include <ditrl/models/guided.hpp>

#include <ATen/ATen.h>

namespace ditrl::models {

bool uses_cfg(const Family& family, const GuidanceOptions& guidance, double timestep) {
  return family.supports_cfg() && family.guidance_scale(guidance, timestep) > 1.0;
}

namespace {

// `cond` plus the distilled guidance scale as the (B,) fp32 input `guidance`
// the reference pipeline passes (torch.full([1], scale).expand(B)).
Cond with_guidance_scale(const Cond& cond, double scale, const at::Tensor& latents) {
  Cond out = cond;
  out.tensors["guidance"] = at::full({latents.size(0)}, scale, latents.options().dtype(at::kFloat));
  return out;
}

at::Tensor guided_prediction(Family& family, const GuidedInputs& in, const GuidanceOptions& guidance,
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

}  // namespace

at::Tensor unguided_velocity(Family& family, const GuidedInputs& in, const GuidanceOptions& guidance,
                             const ForwardContext& ctx) {
  if (!family.embeds_guidance()) return family.noise_pred(in.latents, in.timesteps, in.sigmas, *in.cond, ctx);
  return family.noise_pred(in.latents, in.timesteps, in.sigmas,
                           with_guidance_scale(*in.cond, guidance.scale, in.latents), ctx);
}

at::Tensor guided_velocity(Family& family, const GuidedInputs& in, const GuidanceOptions& guidance,
                           const ForwardContext& ctx) {
  if (!family.embeds_guidance()) return guided_prediction(family, in, guidance, ctx);
  const Cond cond = with_guidance_scale(*in.cond, guidance.scale, in.latents);
  const Cond negative = in.negative ? with_guidance_scale(*in.negative, guidance.scale, in.latents) : Cond{};
  GuidedInputs scaled = in;
  scaled.cond = &cond;
  scaled.negative = in.negative ? &negative : nullptr;
  return guided_prediction(family, scaled, guidance, ctx);
}

}  // namespace ditrl::models
