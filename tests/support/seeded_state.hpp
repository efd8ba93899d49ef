#pragma once

// A deck's seeded model state (what `ditrl train` draws without weights), as
// a weights file would hold it in `dtype`: the sliced-loading tests write it
// and check that loading it gives the full path's values.

#include <ditrl/app/options.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/io/safetensors.hpp>
#include <ditrl/models/weights.hpp>

namespace ditrl::test {

inline io::NamedTensors seeded_state(const config::Config& c, c10::ScalarType dtype) {
  io::NamedTensors out;
  for (auto& [name, t] : models::state_tensors(*app::deck_model(c, c10::kCPU))) out.emplace_back(name, t.to(dtype));
  return out;
}

}  // namespace ditrl::test
