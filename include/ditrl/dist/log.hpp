#pragma once

// Logging: every line carries the rank; rank 0 writes to stdout, every rank
// writes OUT/logs/rank-<r>.log, and other ranks echo warnings and errors to
// stderr so a failing peer is visible in the job output.

#include <ditrl/dist/runtime.hpp>

#include <string>

namespace ditrl::dist {

// out_dir empty: console only (subcommands that write no run directory).
void setup_logging(const WorldInfo& world, const std::string& out_dir, const std::string& level = "info");

}  // namespace ditrl::dist
