// A unit's gradients flattened per group, reduce-scattered and accumulated into the fp32 slices.

#include <ditrl/precision/dtype.hpp>
#include <ditrl/shard/grad_reduce.hpp>

#include <ATen/ATen.h>

#include <chrono>

namespace ditrl::shard {

void GradReducer::reduce(size_t unit, const std::vector<at::Tensor>& grads) {
  size_t k = 0;
  const std::vector<FlatGroup>& groups = layout_.units[unit].groups;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].trainable) continue;
    const int64_t padded = groups[g].shard * comm_.size();
    at::Tensor flat = scratch(flat_, padded, groups[g].reduce);
    for (const Slot& slot : groups[g].slots) {
      const at::Tensor& grad = grads.at(k++);
      at::Tensor part = flat.narrow(0, slot.offset, slot.numel);
      if (grad.defined())
        part.copy_(grad.reshape(-1));
      else
        part.zero_();
    }
    flat.narrow(0, groups[g].numel, padded - groups[g].numel).zero_();
    at::Tensor mine = scratch(mine_, groups[g].shard, groups[g].reduce);
    const auto start = std::chrono::steady_clock::now();
    comm_.reduce_scatter(flat, mine, dist::ReduceOp::Avg);
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    slices_.units[unit][g].grad.add_(mine);
  }
}

at::Tensor GradReducer::scratch(at::Tensor& holder, int64_t elements, c10::ScalarType dtype) const {
  const int64_t bytes = elements * precision::dtype_bytes(dtype);
  if (!holder.defined() || holder.numel() < bytes) holder = at::empty({bytes}, slices_.on(at::kByte));
  return holder.narrow(0, 0, bytes).view(dtype);
}

}  // namespace ditrl::shard
