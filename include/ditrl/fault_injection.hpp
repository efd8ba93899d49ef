#pragma once

// Fault injection for the e2e and fault suites (tests/e2e, tests/faults): a
// test names the rank (and step) that misbehaves in an environment variable
// that a real run never sets. Each variable is documented where it is read.

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace ditrl {

// True when `variable` holds "rank:step" naming this rank and step.
inline bool fault_requested(const char* variable, int rank, int64_t step) {
  const char* spec = std::getenv(variable);
  int at_rank = -1;
  long long at_step = -1;
  return spec && std::sscanf(spec, "%d:%lld", &at_rank, &at_step) == 2 && at_rank == rank && at_step == step;
}

// True when `variable` holds this rank's number.
inline bool fault_requested(const char* variable, int rank) {
  const char* spec = std::getenv(variable);
  int at_rank = -1;
  return spec && std::sscanf(spec, "%d", &at_rank) == 1 && at_rank == rank;
}

}  // namespace ditrl
