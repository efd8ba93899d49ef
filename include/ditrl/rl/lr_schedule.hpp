#pragma once

// Learning rate per optimizer step (0-based): constant; linear warmup to the
// base rate; or linear warmup then cosine decay to zero at total_steps.

#include <cstdint>
#include <string>

namespace ditrl::rl {

struct LrSchedule {
  std::string kind = "constant";  // constant | warmup | cosine
  double base = 1e-4;
  int64_t warmup = 0;
  int64_t total_steps = 1;

  double at(int64_t step) const;
};

}  // namespace ditrl::rl
