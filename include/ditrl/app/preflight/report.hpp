#pragma once

// `ditrl preflight`'s report: each check's outcome on every rank, gathered on
// rank 0 and printed as text (and JSON), failures named by rank and host.

#include <ditrl/dist/runtime.hpp>

#include <mpi.h>

#include <string>
#include <vector>

namespace ditrl::app::preflight {

// One check as rank 0 reports it: PASS, FAIL or SKIPPED, a line of what was
// measured, and every rank's own line (a failing rank's names it).
struct Check {
  std::string name;
  std::string status;
  std::string summary;
  std::vector<std::string> failures;  // "rank R (HOST): why"
  std::vector<std::string> ranks;     // "rank R (HOST): what it saw"
};

// This rank's part of a check.
struct Local {
  bool passed = true;
  std::string text;
};

double max_over_ranks(double value, MPI_Comm comm);

class Report {
 public:
  Report(const dist::WorldInfo& world, MPI_Comm comm);

  // Collective: this rank's outcome joins the others' under `name`.
  void add(const std::string& name, const Local& mine, const std::string& summary);
  // A check that does not run here, and why (rank 0 decides for all).
  void skip(const std::string& name, const std::string& reason);
  // Collective: whether any check failed on any rank.
  bool failed() const;

  std::string text() const;
  std::string json() const;

 private:
  const dist::WorldInfo& world_;
  MPI_Comm comm_;
  std::vector<std::string> hosts_;
  std::vector<Check> checks_;
};

}  // namespace ditrl::app::preflight
