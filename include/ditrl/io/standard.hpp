#pragma once

// E2E standards: a recorded run's metric series (tests/standards/<name>.json)
// that later runs must reproduce. A metric without a tolerance entry must
// match bit for bit; a tolerance carries the reason it is needed and applies
// only where that reason holds: on a CPU whose kernel identity
// (cpu_kernel_identity) differs from the recording one. On the recording
// CPU every metric must match bit for bit.

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
  std::string cpu;   // the recording run's cpu_kernel_identity; empty: unknown (tolerances always apply)
  std::vector<int64_t> steps;
  std::map<std::string, std::vector<double>> metrics;
  std::map<std::string, Tolerance> tolerance;
};

// Metrics no standard records: wall-clock timings.
inline const std::vector<std::string> kUnrecordedPrefixes = {"perf/"};

// From a run's metrics; metrics whose name starts with an excluded prefix
// are left out.
Standard make_standard(const MetricsTable& run, const std::string& deck,
                       const std::vector<std::string>& excluded_prefixes = kUnrecordedPrefixes);
void write_standard(const std::string& path, const Standard& standard);
Standard read_standard(const std::string& path);

// OtherCpu: tolerances apply only when the run's CPU identity differs from
// the standard's (or either is unknown). Always: as on another CPU, to check
// that the tolerances still catch what they must.
enum class ToleranceMode { OtherCpu, Always };
bool tolerances_apply(const Standard& standard, const MetricsTable& run, ToleranceMode mode = ToleranceMode::OtherCpu);

// Every problem found: metrics missing from the run, metrics of the run the
// standard does not hold (other than the excluded prefixes: a new metric is
// re-recorded, never silently unchecked), length or step mismatches, values
// outside their tolerance (with the first offending step and both values).
std::vector<std::string> check_standard(const Standard& standard, const MetricsTable& run,
                                        ToleranceMode mode = ToleranceMode::OtherCpu,
                                        const std::vector<std::string>& excluded_prefixes = kUnrecordedPrefixes);

}  // namespace ditrl::io
