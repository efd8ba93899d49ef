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

// What one rank may use, and where that figure came from.
struct MemoryShare {
  int64_t bytes = 0;
  std::string description;
};

// Fails when the plan's predicted peak per rank (`plan.device_peak()` on a
// GPU, else `plan.peak()`) exceeds `share`.
void check_plan_fits(const config::Config& c, const MemoryPlan& plan, const MemoryShare& share, bool device);

// The deck's plan at the world size against the smallest share any rank has:
// its node's host budget over the node's ranks, or its GPU's free memory.
// Every rank reads its budget before any rank loads, and all decide on the
// same figure. Skipped when run.check_memory = false or no budget is known.
void check_memory_fits(const config::Config& c, dist::Runtime& runtime);

}  // namespace ditrl::app
