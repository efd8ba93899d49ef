#include <ditrl/error.hpp>
#include <ditrl/rl/lr_schedule.hpp>

#include <algorithm>
#include <cmath>

namespace ditrl::rl {

double LrSchedule::at(int64_t step) const {
  if (kind == "constant") return base;
  const double warm = warmup > 0 ? std::min(1.0, static_cast<double>(step + 1) / static_cast<double>(warmup)) : 1.0;
  if (kind == "warmup") return base * warm;
  if (kind == "cosine") {
    if (step < warmup) return base * warm;
    const double span = std::max<int64_t>(1, total_steps - warmup);
    const double progress = std::min(1.0, static_cast<double>(step - warmup) / span);
    return base * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  fail("unknown lr_schedule '{}': expected constant, warmup or cosine", kind);
}

}  // namespace ditrl::rl
