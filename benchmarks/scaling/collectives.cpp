// Bus bandwidth of all_gather and reduce_scatter through dist::Communicator
// (MPI backend) against the same raw MPI calls in the same run: MPI_Allgather
// and MPI_Reduce_scatter_block (fp32, MPI_SUM). Message size = the full
// buffer (gathered output / reduce-scatter input), 4 KiB to 64 MiB; bus
// bandwidth = (N-1)/N * size / time (nccl-tests' definition). Raw and
// Communicator calls use the same buffers. For reduce_scatter the table also
// shows MPI_Alltoall of the same bytes, the transport the Communicator's
// deterministic reduce-scatter runs on, so the local sum's cost shows. Each
// size alternates short rounds (~32 MiB moved, at least 4 calls) of raw and
// Communicator calls 21 times, in reversed order every other round, and
// reports each one's best round (on a shared machine the other rounds
// measure the neighbours) and the median over rounds of raw / Communicator
// time, paired within a round.
//
//   mpiexec -n 2 --mca btl self,vader bench_collectives [max_mib] > collectives-np2.md

#include <ditrl/dist/communicator.hpp>
#include <ditrl/dist/runtime.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <utility>
#include <vector>

namespace {

using ditrl::dist::Communicator;

// Seconds per call, the slowest rank's.
double time_calls(MPI_Comm comm, int iterations, const std::function<void()>& call) {
  call();  // warm-up: first-touch pages and MPI connection setup
  MPI_Barrier(comm);
  const double start = MPI_Wtime();
  for (int i = 0; i < iterations; ++i) call();
  double elapsed = (MPI_Wtime() - start) / iterations;
  MPI_Allreduce(MPI_IN_PLACE, &elapsed, 1, MPI_DOUBLE, MPI_MAX, comm);
  return elapsed;
}

constexpr int kRounds = 21;

double best(const std::vector<double>& v) {
  return *std::min_element(v.begin(), v.end());
}

// Median over rounds of raw time / our time, each pair measured back to back:
// the neighbours' load mostly cancels within a round.
double median_paired_ratio(const std::vector<double>& raw, const std::vector<double>& ours) {
  std::vector<double> ratios;
  for (size_t i = 0; i < raw.size(); ++i) ratios.push_back(raw[i] / ours[i]);
  std::nth_element(ratios.begin(), ratios.begin() + ratios.size() / 2, ratios.end());
  return ratios[ratios.size() / 2];
}

struct Row {
  double raw = 0, ours = 0, ours_bf16 = 0, transport = 0;  // seconds, best round
  double paired_ratio = 0;
};

Row measure(MPI_Comm raw, Communicator& comm, int64_t bytes, bool gather) {
  const int n = comm.size();
  const int64_t elements = bytes / 4, chunk = elements / n;
  // At least 4 calls per round: a single 64 MiB call is one scheduler slice.
  const int iterations = static_cast<int>(std::clamp<int64_t>((int64_t{32} << 20) / bytes, 4, 400));
  at::Tensor full = at::randn({chunk * n}), part = at::randn({chunk});
  at::Tensor full_bf16 = at::randn({2 * chunk * n}).to(at::kBFloat16),
             part_bf16 = at::randn({2 * chunk}).to(at::kBFloat16);
  at::Tensor received = at::empty_like(full);
  std::function<void()> raw_call, our_call, our_bf16_call, transport_call;
  if (gather) {
    raw_call = [&] {
      MPI_Allgather(part.data_ptr(), static_cast<int>(chunk), MPI_FLOAT, full.data_ptr(), static_cast<int>(chunk),
                    MPI_FLOAT, raw);
    };
    our_call = [&] { comm.all_gather(part, full); };
    our_bf16_call = [&] { comm.all_gather(part_bf16, full_bf16); };
  } else {
    raw_call = [&] {
      MPI_Reduce_scatter_block(full.data_ptr(), part.data_ptr(), static_cast<int>(chunk), MPI_FLOAT, MPI_SUM, raw);
    };
    transport_call = [&] {
      MPI_Alltoall(full.data_ptr(), static_cast<int>(chunk), MPI_FLOAT, received.data_ptr(), static_cast<int>(chunk),
                   MPI_FLOAT, raw);
    };
    our_call = [&] { comm.reduce_scatter(full, part, ditrl::dist::ReduceOp::Sum); };
    our_bf16_call = [&] { comm.reduce_scatter(full_bf16, part_bf16, ditrl::dist::ReduceOp::Sum); };
  }
  std::vector<double> raw_t, our_t, bf16_t, transport_t;
  std::vector<std::pair<std::function<void()>*, std::vector<double>*>> order{
      {&raw_call, &raw_t}, {&our_call, &our_t}, {&our_bf16_call, &bf16_t}};
  if (transport_call) order.emplace_back(&transport_call, &transport_t);
  for (int round = 0; round < kRounds; ++round) {
    // Reverse the order every other round: with oversubscribed ranks the
    // first call of a round pays for the neighbours' wake-up.
    for (auto& [call, times] : order) times->push_back(time_calls(raw, iterations, *call));
    std::reverse(order.begin(), order.end());
  }
  return {best(raw_t), best(our_t), best(bf16_t), transport_t.empty() ? 0.0 : best(transport_t),
          median_paired_ratio(raw_t, our_t)};
}

std::string size_text(int64_t bytes) {
  return bytes >= (1 << 20) ? fmt::format("{} MiB", bytes >> 20) : fmt::format("{} KiB", bytes >> 10);
}

}  // namespace

int main(int argc, char** argv) {
  ditrl::dist::MpiRuntime mpi(&argc, &argv);
  const int64_t max_mib = argc > 1 ? std::atoll(argv[1]) : 64;
  at::set_num_threads(mpi.default_threads());
  auto comm = ditrl::dist::make_mpi_communicator();
  MPI_Comm raw = MPI_COMM_NULL;
  MPI_Comm_dup(MPI_COMM_WORLD, &raw);
  const int n = comm->size();
  const double bus = n > 1 ? static_cast<double>(n - 1) / n : 1.0;

  std::string out = fmt::format(
      "| op | size | raw MPI fp32 GB/s | Communicator fp32 GB/s | ratio of bests | median paired ratio | "
      "Communicator bf16 GB/s | MPI_Alltoall GB/s |\n"
      "|---|---|---|---|---|---|---|---|\n");
  for (const bool gather : {true, false}) {
    for (int64_t bytes = 4 << 10; bytes <= (max_mib << 20); bytes *= 4) {
      const Row row = measure(raw, *comm, bytes, gather);
      const auto gbps = [&](double seconds) { return bus * static_cast<double>(bytes) / seconds / 1e9; };
      out += fmt::format("| {} | {} | {:.2f} | {:.2f} | {:.3f} | {:.3f} | {:.2f} | {} |\n",
                         gather ? "all_gather" : "reduce_scatter", size_text(bytes), gbps(row.raw), gbps(row.ours),
                         row.raw / row.ours, row.paired_ratio, gbps(row.ours_bf16),
                         gather ? std::string("-") : fmt::format("{:.2f}", gbps(row.transport)));
    }
  }
  if (comm->rank() == 0)
    std::cout << fmt::format("{} ranks, {} intra-op thread(s) per rank; bus bandwidth (N-1)/N * bytes / time\n\n", n,
                             at::get_num_threads())
              << out;
  MPI_Comm_free(&raw);
  return 0;
}
