#pragma once

// Helpers for the end-to-end suites: run `ditrl` as a real MPI job on a deck
// from tests/e2e/decks and read what it wrote.

#include <ditrl/io/metrics.hpp>
#include <ditrl/io/standard.hpp>

#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "process.hpp"

namespace ditrl::test {

inline std::string e2e_deck(const std::string& name) {
  return std::string(DITRL_SOURCE_DIR) + "/tests/e2e/decks/" + name;
}

// `mpiexec -np N ditrl train DECK --set run.out_dir=OUT <args>`, bounded by a timeout.
inline ProcessResult train(const std::string& deck, const std::string& out_dir, int ranks, const std::string& args = "",
                           const std::string& env = "") {
  return run_process(fmt::format("{} timeout 600 {} -np {} {} train {} --set run.out_dir={} {}", env, DITRL_MPIEXEC,
                                 ranks, DITRL_BINARY, deck, out_dir, args));
}

inline ProcessResult ditrl(const std::string& args) {
  return run_process(std::string(DITRL_BINARY) + " " + args);
}

inline io::MetricsTable metrics_of(const std::string& out_dir) {
  return io::read_metrics(out_dir + "/metrics.h5");
}

// The metrics (perf/* aside) in which run `other` differs from run
// `reference` by a bit, one per line; "" when none does.
inline std::string differing_metrics(const std::string& reference, const std::string& other) {
  std::string listed;
  for (const std::string& d : io::check_standard(io::make_standard(metrics_of(reference), ""), metrics_of(other)))
    listed += d + "\n";
  return listed;
}

// tests/gpu/h5_equal.py on two checkpoints' /model and /optimizer: exit 0
// when bitwise equal (h5diff, which the e2e suites use, is not in the GPU kit).
inline ProcessResult h5_equal(const std::string& a, const std::string& b) {
  return run_process(
      fmt::format("{} {}/tests/gpu/h5_equal.py {} {} /model /optimizer", DITRL_PYTHON, DITRL_SOURCE_DIR, a, b));
}

// A file the job wrote (status, latest, job.log) as text; "" when it is absent.
inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace ditrl::test
