// A rank's slices of the flat groups, taken from a module's parameters.

#include <ditrl/error.hpp>
#include <ditrl/shard/slices.hpp>

#include <ATen/ATen.h>

namespace ditrl::shard {

at::TensorOptions Slices::on(c10::ScalarType dtype) const {
  return at::TensorOptions().dtype(dtype).device(device);
}

at::Tensor slot_part(const at::Tensor& shard_tensor, const FlatGroup& group, const Slot& slot, int rank,
                     std::pair<int64_t, int64_t> range) {
  return shard_tensor.narrow(0, slot.offset + range.first - rank * group.shard, range.second - range.first);
}

at::Tensor placeholder(c10::ScalarType dtype, c10::Device device) {
  return at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
}

Slices take_slices(const Layout& layout, int rank, c10::Device device) {
  Slices slices;
  slices.device = device;
  for (const UnitLayout& unit : layout.units) {
    std::vector<GroupSlices>& groups = slices.units.emplace_back();
    for (const FlatGroup& g : unit.groups) {
      GroupSlices& gs = groups.emplace_back();
      const c10::ScalarType held = g.trainable ? g.master : g.compute;
      at::Tensor values = at::zeros({g.shard}, slices.on(held));
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
        gs.exp_avg = at::zeros({g.shard}, slices.on(at::kFloat));
        gs.exp_avg_sq = at::zeros({g.shard}, slices.on(at::kFloat));
        gs.grad = at::zeros({g.shard}, slices.on(at::kFloat));
        gs.compute = g.compute == g.master ? gs.master : gs.master.to(g.compute);
      } else {
        gs.compute = values;
      }
      for (const Slot& slot : g.slots) slot.param.set_data(placeholder(g.compute, device));
    }
  }
  return slices;
}

}  // namespace ditrl::shard
