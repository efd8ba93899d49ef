#pragma once

// What a family's sigma schedule is drawn from: the deck's [rollout]
// steps/shift and latent grid. Each family's preset is in its folder
// (models/<family>/<family>_traits.cpp, where the choices the spec leaves open
// are documented); models::family_schedule picks it by name.

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
  // The model as the deck names it (model.preset, or model.config's path when
  // set), for a family whose released models sample differently: FLUX.1-schnell's
  // pipeline has no dynamic shift.
  std::string preset = "tiny";
  std::string config_json;
};

}  // namespace ditrl::diffusion
