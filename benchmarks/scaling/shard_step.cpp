// Time and memory per rank of a training step (forward + backward + AdamW)
// of a ~50M-parameter block stack (6 blocks, dim 1024, MLP 4096) with bf16
// compute and fp32 masters, at a fixed global batch (strong scaling).
//
//   sharded:   ShardedParams over N ranks (prefetch on, reshard after forward)
//   unsharded: the LibTorch baseline on one rank: bf16 model, fp32 masters,
//              torch::optim::AdamW (the same math, nothing sharded)
//
// Peak RSS is the kernel's high-water mark (VmHWM) reset after set-up
// (/proc/self/clear_refs), so it covers the steps: resident state plus the
// step's transient peak. CPU seconds per step are summed over the ranks: on
// a machine shared with other jobs they are steadier than wall time.
//
// Columns: mode | ranks | intra-op threads per rank | parameters | wall s per
// step (median) | samples/s | CPU core-s per step, all ranks | state MiB per
// rank (masters, moments, grads, compute copies) | peak gathered MiB per rank |
// peak RSS MiB (max over ranks) | peak RSS above start-up RSS MiB (max).
//
//   mpiexec -n N --mca btl self,vader bench_shard_step sharded [steps]
//   mpiexec -n 1 bench_shard_step unsharded [steps]

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <fmt/format.h>
#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>

#include "../../tests/support/block_stack.hpp"

namespace {

using namespace ditrl;

const test::StackShape kShape{256, 1024, 4096, 256, 6};
constexpr int64_t kGlobalBatch = 128;
constexpr double kLr = 1e-4;

double status_mib(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;  // kB
  return 0;
}

void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

std::pair<at::Tensor, at::Tensor> batch(int step, int rank, int ranks) {
  torch::manual_seed(100 + step);
  const at::Tensor x = torch::randn({kGlobalBatch, kShape.in}), y = torch::randn({kGlobalBatch, kShape.out});
  const int64_t rows = kGlobalBatch / ranks;
  return {x.narrow(0, rank * rows, rows), y.narrow(0, rank * rows, rows)};
}

// CPU seconds (user + system) this process has used.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + 1e-6 * (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

struct Measured {
  double step_s = 0;     // median wall time
  double cpu_s = 0;      // this rank's CPU seconds per step (mean)
  double state_mib = 0;  // optimizer state + compute copies held between steps
  double gathered_mib = 0;
  int64_t parameters = 0;
};

int64_t count_parameters(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

Measured run_sharded(dist::Communicator& comm, int steps, bool prefetch) {
  test::BlockStack model(kShape, 1);
  const int64_t parameters = count_parameters(model);
  const auto plan =
      precision::PrecisionPlan(at::kFloat, at::kFloat, at::kBFloat16, {{"*.norm2.*", at::kFloat, "norm2", true}})
          .compile(test::parameter_names(model));
  shard::ShardOptions options;
  options.prefetch = prefetch;
  shard::ShardedParams params(model, model.wrap_units(), plan, comm, options);
  models::ForwardContext ctx;
  ctx.runner = &params;
  reset_peak_rss();
  std::vector<double> times;
  double cpu_start = 0;
  for (int step = 0; step <= steps; ++step) {
    const auto [x, y] = batch(step, comm.rank(), comm.size());
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    params.zero_grad();
    params.begin_step();
    torch::mse_loss(model.forward(x, ctx), y).backward();
    params.finish_backward();
    params.clip_grad(1.0);
    params.adamw_step(kLr);
    comm.barrier();
    if (step == 0) cpu_start = cpu_seconds();
    if (step > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const shard::MemoryReport m = params.memory_report();
  return {times[times.size() / 2], (cpu_seconds() - cpu_start) / steps, (m.total() - m.peak_gathered) / 1048576.0,
          m.peak_gathered / 1048576.0, parameters};
}

Measured run_unsharded(int steps) {
  test::BlockStack model(kShape, 1);
  std::vector<at::Tensor> params, masters;
  for (auto& item : model.named_parameters()) {
    params.push_back(item.value());
    masters.push_back(item.value().detach().clone().requires_grad_(true));
    const bool norm2 = item.key().find(".norm2.") != std::string::npos;
    item.value().set_data(masters.back().detach().to(norm2 ? at::kFloat : at::kBFloat16));
  }
  torch::optim::AdamW adamw(masters, torch::optim::AdamWOptions(kLr).weight_decay(0));
  reset_peak_rss();
  std::vector<double> times;
  double cpu_start = 0;
  for (int step = 0; step <= steps; ++step) {
    const auto [x, y] = batch(step, 0, 1);
    const auto start = std::chrono::steady_clock::now();
    adamw.zero_grad();
    torch::mse_loss(model.forward(x), y).backward();
    for (size_t i = 0; i < params.size(); ++i) {
      masters[i].mutable_grad() = params[i].grad().to(at::kFloat);
      params[i].mutable_grad().reset();
    }
    torch::nn::utils::clip_grad_norm_(masters, 1.0);
    adamw.step();
    for (size_t i = 0; i < params.size(); ++i) params[i].set_data(masters[i].detach().to(params[i].scalar_type()));
    if (step == 0) cpu_start = cpu_seconds();
    if (step > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  int64_t state = 0;
  for (size_t i = 0; i < params.size(); ++i)
    state += masters[i].nbytes() * 4 + params[i].nbytes();  // master, 2 moments, grad
  return {times[times.size() / 2], (cpu_seconds() - cpu_start) / steps, state / 1048576.0, 0, count_parameters(model)};
}

}  // namespace

int main(int argc, char** argv) {
  dist::MpiRuntime mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "sharded";
  const int steps = argc > 2 ? std::atoi(argv[2]) : 3;
  const bool prefetch = !(argc > 3 && std::string(argv[3]) == "no-prefetch");
  at::set_num_threads(mpi.default_threads());
  auto comm = dist::make_mpi_communicator();
  const double startup_rss = status_mib("VmRSS");
  if (mode != "sharded" && (mode != "unsharded" || comm->size() != 1)) {
    std::cerr << "usage: bench_shard_step sharded|unsharded [steps] [no-prefetch] (unsharded runs on one rank)\n";
    return 2;
  }
  const Measured m = mode == "sharded" ? run_sharded(*comm, steps, prefetch) : run_unsharded(steps);
  // Per rank: peak RSS during the steps and its growth over the process's start-up RSS.
  double peak = status_mib("VmHWM"), growth = peak - startup_rss;
  double worst[2] = {peak, growth};
  MPI_Allreduce(MPI_IN_PLACE, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  double cpu = m.cpu_s;
  MPI_Allreduce(MPI_IN_PLACE, &cpu, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  if (comm->rank() == 0)
    std::cout << fmt::format(
        "| {} | {} | {} | {:.1f}M | {:.3f} | {:.1f} | {:.2f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |\n", mode,
        comm->size(), at::get_num_threads(), m.parameters / 1e6, m.step_s, kGlobalBatch / m.step_s, cpu, m.state_mib,
        m.gathered_mib, worst[0], worst[1]);
  return 0;
}
