#pragma once

// The sharded-parameter manager (design.md §3, ZeRO-3 / FSDP2 semantics).
//
// Each rank keeps, per flat group of the layout (shard/layout.hpp), its slice
// of the fp32 masters, the two fp32 AdamW moments, an fp32 gradient
// accumulator and a compute-dtype copy of the master slice (frozen LoRA base
// weights: the compute slice only). The model's parameters hold no data
// between uses: a wrap unit's parameters become views of its all-gathered
// compute slices while the unit runs (run()), the root unit's for a whole
// step (begin_step() .. adamw_step()).
//
// A step:
//   params.zero_grad();
//   for each micro-batch: params.begin_step(); loss = model(...); loss.backward(); params.finish_backward();
//   const double norm = params.clip_grad(max_norm);   // or grad_norm()
//   if (std::isfinite(norm)) params.adamw_step(lr); // else skip the step
//
// In backward each unit is gathered again, recomputed from its saved inputs
// and its parameter gradients are reduce-scattered (average over ranks, in
// the reduce dtype) and added to the fp32 gradient slices: activation
// checkpointing and FSDP in one place. All ranks must make the same calls in
// the same order (they are collectives).

#include <ditrl/dist/communicator.hpp>
#include <ditrl/models/unit.hpp>
#include <ditrl/shard/layout.hpp>

#include <future>
#include <memory>
#include <string>
#include <vector>

namespace ditrl::config {
struct ParallelSection;
struct TrainSection;
}  // namespace ditrl::config

namespace ditrl::shard {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: p -= lr * weight_decay * p
};

struct ShardOptions {
  bool reshard_after_forward = true;  // false: keep units gathered from forward until their backward
  bool prefetch = true;               // gather the next unit on a second communicator while one runs (N > 1)
  at::Device device = at::kCPU;       // where slices and gathered units live (CUDA with the NCCL backend)
  AdamWOptions adamw;
};

// The deck's [parallel] switches and [train]'s AdamW keys (betas, eps,
// weight_decay); the device stays the CPU.
ShardOptions shard_options(const config::ParallelSection& parallel, const config::TrainSection& train);

// This rank's piece of one parameter, for checkpoints: elements [begin, end)
// of the parameter flattened. The tensors are views into the manager's
// slices: reading them saves, writing them loads (then refresh_compute()).
// Wall seconds this rank spent blocked in the manager's collectives since
// construction (callers take differences): gathers that were not hidden by a
// prefetch (a synchronous gather, or waiting for the prefetched one) and
// gradient reduce-scatters. On a busy machine this includes waiting for the
// slowest peer to arrive.
struct CommSeconds {
  double gather = 0;
  double reduce_scatter = 0;
};

struct ShardPiece {
  std::string name;  // canonical
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;
  bool trainable = true;
  at::Tensor master;      // master dtype; undefined when frozen
  at::Tensor exp_avg;     // fp32; undefined when frozen
  at::Tensor exp_avg_sq;  // fp32; undefined when frozen
  at::Tensor compute;     // compute dtype (aliases master where the dtypes agree)
};

class ShardedParams final : public models::UnitRunner {
 public:
  // Takes the current values of `model`'s parameters (identical on every
  // rank, materialized: not on the meta device) as the masters, then empties
  // them.
  ShardedParams(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                const precision::CompiledPlan& plan, dist::Communicator& comm, ShardOptions options = {});
  ~ShardedParams() override;
  ShardedParams(const ShardedParams&) = delete;
  ShardedParams& operator=(const ShardedParams&) = delete;

  models::Tensors run(size_t index, const models::Tensors& inputs, const models::UnitFn& fn) override;

  // Gathers the root unit (no-op when it is gathered); call before a forward.
  void begin_step();
  // After each backward: reduce-scatters the root unit's gradients into the
  // fp32 slices (the wrap units did so during the backward).
  void finish_backward();
  void zero_grad();

  // Global L2 norm of the gradient slices: one all-reduce.
  double grad_norm();
  // Scales the gradients to norm max_norm when above it (torch's
  // clip_grad_norm_: coefficient max_norm / (norm + 1e-6)); returns the
  // pre-clip norm. A non-finite norm leaves the gradients as they are: the
  // caller skips the step (zero_grad()).
  double clip_grad(double max_norm);
  // One AdamW step on the slices, then the compute slices are re-cast and
  // every gathered unit released.
  void adamw_step(double lr);
  int64_t step_count() const { return step_; }
  void set_step_count(int64_t step) { step_ = step; }
  CommSeconds comm_seconds() const { return comm_seconds_; }

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
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.size(); }

  // Checkpoints: this rank's pieces in layout order (pieces owning no
  // element are left out).
  std::vector<ShardPiece> pieces();
  // After writing masters through pieces(): re-casts the compute slices.
  void refresh_compute();
  // Sets a parameter's master (and compute slice) from its full value;
  // local, every rank takes its own range.
  void load_full(const std::string& name, const at::Tensor& value);
  // The full parameter in fp32 (from the masters; frozen: the compute
  // slice). Collective: every rank calls it with the same name.
  at::Tensor gather_full(const std::string& name);

 private:
  struct GroupState {
    at::Tensor compute;                            // [shard], aliases master when the dtypes agree
    at::Tensor master, exp_avg, exp_avg_sq, grad;  // [shard], trainable groups only
  };
  // A gathered unit: one byte buffer holding every group's full tensor.
  struct Gathered {
    at::Tensor buffer;  // undefined = released
    std::vector<at::Tensor> groups;
  };
  struct UnitState {
    std::vector<GroupState> groups;
    Gathered gathered;
  };
  struct Prefetch {
    size_t unit = 0;
    std::future<Gathered> gathered;
  };
  // Released gather buffers are reused: page-faulting a fresh multi-MiB
  // buffer on every gather can cost more than the gather itself. The root
  // and two units are live at once at most.
  static constexpr size_t kPoolBuffers = 3;
  friend struct UnitFunction;

  at::TensorOptions on(c10::ScalarType dtype) const;
  void init_state();
  int64_t gathered_bytes(size_t unit) const;
  Gathered gather_into(size_t unit, at::Tensor buffer, dist::Communicator& comm) const;
  at::Tensor take_buffer(int64_t bytes);
  void recycle(at::Tensor buffer);
  at::Tensor scratch(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const;
  void gather(size_t unit);
  void prefetch(size_t unit);
  void drop_prefetch();
  void release(size_t unit);
  void release_all();
  void point_params(size_t unit);
  void reduce_grads(size_t unit, const std::vector<at::Tensor>& grads);
  std::vector<at::Tensor> trainable_params(size_t unit) const;
  void track_gathered(int64_t delta);

  Layout layout_;
  dist::Communicator& comm_;
  std::unique_ptr<dist::Communicator> prefetch_comm_;  // prefetch gathers run on their own thread and communicator
  ShardOptions options_;
  std::vector<UnitState> state_;
  std::unique_ptr<Prefetch> pending_;
  std::vector<at::Tensor> pool_;                  // released gather buffers
  at::Tensor reduce_flat_, reduce_mine_, denom_;  // scratch bytes
  // An input that requires grad, so that autograd records a unit call even
  // when none of its inputs does (frozen root, first block).
  at::Tensor anchor_;
  int64_t step_ = 0;
  bool keep_gathered_ = false;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_ = 0;
  CommSeconds comm_seconds_;
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
