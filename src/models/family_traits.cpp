#include <ditrl/diffusion/schedule_preset.hpp>
#include <ditrl/error.hpp>
#include <ditrl/models/family_traits.hpp>
#include <ditrl/models/flux/flux.hpp>
#include <ditrl/models/flux2/flux2.hpp>
#include <ditrl/models/ltx/ltx.hpp>
#include <ditrl/models/qwen_image/qwen_image.hpp>
#include <ditrl/models/sd3/sd3.hpp>
#include <ditrl/models/wan/wan.hpp>

#include <fmt/format.h>

#include <algorithm>

namespace ditrl::models {

const std::vector<const FamilyTraits*>& family_registry() {
  static const std::vector<const FamilyTraits*> families = {&kSd3Traits, &kWanTraits, &kLtxTraits, &kQwenImageTraits,
                                                            &kFluxTraits, &kFlux2Traits};
  return families;
}

const FamilyTraits* find_family_traits(const std::string& name) {
  for (const FamilyTraits* f : family_registry())
    if (name == f->name) return f;
  return nullptr;
}

const FamilyTraits& traits_of(const Family& family) {
  const FamilyTraits* traits = find_family_traits(family.family_name());
  if (!traits) fail("model family '{}' is not in the registry (models/family_traits.cpp)", family.family_name());
  return *traits;
}

std::vector<std::string> deck_family_names() {
  std::vector<std::string> names;
  for (const FamilyTraits* f : family_registry()) names.emplace_back(f->name);
  return names;
}

std::vector<std::string> family_names() {
  std::vector<std::string> names = deck_family_names();
  std::sort(names.begin(), names.end());
  return names;
}

diffusion::Schedule family_schedule(const std::string& family, const diffusion::SchedulePresetOptions& p) {
  if (p.steps < 1) fail("{} schedule: steps must be >= 1, got {}", family, p.steps);
  const FamilyTraits* traits = find_family_traits(family);
  if (!traits) {
    std::vector<std::string> names = deck_family_names();
    const std::string last = names.back();
    names.pop_back();
    fail("unknown family '{}' for the sigma schedule: expected {} or {}", family, fmt::join(names, ", "), last);
  }
  if (!p.shift) return traits->schedule(p);
  diffusion::FlowMatchOptions o;
  o.steps = p.steps;
  o.shift = *p.shift;
  return diffusion::flow_match_schedule(o);
}

}  // namespace ditrl::models
