#pragma once

// Before any weight is read: does the deck's predicted peak per rank
// (`ditrl plan`, app/memory_plan.hpp) fit the memory the rank can have? A
// deck that cannot fit fails here with the numbers and the knobs that move
// them, instead of an allocation failure or the kernel's OOM killer after
// loading, in a queue slot that took hours to get.

#include <ditrl/app/memory_plan.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/dist/runtime.hpp>

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ditrl::app {

// Memory this process's node can still give, and what said so.
struct MemoryBudget {
  int64_t bytes = 0;
  std::string source;
};

// The host: /proc/meminfo's MemAvailable, lowered to what the process's
// memory cgroup (Slurm's job limit; v2 memory.max, v1 memory.limit_in_bytes)
// has left. Empty when neither can be read.
std::optional<MemoryBudget> host_memory_budget();

// Fails when `plan.peak()` for each of the node's `local_ranks` ranks
// exceeds `budget` (on a GPU: `plan.device_peak()` against the device's
// free memory, one rank per device).
void check_plan_fits(const config::Config& c, const MemoryPlan& plan, const MemoryBudget& budget, int local_ranks,
                     bool device);

// The deck's plan at the world size, against this rank's host or GPU budget
// (skipped when run.check_memory = false or the budget is unknown).
void check_memory_fits(const config::Config& c, const dist::WorldInfo& world, c10::Device device);

}  // namespace ditrl::app
