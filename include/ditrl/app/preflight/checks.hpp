#pragma once

// The checks `ditrl preflight` runs on every rank, in the order it reports
// them (docs/gpus-and-clusters.md, "Preflight"). Each is collective over the ranks.

#include <ditrl/app/memory_plan.hpp>
#include <ditrl/app/preflight/report.hpp>
#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace ditrl::app::preflight {

// Where this rank runs; fails when its local rank is not what the launcher promised.
Local placement(const dist::Runtime& runtime);

// Every collective at `m` fp32 elements per rank: bitwise against the
// canonical result (within a bound for NCCL's fast sums, from `fast_comm`
// where there is one), then `iterations` timed calls as bus bandwidth.
void check_collectives(Report& report, dist::Runtime& runtime, dist::Communicator* fast_comm, int64_t m,
                       int iterations);

// A stand-in sharded training step at `m` elements per shard, run on the
// data backend and on a second one, compared bitwise.
void check_step(Report& report, dist::Runtime& runtime, int64_t m);

// `ditrl plan`'s peak per rank against the memory each rank has.
void check_memory(Report& report, const dist::Runtime& runtime, const std::optional<MemoryPlan>& plan);

// `mib` MiB written and fsynced into out_dir by this rank.
Local disk_speed(const std::string& out_dir, int rank, int64_t mib);

}  // namespace ditrl::app::preflight
