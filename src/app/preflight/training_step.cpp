// One stand-in training step on two data backends, compared bitwise.

#include <ditrl/app/preflight/checks.hpp>
#include <ditrl/app/preflight/draws.hpp>
#include <ditrl/dist/device.hpp>

#ifdef DITRL_CUDA
#include <ditrl/dist/nccl_communicator.hpp>
#endif

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <memory>
#include <string>

namespace ditrl::app::preflight {

namespace {

// The shape of ditrl's sharded step at the deck's shard size: gather the
// parameters, compute each rank's gradient from its own data, reduce-scatter
// the average, update the shard with an AdamW-like rule; twice. Returns the
// rank's shard after the steps (on the CPU).
at::Tensor stand_in_step(dist::Communicator& comm, c10::Device device, int64_t m) {
  const int n = comm.size(), r = comm.rank();
  at::Tensor shard = chunk(r, 0, 10, m).to(device);
  at::Tensor moment = at::zeros_like(shard);
  const at::Tensor data = chunk(r, 0, 11, n * m).to(device);
  for (int step = 0; step < 2; ++step) {
    at::Tensor full = at::empty({n * m}, shard.options());
    comm.all_gather(shard, full);
    const at::Tensor grad = at::tanh(full * data) * data;
    at::Tensor grad_shard = at::empty({m}, shard.options());
    comm.reduce_scatter(grad, grad_shard, dist::ReduceOp::Avg);
    moment.mul_(0.9).add_(grad_shard * grad_shard, 0.1);
    shard.sub_(grad_shard / (moment.sqrt() + 1e-8), 1e-3);
  }
  return shard.cpu();
}

}  // namespace

void check_step(Report& report, dist::Runtime& runtime, int64_t m) {
  const std::string name = "training step (stand-in)";
  std::unique_ptr<dist::Communicator> other;
  std::string pair;
  if (runtime.device().is_cpu()) {
    other = dist::make_host_staged_communicator(dist::make_mpi_communicator(runtime.io_comm(), "preflight-staged"),
                                                /*stage_cpu_tensors=*/true);
    pair = "MPI vs host-staged MPI";
  } else if (runtime.data_backend() == dist::DataBackend::Nccl) {
    other = dist::make_host_staged_communicator(dist::make_mpi_communicator(runtime.io_comm(), "preflight-staged"));
    pair = "NCCL (deterministic) vs host-staged MPI";
  } else {
#ifdef DITRL_CUDA
    const int own_gpu = runtime.world().local_size <= dist::visible_gpus();
    int every = own_gpu;
    MPI_Allreduce(&own_gpu, &every, 1, MPI_INT, MPI_MIN, runtime.io_comm());
    if (!every) {
      report.skip(name, "the NCCL backend needs one GPU per rank, and ranks share a GPU here (compared: none)");
      return;
    }
    dist::NcclOptions nccl;
    nccl.device = runtime.device().index();
    nccl.deterministic = true;
    other = dist::make_nccl_communicator(runtime.io_comm(), nccl);
    pair = "host-staged MPI vs NCCL (deterministic)";
#endif
  }
  if (!other) {
    report.skip(name, "no second data backend for this device in this build");
    return;
  }
  if (!runtime.options().deterministic && runtime.data_backend() == dist::DataBackend::Nccl) {
    report.skip(name, "run.deterministic = false: NCCL's fast sums are not bitwise comparable");
    return;
  }
  const at::Tensor a = stand_in_step(runtime.data(), runtime.device(), m);
  at::Tensor b = stand_in_step(*other, runtime.device(), m);
  inject_fault(b, runtime.world().rank);
  Local same = compare(b, a, true);
  same.text = pair + ": " + same.text;
  report.add(name, same, fmt::format("{}, 2 steps at {} element(s) per shard, bitwise", pair, m));
}

}  // namespace ditrl::app::preflight
