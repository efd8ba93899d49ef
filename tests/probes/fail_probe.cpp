// Launched by the runtime test under mpiexec: the last rank throws while the
// others wait in a barrier. The job must end non-zero, naming the rank,
// instead of hanging.
#include <ditrl/dist/runtime.hpp>
#include <ditrl/error.hpp>

int main(int argc, char** argv) {
  try {
    ditrl::dist::MpiRuntime mpi(&argc, &argv);
    if (mpi.world().rank == mpi.world().size - 1) ditrl::fail("probe failure raised on purpose");
    MPI_Barrier(MPI_COMM_WORLD);
    return 0;
  } catch (const std::exception& e) {
    return ditrl::dist::report_fatal(e);
  }
}
