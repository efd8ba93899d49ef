#pragma once

// What `ditrl plan DECK` prints: per parameter its unit, shape, the range of
// its flattened elements one rank owns, master / compute / reduce dtype, the
// precision rule that set the compute dtype and the bytes that range costs
// the rank; then the per-rank byte budget and totals. Computed from the
// layout alone, so a model on the meta device (no weights) will do.

#include <ditrl/shard/layout.hpp>

#include <string>
#include <vector>

namespace ditrl::shard {

struct PlanRow {
  std::string name;  // canonical
  std::string unit;
  std::vector<int64_t> shape;
  int64_t begin = 0;  // [begin, end) owned by the report's rank
  int64_t end = 0;
  bool trainable = true;
  std::string master, compute, reduce;  // dtype names
  std::string rule;
  int64_t bytes = 0;  // the rank's master + moments + gradient + compute bytes for [begin, end)
};

struct PlanReport {
  int world_size = 1;
  int rank = 0;
  std::vector<PlanRow> rows;
  MemoryReport per_rank;   // equal on every rank (the layout pads to the world size)
  int64_t parameters = 0;  // elements, all units
  int64_t trainable = 0;
  size_t wrap_units = 0;

  std::string table() const;
};

PlanReport plan_report(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                       const precision::CompiledPlan& plan, int world_size, int rank = 0, bool prefetch = true,
                       bool reshard_after_forward = true);

}  // namespace ditrl::shard
