#include <ditrl/error.hpp>
#include <ditrl/precision/names.hpp>
#include <ditrl/shard/layout.hpp>

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace ditrl::shard {

namespace {

bool same_kind(const FlatGroup& g, const precision::ParamPrecision& p, bool trainable) {
  return g.compute == p.compute && g.master == p.master && g.reduce == p.reduce && g.trainable == trainable;
}

// A frozen group's slots in name order, the order weights files store
// tensors in (by name within a dtype): a rank's range of the group is then one
// run of the file wherever the group's tensors lie in one file, and can be
// mapped instead of read (shard/slices.cpp). Nothing trains a frozen group,
// so its order reaches no gradient, reduction or optimizer step.
void order_by_name(FlatGroup& g) {
  std::stable_sort(g.slots.begin(), g.slots.end(), [](const Slot& a, const Slot& b) { return a.name < b.name; });
  int64_t offset = 0;
  for (Slot& slot : g.slots) {
    slot.offset = offset;
    offset += slot.numel;
  }
}

}  // namespace

int64_t FlatGroup::gathered_bytes(int world_size) const {
  return shard * world_size * precision::dtype_bytes(compute);
}

std::pair<int64_t, int64_t> FlatGroup::owned_range(const Slot& slot, int rank) const {
  const int64_t lo = std::max(rank * shard, slot.offset);
  const int64_t hi = std::min((rank + 1) * shard, slot.offset + slot.numel);
  if (lo >= hi) return {0, 0};
  return {lo - slot.offset, hi - slot.offset};
}

bool UnitLayout::trainable() const {
  return std::any_of(groups.begin(), groups.end(), [](const FlatGroup& g) { return g.trainable; });
}

int64_t UnitLayout::gathered_bytes(int world_size) const {
  int64_t bytes = 0;
  for (const FlatGroup& g : groups) bytes += g.gathered_bytes(world_size);
  return bytes;
}

SlotRef Layout::find(const std::string& name) const {
  const std::string canonical = precision::canonical_name(name);
  for (size_t u = 0; u < units.size(); ++u)
    for (size_t g = 0; g < units[u].groups.size(); ++g)
      for (size_t s = 0; s < units[u].groups[g].slots.size(); ++s)
        if (units[u].groups[g].slots[s].name == canonical) return {u, g, s};
  fail("sharded parameters: no parameter '{}' (canonical '{}')", name, canonical);
}

MemoryReport Layout::memory(bool prefetch, bool reshard_after_forward) const {
  MemoryReport report;
  std::vector<int64_t> wrap_gathered;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const FlatGroup& g : units[u].groups) {
      const int64_t compute_bytes = g.shard * precision::dtype_bytes(g.compute);
      if (g.trainable) {
        report.masters += g.shard * precision::dtype_bytes(g.master);
        report.moments += 2 * g.shard * 4;
        report.grads += g.shard * 4;
        if (g.compute != g.master) report.compute += compute_bytes;
      } else {
        report.compute += compute_bytes;
      }
    }
    if (u != root_index()) wrap_gathered.push_back(units[u].gathered_bytes(world_size));
  }
  if (world_size == 1) return report;  // units run on the compute slices in place (shard/gather.hpp)
  std::sort(wrap_gathered.begin(), wrap_gathered.end(), std::greater<>());
  const size_t live = reshard_after_forward ? (prefetch && world_size > 1 ? 2 : 1) : wrap_gathered.size();
  report.peak_gathered = units[root_index()].gathered_bytes(world_size);
  for (size_t i = 0; i < std::min(live, wrap_gathered.size()); ++i) report.peak_gathered += wrap_gathered[i];
  return report;
}

Layout build_layout(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                    const precision::CompiledPlan& plan, int world_size) {
  if (world_size < 1) fail("sharded parameters: world size must be >= 1 (got {})", world_size);
  std::unordered_map<const c10::TensorImpl*, size_t> owner;
  std::vector<size_t> expected(units.size(), 0), found(units.size(), 0);
  for (size_t u = 0; u < units.size(); ++u) {
    if (!units[u].module) fail("wrap unit '{}' has no module", units[u].name);
    for (const at::Tensor& p : units[u].module->parameters()) {
      const auto [it, fresh] = owner.emplace(p.unsafeGetTensorImpl(), u);
      if (!fresh)
        fail("wrap units '{}' and '{}' share a parameter; a parameter belongs to one unit", units[it->second].name,
             units[u].name);
      ++expected[u];
    }
  }

  Layout layout;
  layout.world_size = world_size;
  for (const models::WrapUnit& unit : units) layout.units.push_back({unit.name, {}});
  layout.units.push_back({"(root)", {}});

  std::unordered_map<const c10::TensorImpl*, std::string> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (const auto [it, fresh] = seen.emplace(p.unsafeGetTensorImpl(), item.key()); !fresh)
      fail("parameters '{}' and '{}' are the same tensor; tied parameters cannot be sharded", it->second, item.key());
    const auto in_unit = owner.find(p.unsafeGetTensorImpl());
    const size_t u = in_unit == owner.end() ? layout.root_index() : in_unit->second;
    if (in_unit != owner.end()) ++found[u];
    const precision::ParamPrecision& precision = plan.at(item.key());
    std::vector<FlatGroup>& groups = layout.units[u].groups;
    auto group = std::find_if(groups.begin(), groups.end(),
                              [&](const FlatGroup& g) { return same_kind(g, precision, p.requires_grad()); });
    if (group == groups.end()) {
      groups.push_back({precision.compute, precision.master, precision.reduce, p.requires_grad(), {}, 0, 0});
      group = groups.end() - 1;
    }
    group->slots.push_back(
        {precision::canonical_name(item.key()), p, p.sizes().vec(), p.numel(), group->numel, precision.rule});
    group->numel += p.numel();
  }
  for (size_t u = 0; u < units.size(); ++u)
    if (found[u] != expected[u])
      fail("wrap unit '{}' has {} parameters but only {} of them are parameters of the model", units[u].name,
           expected[u], found[u]);
  for (UnitLayout& unit : layout.units)
    for (FlatGroup& g : unit.groups) {
      if (!g.trainable) order_by_name(g);
      g.shard = (g.numel + world_size - 1) / world_size;
    }
  return layout;
}

}  // namespace ditrl::shard
