// Parameters by name across the shards: this rank's pieces, full loads and gathers.

#include <ditrl/error.hpp>
#include <ditrl/shard/pieces.hpp>

#include <ATen/ATen.h>
#include <fmt/ranges.h>

namespace ditrl::shard {

std::vector<ShardPiece> pieces(const Layout& layout, Slices& slices, int rank) {
  std::vector<ShardPiece> out;
  for (size_t u = 0; u < layout.units.size(); ++u) {
    for (size_t g = 0; g < layout.units[u].groups.size(); ++g) {
      const FlatGroup& group = layout.units[u].groups[g];
      GroupSlices& gs = slices.units[u][g];
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

void load_full(const Layout& layout, Slices& slices, int rank, const std::string& name, const at::Tensor& value) {
  const SlotRef ref = layout.find(name);
  const FlatGroup& group = layout.units[ref.unit].groups[ref.group];
  const Slot& slot = layout.slot(ref);
  if (value.sizes().vec() != slot.shape)
    fail("sharded parameters: loading '{}' with shape [{}] but the parameter has shape [{}]", name,
         fmt::join(value.sizes(), ", "), fmt::join(slot.shape, ", "));
  const auto range = group.owned_range(slot, rank);
  if (range.first == range.second) return;
  const at::Tensor part = value.detach().reshape(-1).narrow(0, range.first, range.second - range.first);
  GroupSlices& gs = slices.units[ref.unit][ref.group];
  if (group.trainable) {
    slot_part(gs.master, group, slot, rank, range).copy_(part);
    if (!gs.compute.is_same(gs.master))
      slot_part(gs.compute, group, slot, rank, range).copy_(slot_part(gs.master, group, slot, rank, range));
  } else {
    slot_part(gs.compute, group, slot, rank, range).copy_(part);
  }
}

at::Tensor gather_full(const Layout& layout, const Slices& slices, dist::Communicator& comm, const std::string& name) {
  const SlotRef ref = layout.find(name);
  const FlatGroup& group = layout.units[ref.unit].groups[ref.group];
  const Slot& slot = layout.slot(ref);
  const GroupSlices& gs = slices.units[ref.unit][ref.group];
  const at::Tensor& held = group.trainable ? gs.master : gs.compute;
  at::Tensor full = at::empty({group.shard * comm.size()}, held.options());
  comm.all_gather(held, full);
  return full.narrow(0, slot.offset, slot.numel).to(at::kFloat).view(slot.shape).clone();
}

void refresh_compute(Slices& slices) {
  for (auto& unit : slices.units)
    for (GroupSlices& gs : unit)
      if (gs.master.defined() && !gs.compute.is_same(gs.master)) gs.compute.copy_(gs.master);
}

}  // namespace ditrl::shard
