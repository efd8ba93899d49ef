#pragma once

// The sampling kernel of a rollout's SDE steps (diffusion/sde_step.hpp says
// what each computes), as the deck's rollout.sde names it. Header-only: the
// deck reader (config/) parses the name into it.

#include <ditrl/name_table.hpp>

namespace ditrl::diffusion {

enum class SdeType { Sde, Cps, Ode };

inline constexpr NameTable<SdeType, 3> kSdeNames{{{"sde", SdeType::Sde}, {"cps", SdeType::Cps}, {"ode", SdeType::Ode}}};

}  // namespace ditrl::diffusion
