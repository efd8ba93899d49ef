#pragma once

// The model a training checkpoint holds, rebuilt on one process: the family
// its stored deck describes (preset or config, base weights or seeded init,
// both Wan2.2 experts, the deck's LoRA adapters), with the checkpoint's
// trained parameters copied in. A checkpoint written by any number of ranks
// reads the same: every dataset holds the full logical shape. `ditrl export`
// and `ditrl forward --checkpoint` share it.

#include <ditrl/config/deck.hpp>
#include <ditrl/models/family.hpp>

#include <memory>
#include <string>

namespace ditrl::app {

struct CheckpointModel {
  config::Config config;  // the stored deck
  std::shared_ptr<models::Family> family;
  size_t trained_tensors = 0;
  bool lora = false;
};

CheckpointModel load_checkpoint_model(const std::string& checkpoint, const std::string& attention = "math");

}  // namespace ditrl::app
