#pragma once

// Wall time for the timers of a run (phases, load, collectives, the
// watchdog): a monotonic clock, so a clock change never shows as time spent.

#include <chrono>

namespace ditrl {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace ditrl
