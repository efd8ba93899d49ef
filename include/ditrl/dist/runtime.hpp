#pragma once

// MPI process bootstrap: one MpiRuntime per process, created by the
// subcommands that run distributed work (a single process works too: Open MPI
// starts as a singleton). It knows the world and node-local ranks, which pick
// the GPU on CUDA builds and the thread count on CPU.

#include <mpi.h>

#include <exception>
#include <string>

namespace ditrl::dist {

struct WorldInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes sharing this node
  int local_size = 1;  // processes on this node
  std::string host;
};

// Node-local rank from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); the
// launcher's view (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, else
// SLURM_LOCALID: the first one set) is compared with it and a disagreement
// is reported in `warning`.
struct LocalRankCheck {
  int from_mpi = 0;
  int from_launcher = -1;  // -1 when no launcher variable is set
  std::string launcher_variable;
  std::string warning;
};
LocalRankCheck check_local_rank(int local_rank_from_mpi);

class MpiRuntime {
 public:
  MpiRuntime(int* argc, char*** argv);
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  const WorldInfo& world() const { return world_; }
  MPI_Comm comm() const { return MPI_COMM_WORLD; }
  // Intra-op threads for this rank: the node's cores shared by its ranks.
  int default_threads() const;

  // True between MPI_Init and MPI_Finalize of this process.
  static bool active();

 private:
  WorldInfo world_;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
};

// Reports an exception with the rank that raised it and ends the whole job:
// MPI_Abort when MPI is up with more than one rank (so no peer waits forever
// in a collective), otherwise returns the exit code to use.
int report_fatal(const std::exception& error);

}  // namespace ditrl::dist
