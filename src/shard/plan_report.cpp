#include <ditrl/error.hpp>
#include <ditrl/shard/plan_report.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ditrl::shard {

namespace {

std::string bytes_text(int64_t bytes) {
  return fmt::format("{:.2f} MiB ({} B)", static_cast<double>(bytes) / (1 << 20), bytes);
}

// Bytes of `count` elements of a group on one rank (layout.hpp's MemoryReport rules).
int64_t range_bytes(const FlatGroup& g, int64_t count) {
  const int64_t compute = g.compute != g.master || !g.trainable ? precision::dtype_bytes(g.compute) : 0;
  const int64_t state = g.trainable ? precision::dtype_bytes(g.master) + 3 * 4 : 0;
  return count * (state + compute);
}

}  // namespace

PlanReport plan_report(torch::nn::Module& model, const std::vector<models::WrapUnit>& units,
                       const precision::CompiledPlan& plan, int world_size, int rank, bool prefetch,
                       bool reshard_after_forward) {
  if (rank < 0 || rank >= world_size) fail("plan report: rank {} outside [0, {})", rank, world_size);
  const Layout layout = build_layout(model, units, plan, world_size);
  PlanReport report;
  report.world_size = world_size;
  report.rank = rank;
  report.wrap_units = units.size();
  report.per_rank = layout.memory(prefetch, reshard_after_forward);
  for (const UnitLayout& unit : layout.units) {
    for (const FlatGroup& g : unit.groups) {
      for (const Slot& slot : g.slots) {
        const auto [begin, end] = g.owned_range(slot, rank);
        report.rows.push_back({slot.name, unit.name, slot.shape, begin, end, g.trainable,
                               g.trainable ? precision::dtype_name(g.master) : "-", precision::dtype_name(g.compute),
                               g.trainable ? precision::dtype_name(g.reduce) : "-", slot.rule,
                               range_bytes(g, end - begin)});
        report.parameters += slot.numel;
        if (g.trainable) report.trainable += slot.numel;
      }
    }
  }
  return report;
}

std::string PlanReport::table() const {
  std::vector<std::vector<std::string>> cells{{"parameter", "unit", "shape", fmt::format("rank {} range", rank),
                                               "master", "compute", "reduce", "rule", "bytes"}};
  for (const PlanRow& row : rows)
    cells.push_back({row.name + (row.trainable ? "" : " (frozen)"), row.unit,
                     fmt::format("[{}]", fmt::join(row.shape, ", ")),
                     row.begin == row.end ? "-" : fmt::format("[{}, {})", row.begin, row.end), row.master, row.compute,
                     row.reduce, row.rule, std::to_string(row.bytes)});
  std::vector<size_t> width(cells[0].size(), 0);
  for (const auto& line : cells)
    for (size_t c = 0; c < line.size(); ++c) width[c] = std::max(width[c], line[c].size());
  std::string out;
  for (const auto& line : cells) {
    for (size_t c = 0; c < line.size(); ++c)
      out += fmt::format("{:<{}}{}", line[c], width[c], c + 1 < line.size() ? "  " : "\n");
  }
  out += fmt::format("\n{} parameters in {} wrap units + root: {} elements, {} trainable, {} frozen\n", rows.size(),
                     wrap_units, parameters, trainable, parameters - trainable);
  out += fmt::format("bytes per rank (world size {}, equal on every rank):\n", world_size);
  out += fmt::format("  masters        {}\n", bytes_text(per_rank.masters));
  out += fmt::format("  moments        {}\n", bytes_text(per_rank.moments));
  out += fmt::format("  grads          {}\n", bytes_text(per_rank.grads));
  out += fmt::format("  compute shard  {}\n", bytes_text(per_rank.compute));
  out += fmt::format("  peak gathered  {}\n", bytes_text(per_rank.peak_gathered));
  out += fmt::format("  total          {}\n", bytes_text(per_rank.total()));
  out += fmt::format("total over {} ranks: {}\n", world_size, bytes_text(per_rank.total() * world_size));
  return out;
}

}  // namespace ditrl::shard
