#pragma once

// The process's place in the job and what it computes with.
// - MpiRuntime: MPI bootstrap (a single process works too: Open MPI starts as
//   a singleton); world and node-local ranks.
// - Runtime: built once per distributed subcommand by Runtime::create; owns
//   the MpiRuntime, the device every allocation goes to (dist/device.hpp), a
//   host communicator (MPI: scalars, control, stop flags) and a data
//   communicator (parameters, gradients, metric and reward tensors on the
//   device: MPI on CPU; NCCL on CUDA, or MPI through pinned host buffers,
//   [parallel] data_backend) with its sequence-parallel groups,
//   and the collective watchdog
//   (dist/watchdog.hpp) that every blocking collective runs under.

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/sequence_parallel.hpp>
#include <ditrl/error.hpp>

#include <c10/core/Device.h>
#include <mpi.h>

#include <exception>
#include <memory>
#include <string>

namespace ditrl::dist {

class Watchdog;  // dist/watchdog.hpp
class ExitDeadline;

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
  // Intra-op threads for this rank: the node's cores shared by its ranks,
  // at most the cores it is bound to.
  int default_threads() const;

  // True between MPI_Init and MPI_Finalize of this process.
  static bool active();

 private:
  WorldInfo world_;
  MPI_Comm node_comm_ = MPI_COMM_NULL;
};

// Which communicator moves device tensors ([parallel] data_backend). On the
// CPU it is always MPI; on CUDA, Auto is NCCL and Mpi stages each collective
// through pinned host buffers (make_host_staged_communicator), which lets
// several ranks share one GPU (docs/gpus-and-clusters.md).
enum class DataBackend { Auto, Nccl, Mpi };

// "auto" | "nccl" | "mpi".
const char* to_string(DataBackend backend);

struct RuntimeOptions {
  std::string device = "cpu";                    // [run] device: "auto" | "cpu" | "cuda"
  DataBackend data_backend = DataBackend::Auto;  // [parallel] data_backend
  bool deterministic = true;                     // [run] deterministic: fixed-order reductions on NCCL too
  double startup_timeout_s = 300;                // [parallel] startup_timeout_s
  double collective_timeout_s = 100;             // [parallel] collective_timeout_s
  int sequence_parallel = 1;                     // [parallel] sequence_parallel: ranks sharing one sample
};

class Runtime {
 public:
  // Collective over MPI_COMM_WORLD (it starts MPI when it is not up).
  static std::unique_ptr<Runtime> create(const RuntimeOptions& options);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const WorldInfo& world() const { return mpi_.world(); }
  const c10::Device& device() const { return device_; }
  const RuntimeOptions& options() const { return options_; }
  // The backend data() uses: Nccl or Mpi, never Auto.
  DataBackend data_backend() const { return data_backend_; }
  Communicator& host() { return *host_; }
  Communicator& data() { return *data_; }
  // The sequence-parallel groups over the data communicator
  // (dist/sequence_parallel.hpp); at sequence_parallel = 1 samples() is data().
  const SequenceGroups& sequence() const { return *sequence_; }
  // The communicator of collective file I/O (parallel HDF5): the world.
  MPI_Comm io_comm() const { return mpi_.comm(); }
  int default_threads() const { return mpi_.default_threads(); }

 private:
  explicit Runtime(const RuntimeOptions& options);
  std::unique_ptr<Communicator> make_data_communicator() const;

  // Covers MPI_Init and the watchdog's start, before the watchdog exists;
  // re-armed by ~Runtime for the teardown after it (MPI_Finalize waits for
  // every peer).
  std::unique_ptr<ExitDeadline> deadline_;
  MpiRuntime mpi_;
  RuntimeOptions options_;
  // Started before the communicators exist, stopped after they are gone.
  std::unique_ptr<Watchdog> watchdog_;
  c10::Device device_ = c10::kCPU;
  DataBackend data_backend_ = DataBackend::Mpi;
  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Communicator> data_;
  std::unique_ptr<SequenceGroups> sequence_;
};

// Raised by every rank at the same point with its own reason (the ranks
// agreed that one of them failed), so the job can end without MPI_Abort.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Reports an exception with the rank that raised it and ends the whole job:
// MPI_Abort when MPI is up with more than one rank (so no peer waits forever
// in a collective), otherwise returns the exit code to use.
int report_fatal(const std::exception& error);

}  // namespace ditrl::dist
