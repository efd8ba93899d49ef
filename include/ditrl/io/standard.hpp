#pragma once

// E2E standards: a recorded run's metric series (tests/standards/<name>.json)
// that later runs must reproduce. A metric without a tolerance entry must
// match bit for bit; a tolerance carries the reason it is needed.

#include <ditrl/io/metrics.hpp>

#include <map>
#include <string>
#include <vector>

namespace ditrl::io {

struct Tolerance {
  double abs = 0.0;
  double rel = 0.0;
  std::string reason;
};

struct Standard {
  std::string deck;  // the effective deck of the recorded run
  std::vector<int64_t> steps;
  std::map<std::string, std::vector<double>> metrics;
  std::map<std::string, Tolerance> tolerance;
};

// From a run's metrics; metrics whose name starts with an excluded prefix
// (wall-clock timings) are left out.
Standard make_standard(const MetricsTable& run, const std::string& deck,
                       const std::vector<std::string>& excluded_prefixes = {"perf/"});
void write_standard(const std::string& path, const Standard& standard);
Standard read_standard(const std::string& path);

// Every problem found: missing metrics, length or step mismatches, values
// outside their tolerance (with the first offending step and both values).
std::vector<std::string> check_standard(const Standard& standard, const MetricsTable& run);

}  // namespace ditrl::io
