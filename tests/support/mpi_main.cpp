// Catch2 runner for multi-rank suites: every rank runs the same cases; a
// failure on any rank makes that rank, and so mpiexec, exit non-zero. The
// suites compare sharded results with in-process references bit for bit, so
// every rank first pins its CPU kernels exactly as deterministic `ditrl train`
// does (re-executing itself with them set), thread count included.
#define CATCH_CONFIG_RUNNER
#include <ditrl/app/determinism.hpp>
#include <ditrl/dist/runtime.hpp>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  ditrl::app::pin_cpu_kernels(1);
  ditrl::dist::MpiRuntime mpi(&argc, &argv);
  Catch::Session session;
  if (int parse = session.applyCommandLine(argc, argv); parse != 0) return parse;
  const int failures = session.run();
  int any_failures = 0;
  MPI_Allreduce(&failures, &any_failures, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any_failures > 0 ? 1 : 0;
}
