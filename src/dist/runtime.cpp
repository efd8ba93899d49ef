#include <ditrl/dist/device.hpp>
#include <ditrl/dist/mpi_error.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>
#include <ditrl/fault_injection.hpp>

#ifdef DITRL_CUDA
#include <ditrl/dist/nccl_communicator.hpp>
#endif

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <sched.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <thread>
#include <vector>

namespace ditrl::dist {

namespace {

std::string hostname() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// Runs `step` on every rank and agrees on the outcome over `host`: when any
// rank failed, each one raises an AgreedError carrying its own reason, so
// every rank reports it and no rank is left waiting for a peer.
template <class Step>
auto on_every_rank(Communicator& host, Step step) -> decltype(step()) {
  std::string failure;
  std::optional<decltype(step())> result;
  try {
    result = step();
  } catch (const Error& e) {
    failure = e.what();
  }
  at::Tensor failed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
  host.all_reduce(failed, ReduceOp::Max);
  if (failed.item<int>() == 0) return std::move(*result);
  throw AgreedError(failure.empty() ? std::string("another rank failed at the same step (see its message)") : failure);
}

// Auto is NCCL on a GPU; NCCL has no CPU tensors.
DataBackend resolve_data_backend(DataBackend requested, const c10::Device& device) {
  if (device.is_cpu()) {
    if (requested == DataBackend::Nccl)
      fail(
          "parallel.data_backend = \"nccl\" needs a GPU, but this rank runs on the CPU (run.device); use \"auto\" or "
          "\"mpi\"");
    return DataBackend::Mpi;
  }
  return requested == DataBackend::Auto ? DataBackend::Nccl : requested;
}

}  // namespace

const char* to_string(DataBackend backend) {
  switch (backend) {
    case DataBackend::Auto:
      return "auto";
    case DataBackend::Nccl:
      return "nccl";
    case DataBackend::Mpi:
      return "mpi";
  }
  return "?";
}

LocalRankCheck check_local_rank(int local_rank_from_mpi) {
  LocalRankCheck check;
  check.from_mpi = local_rank_from_mpi;
  // The variable of the launcher that started this very process first:
  // under mpirun inside a Slurm allocation every rank inherits SLURM_LOCALID
  // from the srun step that started its node's orted (0 for all of them),
  // while OMPI_COMM_WORLD_LOCAL_RANK (mpirun) or MPI_LOCALRANKID (Hydra) is
  // its own. srun's direct launch sets SLURM_LOCALID alone.
  for (const char* variable : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* value = std::getenv(variable);
    if (!value || !*value) continue;
    check.launcher_variable = variable;
    check.from_launcher = std::atoi(value);
    break;
  }
  if (check.from_launcher >= 0 && check.from_launcher != check.from_mpi)
    check.warning = fmt::format(
        "node-local rank {} from MPI_Comm_split_type differs from {}={}; using the MPI value "
        "(the launcher orders ranks differently on this node)",
        check.from_mpi, check.launcher_variable, check.from_launcher);
  return check;
}

MpiRuntime::MpiRuntime(int* argc, char*** argv) {
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
  // Errors come back as codes and become exceptions that end in MPI_Abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_.rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_.size), "MPI_Comm_size");
  check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_.rank, MPI_INFO_NULL, &node_comm_),
            "MPI_Comm_split_type");
  check_mpi(MPI_Comm_rank(node_comm_, &world_.local_rank), "MPI_Comm_rank(node)");
  check_mpi(MPI_Comm_size(node_comm_, &world_.local_size), "MPI_Comm_size(node)");
  world_.host = hostname();
  if (provided < MPI_THREAD_MULTIPLE && world_.rank == 0)
    spdlog::warn("MPI provides thread level {} < MPI_THREAD_MULTIPLE; prefetch runs on the main thread", provided);
}

MpiRuntime::~MpiRuntime() {
  // While an exception unwinds, peers may be blocked in a collective:
  // finalizing here would hang them, so report_fatal() aborts the job instead.
  if (std::uncaught_exceptions() > 0) return;
  if (node_comm_ != MPI_COMM_NULL) MPI_Comm_free(&node_comm_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

namespace {
// The cores this process may run on. A launcher that binds ranks leaves it
// fewer than the node has: mpirun binds each of up to two ranks to one core,
// Slurm to its --cpus-per-task.
int allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}
}  // namespace

int MpiRuntime::default_threads() const {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int node_share = static_cast<int>(cores) / std::max(1, world_.local_size);
  return std::max(1, std::min(node_share, allowed_cores()));
}

bool MpiRuntime::active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

Runtime::Runtime(const RuntimeOptions& options)
    : deadline_(std::make_unique<ExitDeadline>(
          options.startup_timeout_s,
          fmt::format("MPI start-up did not finish within {:g} s ([parallel] startup_timeout_s): a peer is stopped, "
                      "hung or dead before the watchdog could start; exiting",
                      options.startup_timeout_s))),
      mpi_(nullptr, nullptr),
      options_(options) {
  WatchdogOptions watch;
  watch.startup_timeout_s = options_.startup_timeout_s;
  watch.collective_timeout_s = options_.collective_timeout_s;
  watchdog_ = std::make_unique<Watchdog>(mpi_.comm(), watch);
  deadline_->disarm();
  host_ = make_mpi_communicator(mpi_.comm(), "host");
  device_ = on_every_rank(*host_, [&] { return choose_device(options_.device, world()); });
  data_backend_ = on_every_rank(*host_, [&] { return resolve_data_backend(options_.data_backend, device_); });
  data_ = on_every_rank(*host_, [&] { return make_data_communicator(); });
  sequence_ =
      on_every_rank(*host_, [&] { return std::make_unique<SequenceGroups>(*data_, options_.sequence_parallel); });
}

std::unique_ptr<Communicator> Runtime::make_data_communicator() const {
  if (device_.is_cpu()) return make_mpi_communicator(mpi_.comm(), "data");
  if (data_backend_ == DataBackend::Mpi)
    return make_host_staged_communicator(make_mpi_communicator(mpi_.comm(), "data"));
#ifdef DITRL_CUDA
  NcclOptions nccl;
  nccl.device = device_.index();
  nccl.startup_timeout_s = options_.startup_timeout_s;
  nccl.collective_timeout_s = options_.collective_timeout_s;
  nccl.deterministic = options_.deterministic;
  return make_nccl_communicator(mpi_.comm(), nccl);
#else
  fail("device {} needs a CUDA build of ditrl", device_.str());
#endif
}

Runtime::~Runtime() {
  if (std::uncaught_exceptions() > 0) return;  // no MPI_Finalize then (MpiRuntime)
  // A rank stopped before the teardown (tests/faults): the others' deadline below ends them.
  if (fault_requested("DITRL_TEST_STOP_BEFORE_FINALIZE", world().rank)) std::raise(SIGSTOP);
  deadline_ = std::make_unique<ExitDeadline>(
      options_.collective_timeout_s,
      fmt::format("MPI_Finalize did not finish within {:g} s ([parallel] collective_timeout_s): a peer is stopped, "
                  "hung or dead; this rank's work is complete; exiting",
                  options_.collective_timeout_s));
}

std::unique_ptr<Runtime> Runtime::create(const RuntimeOptions& options) {
  return std::unique_ptr<Runtime>(new Runtime(options));
}

int report_fatal(const std::exception& error) {
  int rank = 0, size = 1;
  const bool mpi = MpiRuntime::active();
  if (mpi) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  const std::string message =
      size > 1 ? fmt::format("error on rank {}: {}", rank, error.what()) : fmt::format("error: {}", error.what());
  // Once on the console, on stderr directly (the logger may be the thing that
  // failed), and into the rank's log file when it has one: the logger's
  // console sinks would print it a second time.
  std::cerr << "ditrl: " << message << std::endl;
  if (auto logger = spdlog::default_logger()) {
    std::vector<spdlog::sink_ptr> files;
    for (const spdlog::sink_ptr& sink : logger->sinks())
      if (std::dynamic_pointer_cast<spdlog::sinks::basic_file_sink_mt>(sink)) files.push_back(sink);
    spdlog::logger file_only("ditrl", files.begin(), files.end());
    file_only.error(message);
    file_only.flush();
  }
  // Agreed errors are raised by every rank, which all end here by themselves.
  const bool agreed = dynamic_cast<const AgreedError*>(&error) != nullptr;
  if (mpi && size > 1 && !agreed) MPI_Abort(MPI_COMM_WORLD, 1);
  // Not MPI_Finalize after an agreed error: it runs HDF5's shutdown, which
  // crashes on a file whose close failed (a full disk). Every rank exits here.
  if (mpi && agreed) {
    std::cerr.flush();
    std::fflush(nullptr);
    _exit(1);
  }
  if (mpi) MPI_Finalize();
  return 1;
}

}  // namespace ditrl::dist
