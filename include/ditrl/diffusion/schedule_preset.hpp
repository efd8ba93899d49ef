#pragma once

// The sigma schedule each family's rollout samples on, from the deck's
// [rollout] steps/shift and latent grid. Where the spec does not pin a family's
// sampler the choice is documented in schedule_preset.cpp.

#include <ditrl/diffusion/schedule.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace ditrl::diffusion {

struct SchedulePresetOptions {
  int64_t steps = 10;
  // Static shift: when set, every family samples on the plain static-shift
  // FlowMatchEuler grid with this shift (no dynamic shift, no terminal stretch).
  std::optional<double> shift;
  // Latent grid in VAE latent units (for the resolution-dependent shifts).
  int64_t frames = 1;
  int64_t height = 16;
  int64_t width = 16;
};

// family: "sd3" | "wan" | "ltx" | "qwen_image"; unknown names are an error listing these.
Schedule family_schedule(const std::string& family, const SchedulePresetOptions& options);

}  // namespace ditrl::diffusion
