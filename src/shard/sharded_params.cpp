#include <ditrl/config/sections.hpp>
#include <ditrl/error.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace ditrl::shard {

namespace {

at::Tensor placeholder(c10::ScalarType dtype, at::Device device) {
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
}

// The slice of a group's shard holding elements [begin, end) of `slot`.
at::Tensor slot_part(const at::Tensor& shard_tensor, const FlatGroup& g, const Slot& slot, int rank,
                     std::pair<int64_t, int64_t> range) {
  return shard_tensor.narrow(0, slot.offset + range.first - rank * g.shard, range.second - range.first);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t aligned(int64_t bytes) {
  return (bytes + 63) / 64 * 64;
}

// fp64 sum of squares of an fp32 tensor in a fixed order (blocks summed in
// sequence, block sums added in block order), without temporaries.
double sum_of_squares(const at::Tensor& t) {
  if (!t.device().is_cpu()) return t.to(at::kDouble).square().sum().item<double>();
  constexpr int64_t kBlock = 1 << 16;
  const float* x = t.data_ptr<float>();
  const int64_t n = t.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
  at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      double sum = 0;
      for (int64_t i = b * kBlock; i < std::min(n, (b + 1) * kBlock); ++i) sum += static_cast<double>(x[i]) * x[i];
      partial[b] = sum;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

// What a unit call's backward needs: the manager, the unit, the function to
// recompute, and where undefined inputs/outputs were (autograd::Function
// takes defined tensors only). Held by the autograd node through an IValue
// capsule (LibTorch's holder for opaque objects, in 1.13 and 2.x), so it
// lives exactly as long as the graph.
struct UnitCall : torch::CustomClassHolder {
  ShardedParams* owner = nullptr;
  size_t index = 0;
  models::UnitFn fn;
  std::vector<bool> input_defined;
  std::vector<bool> output_defined;

  models::Tensors full_inputs(const at::TensorList defined) const {
    models::Tensors inputs;
    size_t k = 0;
    for (bool d : input_defined) inputs.push_back(d ? defined[k++] : at::Tensor());
    return inputs;
  }
};

// Forward: gather, run without recording, release. Backward: gather again,
// recompute with grad on detached inputs, reduce-scatter the parameter
// gradients, release, return the input gradients.
struct UnitFunction : torch::autograd::Function<UnitFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<UnitCall> call, at::TensorList inputs,
                                                const at::Tensor& /*anchor*/) {
    ShardedParams& self = *call->owner;
    self.gather(call->index);
    self.prefetch(call->index + 1);
    models::Tensors outputs = call->fn(call->full_inputs(inputs));
    if (self.options_.reshard_after_forward) self.release(call->index);
    for (at::Tensor& out : outputs) {
      call->output_defined.push_back(out.defined());
      if (!out.defined()) out = at::empty({0});
    }
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["call"] = at::IValue::make_capsule(call);
    ctx->set_materialize_grads(false);
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<UnitCall>(ctx->saved_data["call"].toCapsule());
    ShardedParams& self = *call->owner;
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    self.gather(call->index);
    if (call->index > 0) self.prefetch(call->index - 1);

    std::vector<at::Tensor> detached, wrt;
    std::vector<size_t> wrt_inputs;
    for (size_t k = 0; k < saved.size(); ++k) {
      detached.push_back(saved[k].detach());
      if (!saved[k].requires_grad()) continue;
      detached.back().requires_grad_(true);
      wrt.push_back(detached.back());
      wrt_inputs.push_back(k);
    }
    const std::vector<at::Tensor> params = self.trainable_params(call->index);
    wrt.insert(wrt.end(), params.begin(), params.end());

    torch::autograd::variable_list grads(wrt.size());
    {
      at::AutoGradMode enable(true);
      models::TapSuppressGuard quiet;
      const models::Tensors outputs = call->fn(call->full_inputs(detached));
      std::vector<at::Tensor> roots, root_grads;
      for (size_t j = 0; j < outputs.size() && j < grad_outputs.size(); ++j) {
        if (!grad_outputs[j].defined() || !outputs[j].defined() || !outputs[j].requires_grad()) continue;
        roots.push_back(outputs[j]);
        root_grads.push_back(grad_outputs[j]);
      }
      if (!roots.empty() && !wrt.empty())
        grads = torch::autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false, /*create_graph=*/false,
                                      /*allow_unused=*/true);
    }
    self.reduce_grads(call->index,
                      std::vector<at::Tensor>(grads.begin() + static_cast<int64_t>(wrt_inputs.size()), grads.end()));
    self.release(call->index);

    // One entry per forward argument: the call, each input, the anchor.
    torch::autograd::variable_list result(saved.size() + 2);
    for (size_t w = 0; w < wrt_inputs.size(); ++w) result[1 + wrt_inputs[w]] = grads[w];
    return result;
  }
};

ShardOptions shard_options(const config::ParallelSection& parallel, const config::TrainSection& train) {
  if (train.betas.size() != 2) fail("train.betas must have two entries [beta1, beta2] (got {})", train.betas.size());
  ShardOptions options;
  options.reshard_after_forward = parallel.reshard_after_forward;
  options.prefetch = parallel.prefetch;
  options.adamw = {train.betas[0], train.betas[1], train.eps, train.weight_decay};
  return options;
}

ShardedParams::ShardedParams(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                             const precision::CompiledPlan& plan, dist::Communicator& comm, ShardOptions options)
    : layout_(build_layout(model, units, plan, comm.size())),
      comm_(comm),
      options_(options),
      anchor_(at::zeros({}).requires_grad_(true)) {
  // A 1-rank gather is a local copy: nothing to hide behind compute.
  if (options_.prefetch && comm_.size() > 1) prefetch_comm_ = comm_.split(0, comm_.rank());
  init_state();
}

ShardedParams::~ShardedParams() {
  try {
    drop_prefetch();
  } catch (...) {
    // A failed prefetch is reported where it is consumed; here it is only joined.
  }
}

at::TensorOptions ShardedParams::on(c10::ScalarType dtype) const {
  return at::TensorOptions().dtype(dtype).device(options_.device);
}

void ShardedParams::init_state() {
  const int rank = comm_.rank();
  for (const UnitLayout& unit : layout_.units) {
    UnitState& us = state_.emplace_back();
    for (const FlatGroup& g : unit.groups) {
      GroupState& gs = us.groups.emplace_back();
      const c10::ScalarType held = g.trainable ? g.master : g.compute;
      at::Tensor values = at::zeros({g.shard}, on(held));
      for (const Slot& slot : g.slots) {
        if (slot.param.device().is_meta())
          fail("sharded parameters: '{}' is on the meta device; the manager takes materialized parameters", slot.name);
        const auto range = g.owned_range(slot, rank);
        if (range.first == range.second) continue;
        slot_part(values, g, slot, rank, range)
            .copy_(slot.param.detach().reshape(-1).narrow(0, range.first, range.second - range.first));
      }
      if (g.trainable) {
        gs.master = values;
        gs.exp_avg = at::zeros({g.shard}, on(at::kFloat));
        gs.exp_avg_sq = at::zeros({g.shard}, on(at::kFloat));
        gs.grad = at::zeros({g.shard}, on(at::kFloat));
        gs.compute = g.compute == g.master ? gs.master : gs.master.to(g.compute);
      } else {
        gs.compute = values;
      }
      for (const Slot& slot : g.slots) slot.param.set_data(placeholder(g.compute, options_.device));
    }
  }
}

models::Tensors ShardedParams::run(size_t index, const models::Tensors& inputs, const models::UnitFn& fn) {
  if (index >= layout_.root_index())
    fail("sharded parameters: unit index {} outside the {} wrap units", index, layout_.root_index());
  const bool inputs_need_grad =
      std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined() && t.requires_grad(); });
  if (!at::GradMode::is_enabled() || !(layout_.units[index].trainable() || inputs_need_grad)) {
    // Nothing to differentiate: no backward will come for this call.
    gather(index);
    prefetch(index + 1);
    models::Tensors outputs = fn(inputs);
    if (!keep_gathered_) release(index);
    return outputs;
  }
  auto call = c10::make_intrusive<UnitCall>();
  call->owner = this;
  call->index = index;
  call->fn = fn;
  std::vector<at::Tensor> defined;
  for (const at::Tensor& t : inputs) {
    call->input_defined.push_back(t.defined());
    if (t.defined()) defined.push_back(t);
  }
  models::Tensors outputs = UnitFunction::apply(call, at::TensorList(defined), anchor_);
  for (size_t j = 0; j < outputs.size(); ++j)
    if (!call->output_defined[j]) outputs[j] = at::Tensor();
  return outputs;
}

int64_t ShardedParams::gathered_bytes(size_t unit) const {
  int64_t bytes = 0;
  for (const FlatGroup& g : layout_.units[unit].groups) bytes += aligned(g.gathered_bytes(comm_.size()));
  return bytes;
}

ShardedParams::Gathered ShardedParams::gather_into(size_t unit, at::Tensor buffer, dist::Communicator& comm) const {
  Gathered gathered{std::move(buffer), {}};
  int64_t offset = 0;
  const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t bytes = groups[g].gathered_bytes(comm.size());
    at::Tensor full = gathered.buffer.narrow(0, offset, bytes).view(groups[g].compute);
    comm.all_gather(state_[unit].groups[g].compute, full);
    gathered.groups.push_back(full);
    offset += aligned(bytes);
  }
  return gathered;
}

at::Tensor ShardedParams::take_buffer(int64_t bytes) {
  auto best = pool_.end();
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (it->numel() >= bytes && (best == pool_.end() || it->numel() < best->numel())) best = it;
  if (best == pool_.end()) return at::empty({bytes}, on(at::kByte));
  at::Tensor buffer = *best;
  pool_.erase(best);
  return buffer;
}

// A buffer still referenced elsewhere (say, an output viewing a parameter)
// is left to its holders instead of being overwritten by a later gather.
void ShardedParams::recycle(at::Tensor buffer) {
  if (!buffer.defined() || buffer.storage().use_count() != 1) return;
  pool_.push_back(std::move(buffer));
  if (pool_.size() > kPoolBuffers)
    pool_.erase(std::min_element(pool_.begin(), pool_.end(),
                                 [](const at::Tensor& a, const at::Tensor& b) { return a.numel() < b.numel(); }));
}

void ShardedParams::gather(size_t unit) {
  UnitState& us = state_[unit];
  if (us.gathered.buffer.defined() || layout_.units[unit].groups.empty()) return;
  const auto start = Clock::now();
  if (pending_ && pending_->unit == unit) {
    us.gathered = pending_->gathered.get();  // its bytes were counted when it was launched
    pending_.reset();
  } else {
    drop_prefetch();
    us.gathered = gather_into(unit, take_buffer(gathered_bytes(unit)), comm_);
    track_gathered(layout_.units[unit].gathered_bytes(comm_.size()));
  }
  comm_seconds_.gather += seconds_since(start);
  point_params(unit);
}

// Every rank makes the same run() calls, so every rank launches and consumes
// the same prefetches in the same order on prefetch_comm_.
void ShardedParams::prefetch(size_t unit) {
  if (!prefetch_comm_ || unit >= layout_.root_index() || state_[unit].gathered.buffer.defined() ||
      layout_.units[unit].groups.empty() || (pending_ && pending_->unit == unit))
    return;
  drop_prefetch();
  track_gathered(layout_.units[unit].gathered_bytes(comm_.size()));
  pending_ = std::make_unique<Prefetch>();
  pending_->unit = unit;
  pending_->gathered = std::async(std::launch::async, [this, unit, buffer = take_buffer(gathered_bytes(unit))] {
    return gather_into(unit, buffer, *prefetch_comm_);
  });
}

void ShardedParams::drop_prefetch() {
  if (!pending_) return;
  std::unique_ptr<Prefetch> dropped = std::move(pending_);
  track_gathered(-layout_.units[dropped->unit].gathered_bytes(comm_.size()));
  recycle(dropped->gathered.get().buffer);
}

void ShardedParams::point_params(size_t unit) {
  const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
  for (size_t g = 0; g < groups.size(); ++g)
    for (const Slot& slot : groups[g].slots)
      slot.param.set_data(state_[unit].gathered.groups[g].narrow(0, slot.offset, slot.numel).view(slot.shape));
}

void ShardedParams::release(size_t unit) {
  UnitState& us = state_[unit];
  if (!us.gathered.buffer.defined()) return;
  for (const FlatGroup& g : layout_.units[unit].groups)
    for (const Slot& slot : g.slots) slot.param.set_data(placeholder(g.compute, options_.device));
  Gathered released = std::move(us.gathered);
  us.gathered = Gathered{};
  released.groups.clear();
  recycle(std::move(released.buffer));
  track_gathered(-layout_.units[unit].gathered_bytes(comm_.size()));
}

void ShardedParams::keep_gathered(bool on) {
  keep_gathered_ = on;
  if (!on) release_all();
}

void ShardedParams::release_all() {
  drop_prefetch();
  for (size_t u = 0; u < state_.size(); ++u) release(u);
}

void ShardedParams::track_gathered(int64_t delta) {
  gathered_bytes_ += delta;
  peak_gathered_ = std::max(peak_gathered_, gathered_bytes_);
}

std::vector<at::Tensor> ShardedParams::trainable_params(size_t unit) const {
  std::vector<at::Tensor> params;
  for (const FlatGroup& g : layout_.units[unit].groups)
    if (g.trainable)
      for (const Slot& slot : g.slots) params.push_back(slot.param);
  return params;
}

// grads: one per trainable parameter of the unit in layout order (undefined
// = zero). Flattened per group in the reduce dtype, averaged over ranks.
void ShardedParams::reduce_grads(size_t unit, const std::vector<at::Tensor>& grads) {
  size_t k = 0;
  const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].trainable) continue;
    const int64_t padded = groups[g].shard * comm_.size();
    at::Tensor flat = scratch(reduce_flat_, padded, groups[g].reduce);
    for (const Slot& slot : groups[g].slots) {
      const at::Tensor& grad = grads.at(k++);
      at::Tensor part = flat.narrow(0, slot.offset, slot.numel);
      if (grad.defined())
        part.copy_(grad.reshape(-1));
      else
        part.zero_();
    }
    flat.narrow(0, groups[g].numel, padded - groups[g].numel).zero_();
    at::Tensor mine = scratch(reduce_mine_, groups[g].shard, groups[g].reduce);
    const auto start = Clock::now();
    comm_.reduce_scatter(flat, mine, dist::ReduceOp::Avg);
    comm_seconds_.reduce_scatter += seconds_since(start);
    state_[unit].groups[g].grad.add_(mine);
  }
}

// Scratch reused across calls (see take_buffer).
at::Tensor ShardedParams::scratch(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const {
  const int64_t bytes = elements * precision::dtype_bytes(dtype);
  if (!holder.defined() || holder.numel() < bytes) holder = at::empty({bytes}, on(at::kByte));
  return holder.narrow(0, 0, bytes).view(dtype);
}

void ShardedParams::begin_step() {
  gather(layout_.root_index());
}

void ShardedParams::finish_backward() {
  const size_t root = layout_.root_index();
  std::vector<at::Tensor> params = trainable_params(root), grads;
  for (at::Tensor& p : params) grads.push_back(p.grad());
  reduce_grads(root, grads);
  for (at::Tensor& p : params) p.mutable_grad().reset();
}

void ShardedParams::zero_grad() {
  for (UnitState& us : state_)
    for (GroupState& gs : us.groups)
      if (gs.grad.defined()) gs.grad.zero_();
  for (at::Tensor& p : trainable_params(layout_.root_index())) p.mutable_grad().reset();
}

double ShardedParams::grad_norm() {
  double local = 0;
  for (const UnitState& us : state_)
    for (const GroupState& gs : us.groups)
      if (gs.grad.defined()) local += sum_of_squares(gs.grad);
  at::Tensor total = at::full({1}, local, on(at::kDouble));
  comm_.all_reduce(total, dist::ReduceOp::Sum);
  return std::sqrt(total.item<double>());
}

double ShardedParams::clip_grad(double max_norm) {
  const double norm = grad_norm();
  if (!std::isfinite(norm)) return norm;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1)
    for (UnitState& us : state_)
      for (GroupState& gs : us.groups)
        if (gs.grad.defined()) gs.grad.mul_(coefficient);
  return norm;
}

// The same operations, in the same order, as torch::optim::AdamW::step.
void ShardedParams::adamw_step(double lr) {
  release_all();
  ++step_;
  const AdamWOptions& o = options_.adamw;
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(step_));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(step_));
  for (UnitState& us : state_) {
    for (GroupState& gs : us.groups) {
      if (!gs.master.defined()) continue;
      if (o.weight_decay != 0) gs.master.mul_(1 - lr * o.weight_decay);
      gs.exp_avg.mul_(o.beta1).add_(gs.grad, 1 - o.beta1);
      gs.exp_avg_sq.mul_(o.beta2).addcmul_(gs.grad, gs.grad, 1 - o.beta2);
      // denom = (exp_avg_sq.sqrt() / sqrt(bias_correction2)) + eps, in reused memory.
      at::Tensor denom = scratch(denom_, gs.exp_avg_sq.numel(), at::kFloat);
      at::sqrt_out(denom, gs.exp_avg_sq).div_(std::sqrt(bias_correction2)).add_(o.eps);
      gs.master.addcdiv_(gs.exp_avg, denom, -lr / bias_correction1);
      if (!gs.compute.is_same(gs.master)) gs.compute.copy_(gs.master);
    }
  }
}

MemoryReport ShardedParams::memory_report() const {
  MemoryReport report;
  for (const UnitState& us : state_) {
    for (const GroupState& gs : us.groups) {
      if (gs.master.defined()) {
        report.masters += gs.master.nbytes();
        report.moments += gs.exp_avg.nbytes() + gs.exp_avg_sq.nbytes();
        report.grads += gs.grad.nbytes();
      }
      if (!gs.compute.is_same(gs.master)) report.compute += gs.compute.nbytes();
    }
  }
  report.peak_gathered = peak_gathered_;
  return report;
}

std::vector<ShardPiece> ShardedParams::pieces() {
  std::vector<ShardPiece> out;
  const int rank = comm_.rank();
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    for (size_t g = 0; g < layout_.units[u].groups.size(); ++g) {
      const FlatGroup& group = layout_.units[u].groups[g];
      GroupState& gs = state_[u].groups[g];
      for (const Slot& slot : group.slots) {
        const auto range = group.owned_range(slot, rank);
        if (range.first == range.second) continue;
        ShardPiece piece{slot.name, slot.shape, range.first, range.second, group.trainable, {}, {}, {}, {}};
        piece.compute = slot_part(gs.compute, group, slot, rank, range);
        if (group.trainable) {
          piece.master = slot_part(gs.master, group, slot, rank, range);
          piece.exp_avg = slot_part(gs.exp_avg, group, slot, rank, range);
          piece.exp_avg_sq = slot_part(gs.exp_avg_sq, group, slot, rank, range);
        }
        out.push_back(std::move(piece));
      }
    }
  }
  return out;
}

void ShardedParams::refresh_compute() {
  release_all();
  for (UnitState& us : state_)
    for (GroupState& gs : us.groups)
      if (gs.master.defined() && !gs.compute.is_same(gs.master)) gs.compute.copy_(gs.master);
}

void ShardedParams::load_full(const std::string& name, const at::Tensor& value) {
  const SlotRef ref = layout_.find(name);
  const FlatGroup& group = layout_.units[ref.unit].groups[ref.group];
  const Slot& slot = layout_.slot(ref);
  if (value.sizes().vec() != slot.shape)
    fail("sharded parameters: loading '{}' with shape [{}] but the parameter has shape [{}]", name,
         fmt::join(value.sizes(), ", "), fmt::join(slot.shape, ", "));
  release_all();
  const auto range = group.owned_range(slot, comm_.rank());
  if (range.first == range.second) return;
  const at::Tensor part = value.detach().reshape(-1).narrow(0, range.first, range.second - range.first);
  GroupState& gs = state_[ref.unit].groups[ref.group];
  const int rank = comm_.rank();
  if (group.trainable) {
    slot_part(gs.master, group, slot, rank, range).copy_(part);
    if (!gs.compute.is_same(gs.master))
      slot_part(gs.compute, group, slot, rank, range).copy_(slot_part(gs.master, group, slot, rank, range));
  } else {
    slot_part(gs.compute, group, slot, rank, range).copy_(part);
  }
}

at::Tensor ShardedParams::gather_full(const std::string& name) {
  const SlotRef ref = layout_.find(name);
  const FlatGroup& group = layout_.units[ref.unit].groups[ref.group];
  const Slot& slot = layout_.slot(ref);
  const GroupState& gs = state_[ref.unit].groups[ref.group];
  const at::Tensor& held = group.trainable ? gs.master : gs.compute;
  at::Tensor full = at::empty({group.shard * comm_.size()}, held.options());
  comm_.all_gather(held, full);
  return full.narrow(0, slot.offset, slot.numel).to(at::kFloat).view(slot.shape).clone();
}

}  // namespace ditrl::shard
