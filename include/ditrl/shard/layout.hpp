#pragma once

// Where every parameter lives when a model is sharded over N ranks
// (docs/design.md §3). Each wrap unit, and the root unit (every parameter in no
// wrap unit), splits its parameters into flat groups of one kind (compute /
// master / reduce dtype, trainable or frozen); a group concatenates its
// parameters' flattened elements (a trainable group in module order, a
// frozen one by name: the weights files' order, so that a rank's part of it
// can be mapped from the file), pads to a multiple of N and rank r owns
// elements [r * shard, (r + 1) * shard). The sharded-parameter
// manager and `ditrl plan` both read this layout.

#include <ditrl/models/unit.hpp>
#include <ditrl/precision/plan.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ditrl::shard {

struct Slot {
  std::string name;  // canonical name
  at::Tensor param;  // the module's parameter (the manager swaps its data)
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;  // first element in the group's flat buffer
  std::string rule;    // the precision rule that set its compute dtype
};

struct FlatGroup {
  c10::ScalarType compute = c10::ScalarType::Float;
  c10::ScalarType master = c10::ScalarType::Float;
  c10::ScalarType reduce = c10::ScalarType::Float;
  bool trainable = true;  // false: frozen (LoRA base), compute shard only
  std::vector<Slot> slots;
  int64_t numel = 0;  // sum of the slots' elements
  int64_t shard = 0;  // elements per rank: numel padded to shard * world_size

  int64_t gathered_bytes(int world_size) const;
  // [begin, end) of the slot's flattened elements that `rank` owns; begin == end
  // when it owns none of them.
  std::pair<int64_t, int64_t> owned_range(const Slot& slot, int rank) const;
};

struct UnitLayout {
  std::string name;  // module path, or "(root)"
  std::vector<FlatGroup> groups;

  bool trainable() const;
  int64_t gathered_bytes(int world_size) const;
};

// Bytes one rank holds (docs/design.md §3): fp32 master, two fp32 AdamW moments
// and an fp32 gradient slice per trainable element (16 bytes), a compute
// slice where its dtype differs from the master's (frozen parameters: their
// only state; an fp32 compute slice of an fp32 master is the master itself),
// and the gathered units: the root unit, resident for a whole step, plus the
// running unit and the prefetched next one.
struct MemoryReport {
  int64_t masters = 0;
  int64_t moments = 0;
  int64_t grads = 0;
  int64_t compute = 0;
  int64_t peak_gathered = 0;

  int64_t total() const { return masters + moments + grads + compute + peak_gathered; }
};

struct SlotRef {
  size_t unit = 0;
  size_t group = 0;
  size_t slot = 0;
};

struct Layout {
  int world_size = 1;
  std::vector<UnitLayout> units;  // the wrap units in order, then the root unit

  size_t root_index() const { return units.size() - 1; }
  // Where a parameter (canonical or PEFT name) is; throws naming it.
  SlotRef find(const std::string& name) const;
  const Slot& slot(const SlotRef& ref) const { return units[ref.unit].groups[ref.group].slots[ref.slot]; }
  // Per rank, from the shapes and dtypes alone. peak_gathered is the root
  // plus the two largest wrap units (one without prefetch, which needs more
  // than one rank; all of them when units stay gathered from forward to
  // backward): exact for equal blocks, an upper bound otherwise; none on one
  // rank, whose units run on its compute slices in place.
  MemoryReport memory(bool prefetch = true, bool reshard_after_forward = true) const;
};

Layout build_layout(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                    const precision::CompiledPlan& plan, int world_size);

}  // namespace ditrl::shard
