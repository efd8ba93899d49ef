#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>

namespace ditrl::diffusion {

namespace {

// The FlowMatchEuler options a family's pipeline uses (not for "ltx", whose
// sampler is ltx_core's LTX2Scheduler: see ltx2_schedule).
// Presets (docs/algorithms.md §1.2 and the public pipelines; choices marked where
// the spec is silent):
// - sd3: SD3.5-medium, FlowMatchEuler static shift 3.0, the scheduler's own
//   float64 grid (the pipeline passes no sigmas).
// - wan: the spec does not pin Wan2.2's RL sampler. The reference Wan2.2
//   sampler is flow-UniPC with int64 timesteps, which has no SDE log-prob; the
//   SDE kernels need a FlowMatchEuler grid, so wan samples on FlowMatchEuler
//   with Wan2.2-T2V-A14B's sample_shift 12.0 (wan/configs/wan_t2v_A14B.py)
//   applied as a static shift. Override with [rollout] shift.
// - qwen_image: the pipeline passes sigmas = linspace(1, 1/n, n) (float64 ->
//   fp32), dynamic exponential shift with mu from the packed image sequence
//   length (H/2 * W/2 latent tokens; base 256 / max 8192 tokens, shift 0.5 /
//   0.9) and shift_terminal 0.02 (scheduler config of §1.2, [I] in the spec).
// - ltx: ltx_core's LTX2Scheduler (the sampler whose sigmas LTX's DiT consumes,
//   §1.3(c)) with its defaults: max_shift 2.05, base_shift 0.95, stretch to
//   terminal 0.1, tokens = F*H*W latent voxels.
FlowMatchOptions family_flow_match_options(const std::string& family, const SchedulePresetOptions& p) {
  FlowMatchOptions o;
  o.steps = p.steps;
  if (p.shift) {
    o.shift = *p.shift;
    return o;
  }
  if (family == "sd3") {
    o.shift = 3.0;
  } else if (family == "wan") {
    o.shift = 12.0;
  } else if (family == "qwen_image") {
    if (p.height % 2 != 0 || p.width % 2 != 0)
      fail("qwen_image schedule: the latent grid {}x{} must be even (2x2 packing)", p.height, p.width);
    const int64_t seq_len = (p.height / 2) * (p.width / 2);
    o.dynamic = DynamicShift{resolution_mu(seq_len, ResolutionShift{256, 8192, 0.5, 0.9}), TimeShiftType::Exponential};
    o.shift_terminal = 0.02;
    o.sigmas = numpy_linspace(1.0, 1.0 / static_cast<double>(p.steps), p.steps);
  } else {
    fail("no FlowMatchEuler schedule preset for family '{}': expected sd3, wan or qwen_image", family);
  }
  return o;
}

}  // namespace

Schedule family_schedule(const std::string& family, const SchedulePresetOptions& p) {
  if (p.steps < 1) fail("{} schedule: steps must be >= 1, got {}", family, p.steps);
  if (family == "ltx" && !p.shift) {
    Ltx2Options o;
    o.steps = p.steps;
    o.tokens = p.frames * p.height * p.width;
    return ltx2_schedule(o);
  }
  if (family != "sd3" && family != "wan" && family != "qwen_image" && family != "ltx")
    fail("unknown family '{}' for the sigma schedule: expected sd3, wan, ltx or qwen_image", family);
  return flow_match_schedule(family_flow_match_options(family, p));
}

}  // namespace ditrl::diffusion
