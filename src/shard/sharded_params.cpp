// ShardedParams: the manager that composes slices, gathers, gradient reduce and AdamW.

#include <ditrl/error.hpp>
#include <ditrl/shard/sharded_params.hpp>
#include <ditrl/shard/unit_function.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

namespace ditrl::shard {

ShardedParams::ShardedParams(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                             const precision::CompiledPlan& plan, dist::Communicator& comm, ShardOptions options,
                             models::ParameterSource* source)
    : layout_(build_layout(model, units, plan, comm.size())),
      comm_(comm),
      options_(options),
      slices_(take_slices(layout_, comm.rank(), options.device, source)),
      gather_(layout_, slices_, comm, options.prefetch),
      reducer_(layout_, slices_, comm, options.canonical_sum),
      adamw_(options.adamw),
      anchor_(at::zeros({}, at::TensorOptions().device(options.device)).requires_grad_(true)) {}

models::Tensors ShardedParams::run(size_t index, const models::Tensors& inputs, const models::UnitFn& fn) {
  if (index >= layout_.root_index())
    fail("sharded parameters: unit index {} outside the {} wrap units", index, layout_.root_index());
  const bool inputs_need_grad =
      std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (at::GradMode::is_enabled() && (layout_.units[index].trainable() || inputs_need_grad))
    return run_with_backward(*this, index, inputs, fn, anchor_);
  // Nothing to differentiate: no backward will come for this call.
  gather_.gather(index);
  gather_.prefetch(index + 1);
  models::Tensors outputs = fn(inputs);
  if (!keep_gathered_) gather_.release(index);
  return outputs;
}

std::vector<at::Tensor> ShardedParams::trainable_params(size_t unit) const {
  std::vector<at::Tensor> params;
  for (const FlatGroup& g : layout_.units[unit].groups)
    if (g.trainable)
      for (const Slot& slot : g.slots) params.push_back(slot.param);
  return params;
}

void ShardedParams::begin_step() {
  gather_.gather(layout_.root_index());
}

void ShardedParams::finish_backward() {
  const size_t root = layout_.root_index();
  std::vector<at::Tensor> params = trainable_params(root), grads;
  for (at::Tensor& p : params) grads.push_back(p.grad());
  reducer_.reduce(root, grads);
  reducer_.end_micro_batch();
  for (at::Tensor& p : params) p.mutable_grad().reset();
}

void ShardedParams::zero_grad() {
  reducer_.discard();
  for (at::Tensor& p : trainable_params(layout_.root_index())) p.mutable_grad().reset();
}

double ShardedParams::grad_norm() {
  reducer_.settle();
  return shard::grad_norm(slices_, comm_);
}

double ShardedParams::clip_grad(double max_norm) {
  reducer_.settle();
  return shard::clip_grad(slices_, comm_, max_norm);
}

void ShardedParams::adamw_step(double lr) {
  reducer_.settle();
  gather_.release_all();
  adamw_.step(slices_, lr);
}

void ShardedParams::keep_gathered(bool on) {
  keep_gathered_ = on;
  if (!on) gather_.release_all();
}

MemoryReport ShardedParams::memory_report() const {
  MemoryReport report;
  for (const auto& unit : slices_.units) {
    for (const GroupSlices& gs : unit) {
      if (gs.master.defined()) {
        report.masters += gs.master.nbytes();
        report.moments += gs.exp_avg.nbytes() + gs.exp_avg_sq.nbytes();
        report.grads += gs.grad.nbytes();
      }
      if (!gs.compute.is_same(gs.master)) report.compute += gs.compute.nbytes();
    }
  }
  report.peak_gathered = gather_.peak_bytes();
  return report;
}

std::vector<ShardPiece> ShardedParams::pieces() {
  return shard::pieces(layout_, slices_, comm_.rank());
}

void ShardedParams::refresh_compute() {
  gather_.release_all();
  shard::refresh_compute(slices_);
}

void ShardedParams::load_full(const std::string& name, const at::Tensor& value) {
  gather_.release_all();
  shard::load_full(layout_, slices_, comm_.rank(), name, value);
}

at::Tensor ShardedParams::gather_full(const std::string& name) {
  return shard::gather_full(layout_, slices_, comm_, name);
}

}  // namespace ditrl::shard
