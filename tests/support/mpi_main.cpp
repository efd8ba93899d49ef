// Catch2 runner for multi-rank suites: every rank runs the same cases; a
// failure on any rank makes that rank, and so mpiexec, exit non-zero.
#define CATCH_CONFIG_RUNNER
#include <ditrl/dist/runtime.hpp>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  ditrl::dist::MpiRuntime mpi(&argc, &argv);
  Catch::Session session;
  if (int parse = session.applyCommandLine(argc, argv); parse != 0) return parse;
  const int failures = session.run();
  int any_failures = 0;
  MPI_Allreduce(&failures, &any_failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failures > 0 ? 1 : 0;
}
