#pragma once

// Logging: every line carries the rank; rank 0 writes to stdout, every rank
// writes OUT/logs/rank-<r>.log, and other ranks echo warnings and errors to
// stderr so a failing peer is visible in the job output.

#include <ditrl/dist/runtime.hpp>

#include <string>

namespace ditrl::dist {

// out_dir empty: console only (subcommands that write no run directory).
void setup_logging(const WorldInfo& world, const std::string& out_dir, const std::string& level = "info");

// Where this rank runs, one line in its log: host, node-local rank and size
// (with the launcher's SLURM_LOCALID / OMPI_COMM_WORLD_LOCAL_RANK next to
// MPI's, a warning when they disagree), intra-op threads and device; rank 0
// adds the job's layout (ranks per host). Collective over `comm`: multi-node
// jobs and tests/multinode read placement from these lines.
void log_placement(const WorldInfo& world, int threads, const std::string& device, MPI_Comm comm);

// This process's resident set now and its peak so far (/proc/self/status
// VmRSS and VmHWM; the RSS split into RssAnon, the heap, and RssFile, the
// libraries' pages) as "RSS 1.23 GB (anonymous 1.02, files 0.21), peak
// 2.34 GB" (10^9 bytes), for the [load] and [memory] lines that split a
// run's peak by phase.
std::string memory_text();

}  // namespace ditrl::dist
