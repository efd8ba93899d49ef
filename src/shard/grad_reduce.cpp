// A unit's gradients flattened per group, reduce-scattered and accumulated into the fp32 slices.

#include <ditrl/clock.hpp>
#include <ditrl/precision/dtype.hpp>
#include <ditrl/shard/grad_reduce.hpp>

#include <ATen/ATen.h>

#include <ditrl/error.hpp>

namespace ditrl::shard {

GradReducer::GradReducer(const Layout& layout, Slices& slices, dist::Communicator& comm, bool canonical)
    : layout_(layout), slices_(slices), comm_(comm), canonical_(canonical), reduced_(layout.units.size(), false) {
  for (size_t unit = 0; unit < layout_.units.size(); ++unit) {
    const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
    if (canonical_) trees_.emplace_back(groups.size());
    stale_.emplace_back(groups.size(), true);
    parts_.emplace_back(groups.size());
    for (size_t g = 0; g < groups.size(); ++g)
      if (in_place(groups[g]))
        for (const Slot& slot : groups[g].slots)
          parts_[unit][g].push_back(slices_.units[unit][g].grad.narrow(0, slot.offset, slot.numel).view(slot.shape));
  }
}

// One rank, fp32 reduce: the gradients go straight into the slice, with no
// flat copy of the unit first (its sum over one rank is itself, and fp32
// holds the gradient's dtype exactly, so the bits are the same).
bool GradReducer::in_place(const FlatGroup& group) const {
  return comm_.size() == 1 && !canonical_ && group.trainable && group.reduce == at::kFloat;
}

void GradReducer::reduce(size_t unit, const std::vector<at::Tensor>& grads) {
  if (canonical_ && reduced_.at(unit))
    fail(
        "gradient reduce: unit {} ran its backward twice in one micro-batch; the deterministic (canonical) "
        "gradient sum needs one reduction per unit and micro-batch",
        unit);
  reduced_.at(unit) = true;
  size_t k = 0;
  const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].trainable) continue;
    if (in_place(groups[g])) {
      accumulate_in_place(unit, g, grads, k);
      continue;
    }
    const int64_t padded = groups[g].shard * comm_.size();
    at::Tensor flat = buffer(flat_, padded, groups[g].reduce);
    for (const Slot& slot : groups[g].slots) {
      const at::Tensor& grad = grads.at(k++);
      at::Tensor part = flat.narrow(0, slot.offset, slot.numel);
      if (grad.defined())
        part.copy_(grad.reshape(-1));
      else
        part.zero_();
    }
    flat.narrow(0, groups[g].numel, padded - groups[g].numel).zero_();
    if (comm_.size() == 1) {  // the average over one rank is its own gradient: no collective, no copy
      accumulate(unit, g, flat);
      continue;
    }
    at::Tensor mine = buffer(mine_, groups[g].shard, groups[g].reduce);
    const auto start = Clock::now();
    if (overlap()) {
      drain();
      in_flight_ = {comm_.reduce_scatter_async(flat, mine, dist::ReduceOp::Avg), mine, unit, g, true};
    } else {
      comm_.reduce_scatter(flat, mine, dist::ReduceOp::Avg);
      accumulate(unit, g, mine);
    }
    seconds_ += seconds_since(start);
  }
}

void GradReducer::accumulate(size_t unit, size_t group, const at::Tensor& mine) {
  if (canonical_) {
    trees_[unit][group].add(mine);
    return;
  }
  at::Tensor& slice = slices_.units[unit][group].grad;
  if (stale_[unit][group])
    slice.copy_(mine);
  else
    slice.add_(mine);
  stale_[unit][group] = false;
}

void GradReducer::accumulate_in_place(size_t unit, size_t group, const std::vector<at::Tensor>& grads, size_t& k) {
  const FlatGroup& g = layout_.units[unit].groups[group];
  const bool stale = stale_[unit][group];
  for (at::Tensor& part : parts_[unit][group]) {
    const at::Tensor& grad = grads.at(k++);
    if (!grad.defined()) {
      if (stale) part.zero_();
    } else if (stale) {
      part.copy_(grad);
    } else {
      part.add_(grad);
    }
  }
  if (stale && g.shard > g.numel) slices_.units[unit][group].grad.narrow(0, g.numel, g.shard - g.numel).zero_();
  stale_[unit][group] = false;
}

void GradReducer::drain() {
  if (!in_flight_.active) return;
  in_flight_.pending.wait();
  accumulate(in_flight_.unit, in_flight_.group, in_flight_.mine);
  in_flight_ = {};
}

void GradReducer::end_micro_batch() {
  drain();
  std::fill(reduced_.begin(), reduced_.end(), false);
}

void GradReducer::settle() {
  end_micro_batch();
  for (size_t u = 0; u < trees_.size(); ++u)
    for (size_t g = 0; g < trees_[u].size(); ++g) {
      if (trees_[u][g].empty()) continue;
      trees_[u][g].fold_into(slices_.units[u][g].grad);
      stale_[u][g] = false;
    }
  for (size_t u = 0; u < stale_.size(); ++u)
    for (size_t g = 0; g < stale_[u].size(); ++g)
      if (stale_[u][g] && slices_.units[u][g].grad.defined()) {
        slices_.units[u][g].grad.zero_();
        stale_[u][g] = false;
      }
}

void GradReducer::discard() {
  end_micro_batch();
  for (std::vector<TreeSum>& unit : trees_)
    for (TreeSum& tree : unit) tree.clear();
  for (std::vector<bool>& unit : stale_) std::fill(unit.begin(), unit.end(), true);
}

bool GradReducer::overlap() const {
  return slices_.device.is_cuda();
}

// On CUDA each call takes fresh buffers from the caching allocator, so a
// reduce-scatter in flight keeps its own; on the CPU they are reused (a fresh
// multi-MiB buffer per call costs its page faults every time).
at::Tensor GradReducer::buffer(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const {
  if (overlap()) return at::empty({elements}, slices_.on(dtype));
  return scratch(holder, elements, dtype);
}

at::Tensor GradReducer::scratch(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const {
  const int64_t bytes = elements * precision::dtype_bytes(dtype);
  if (!holder.defined() || holder.numel() < bytes) holder = at::empty({bytes}, slices_.on(at::kByte));
  return holder.narrow(0, 0, bytes).view(dtype);
}

}  // namespace ditrl::shard
