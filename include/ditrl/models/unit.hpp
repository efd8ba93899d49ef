#pragma once

// What a model exposes so that it can be sharded without knowing it: its wrap
// units (one per transformer block) and a "run this unit" call. The family
// code calls ForwardContext::run_unit for every block; unsharded runs call the
// block directly, the sharded-parameter manager (shard/) gathers the block's
// parameters first and, in backward, re-gathers, recomputes and
// reduce-scatters. With sequence parallelism (`ulysses`) a family splits its
// tokens across the group and passes only the local ones to its units. Taps
// receive named tensors at module boundaries (fixture intermediates,
// train/rollout parity dumps) and cost nothing when absent.

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::models {

using Tensors = std::vector<at::Tensor>;
using UnitFn = std::function<Tensors(const Tensors&)>;

// A block whose parameters are gathered together. Parameters of the family
// that belong to no unit form the root unit.
struct WrapUnit {
  std::string name;  // module path, e.g. "transformer_blocks.3"
  std::shared_ptr<torch::nn::Module> module;
};

class UnitRunner {
 public:
  virtual ~UnitRunner() = default;
  // Runs fn(inputs). fn reads only unit `index`'s parameters and `inputs`
  // (everything else it needs is passed in; undefined tensors are allowed)
  // and is deterministic: a sharded runner calls it again in backward.
  virtual Tensors run(size_t index, const Tensors& inputs, const UnitFn& fn) = 0;
};

class Tap {
 public:
  virtual ~Tap() = default;
  // `module` is the checkpoint module path ("transformer_blocks.0"), `name`
  // the tensor's name there ("out0", "attn_out", ...).
  virtual void record(const std::string& module, const std::string& name, const at::Tensor& value) = 0;
};

// Taps are silenced while a sharded runner recomputes a unit in backward, so
// every tensor is recorded once, from the forward.
class TapSuppressGuard {
 public:
  TapSuppressGuard();
  ~TapSuppressGuard();
  TapSuppressGuard(const TapSuppressGuard&) = delete;
  TapSuppressGuard& operator=(const TapSuppressGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

class Ulysses;  // models/ulysses.hpp

struct ForwardContext {
  UnitRunner* runner = nullptr;      // nullptr: run units directly
  Tap* tap = nullptr;                // nullptr: record nothing
  const Ulysses* ulysses = nullptr;  // nullptr: this rank holds the whole sequence
  // The batch's timesteps (B,) on the host, as the sampler and the trainer
  // have them: a family decides per batch from these (Wan2.2's expert)
  // without reading the device. Undefined: it reads the timesteps it is
  // given (free on the CPU; on a GPU, a wait for the device).
  at::Tensor host_timesteps = {};

  Tensors run_unit(size_t index, const Tensors& inputs, const UnitFn& fn) const {
    return runner ? runner->run(index, inputs, fn) : fn(inputs);
  }
  void record(const std::string& module, const std::string& name, const at::Tensor& value) const {
    if (tap && !TapSuppressGuard::active()) tap->record(module, name, value);
  }
};

}  // namespace ditrl::models
