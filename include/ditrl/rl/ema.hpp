#pragma once

// EMA shadow of the trainable parameters: the DiffusionNFT "old" policy
// (docs/algorithms.md §4.4). theta_old <- delta theta_old + (1 - delta) theta,
// updated once per rollout, with delta(step) = decay while step <= flat_steps,
// else min((step - flat_steps) * ramp, max); steps count updates from 1.
// Works on whatever tensors it is given (a rank's local parameter shards).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ditrl::rl {

struct EmaOptions {
  double decay = 0.001;
  double ramp = 0.001;
  double max = 0.5;
  int64_t flat_steps = 0;
};

class EmaShadow {
 public:
  // `live` are the trainable tensors (updated in place by the optimizer); the
  // shadow starts as their copy.
  EmaShadow(std::vector<at::Tensor> live, const EmaOptions& options);

  double decay_at(int64_t step) const;
  // One update; returns the delta used.
  double update();
  // Exchanges live and shadow values (the old-policy forward / rollout sync
  // runs between two swaps).
  void swap();
  int64_t step() const { return step_; }
  // A resumed run continues the decay schedule where it stopped.
  void set_step(int64_t step) { step_ = step; }
  const std::vector<at::Tensor>& shadow() const { return shadow_; }

 private:
  std::vector<at::Tensor> live_;
  std::vector<at::Tensor> shadow_;
  EmaOptions options_;
  int64_t step_ = 0;
  bool swapped_ = false;
};

}  // namespace ditrl::rl
