#pragma once

// The optimizer half of a sharded step, on this rank's slices only: the
// global gradient norm (shard/grad_norm.hpp), torch's clip_grad_norm_, and AdamW
// with the same operations in the same order as torch::optim::AdamW::step.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/shard/slices.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::shard {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: p -= lr * weight_decay * p
  bool fused = false;         // LibTorch's fused kernel: the same update up to rounding
};

// Scales the gradients to norm max_norm when above it (coefficient
// max_norm / (norm + 1e-6)); returns the pre-clip norm. A non-finite norm
// leaves the gradients as they are.
double clip_grad(Slices& slices, dist::Communicator& comm, double max_norm);

class AdamW {
 public:
  explicit AdamW(AdamWOptions options) : options_(options) {}
  // One step on every trainable slice; compute slices are re-cast.
  void step(Slices& slices, double lr);
  int64_t steps() const { return steps_; }
  void set_steps(int64_t steps) { steps_ = steps; }

 private:
  void fused_step(Slices& slices, double lr);

  AdamWOptions options_;
  int64_t steps_ = 0;
  at::Tensor denom_;  // one chunk of scratch
};

}  // namespace ditrl::shard
