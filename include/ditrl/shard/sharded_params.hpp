#pragma once

// The sharded-parameter manager (docs/design.md §3, ZeRO-3 / FSDP2 semantics).
//
// Each rank keeps, per flat group of the layout (shard/layout.hpp), its
// slices (shard/slices.hpp). The model's parameters hold no data between
// uses: a wrap unit's parameters become views of its all-gathered compute
// slices while the unit runs (run(), shard/gather.hpp), the root unit's for a
// whole step (begin_step() .. adamw_step()).
//
// A step:
//   params.zero_grad();
//   for each micro-batch: params.begin_step(); loss = model(...); loss.backward(); params.finish_backward();
//   const double norm = params.clip_grad(max_norm);   // or grad_norm()
//   if (std::isfinite(norm)) params.adamw_step(lr); // else skip the step
//
// In backward each unit is gathered again, recomputed from its saved inputs
// and its parameter gradients are reduce-scattered (shard/grad_reduce.hpp):
// activation checkpointing and FSDP in one place (shard/unit_function.cpp);
// with recompute off each unit keeps its forward's graph instead.
// All ranks must make the same calls in the same order (they are collectives).

#include <ditrl/dist/communicator.hpp>
#include <ditrl/models/unit.hpp>
#include <ditrl/shard/gather.hpp>
#include <ditrl/shard/grad_norm.hpp>
#include <ditrl/shard/grad_reduce.hpp>
#include <ditrl/shard/layout.hpp>
#include <ditrl/shard/optimizer.hpp>
#include <ditrl/shard/pieces.hpp>
#include <ditrl/shard/slices.hpp>

#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

namespace ditrl::shard {

struct ShardOptions {
  bool reshard_after_forward = true;  // false: keep units gathered from forward until their backward
  bool prefetch = true;               // gather the next unit behind the current one's compute (N > 1)
  bool recompute = true;              // false: keep each unit's graph from forward to backward (no recompute)
  c10::Device device = c10::kCPU;     // where slices and gathered units live (the runtime's device)
  bool canonical_sum = false;         // deterministic mode: micro-batch gradients summed in the canonical tree
                                      // (shard/grad_reduce.hpp), the same at every power-of-two rank count
  AdamWOptions adamw;
};

// Wall seconds this rank spent blocked in the manager's collectives since
// construction (callers take differences): gathers that were not hidden by a
// prefetch (a synchronous gather, or waiting for the prefetched one) and
// gradient reduce-scatters. On a busy machine this includes waiting for the
// slowest peer to arrive.
struct CommSeconds {
  double gather = 0;
  double reduce_scatter = 0;
};

class ShardedParams final : public models::UnitRunner {
 public:
  // Takes the current values of `model`'s parameters (identical on every
  // rank) as the masters, then empties them. Parameters on the meta device (a
  // sliced family, models::FamilyOptions::sliced) are read from `source`,
  // each rank reading only its slices (take_slices).
  ShardedParams(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                const precision::CompiledPlan& plan, dist::Communicator& comm, ShardOptions options = {},
                models::ParameterSource* source = nullptr);
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  models::Tensors run(size_t index, const models::Tensors& inputs, const models::UnitFn& fn) override;

  // Gathers the root unit (no-op when it is gathered); call before a forward.
  void begin_step();
  // After each backward: reduce-scatters the root unit's gradients into the
  // fp32 slices (the wrap units did so during the backward).
  void finish_backward();
  void zero_grad();

  // Global L2 norm of the gradient slices (shard/optimizer.hpp).
  double grad_norm();
  // torch's clip_grad_norm_ (shard/optimizer.hpp); returns the pre-clip norm.
  double clip_grad(double max_norm);
  // One AdamW step on the slices, then the compute slices are re-cast and
  // every gathered unit released.
  void adamw_step(double lr);
  int64_t step_count() const { return adamw_.steps(); }
  void set_step_count(int64_t step) { adamw_.set_steps(step); }
  CommSeconds comm_seconds() const { return {gather_.seconds(), reducer_.seconds()}; }

  // While on, units gathered by no-grad calls stay gathered (and their
  // parameters pointed at the full tensors) instead of being released after
  // each call: the denoising steps of a rollout then gather every unit once
  // instead of once per step, at the cost of holding the whole compute model.
  // Turning it off releases them. Collective like run().
  void keep_gathered(bool on);

  // Bytes this rank holds now; peak_gathered is the most gathered at once so
  // far (released gather buffers are kept for reuse: that much stays allocated).
  MemoryReport memory_report() const;
  const Layout& layout() const { return layout_; }
  const c10::Device& device() const { return options_.device; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }

  // Checkpoints: this rank's pieces in layout order (shard/pieces.hpp).
  std::vector<ShardPiece> pieces();
  // After writing masters through pieces(): re-casts the compute slices.
  void refresh_compute();
  void load_full(const std::string& name, const at::Tensor& value);
  at::Tensor gather_full(const std::string& name);

 private:
  friend struct UnitFunction;

  std::vector<at::Tensor> trainable_params(size_t unit) const;

  Layout layout_;
  dist::Communicator& comm_;
  ShardOptions options_;
  Slices slices_;
  UnitGather gather_;
  GradReducer reducer_;
  AdamW adamw_;
  // An input that requires grad, so that autograd records a unit call even
  // when none of its inputs does (frozen root, first block).
  at::Tensor anchor_;
  bool keep_gathered_ = false;
};

// Scope of keep_gathered(true), e.g. one rollout; a no-op when disabled.
class KeepGathered {
 public:
  KeepGathered(ShardedParams& params, bool enabled) : params_(enabled ? &params : nullptr) {
    if (params_) params_->keep_gathered(true);
  }
  ~KeepGathered() {
    if (params_) params_->keep_gathered(false);
  }
  KeepGathered(const KeepGathered&) = delete;
  KeepGathered& operator=(const KeepGathered&) = delete;

 private:
  ShardedParams* params_;
};

}  // namespace ditrl::shard
