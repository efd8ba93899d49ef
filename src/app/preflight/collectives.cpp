// Every collective ditrl trains with, checked against the canonical result
// and timed as bus bandwidth.

#include <ditrl/app/preflight/checks.hpp>
#include <ditrl/app/preflight/draws.hpp>
#include <ditrl/clock.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/reduction.hpp>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::app::preflight {

namespace {

void wait_for_device(c10::Device device) {
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

struct Collective {
  std::string name;
  // Bus bandwidth's factor over algorithm bandwidth (below) and the bytes
  // that algorithm bandwidth divides by the time.
  double bus_factor = 1;
  int64_t bytes = 0;
  bool exact = true;  // bitwise against the reference, else within a bound
  std::function<at::Tensor()> run;
  at::Tensor reference;
};

// Bus bandwidth, as nccl-tests report it: the time is turned into the rate a
// single link would need, so collectives and rank counts compare with the
// link's own speed. An all-reduce of S bytes moves 2(n-1)/n S over each
// rank's link (a reduce-scatter then an all-gather); an all-gather or
// reduce-scatter of S bytes in all, and an all-to-all, (n-1)/n S.
// exact: whether the communicator's sums are the canonical tree (MPI always;
// NCCL in deterministic mode).
std::vector<Collective> collectives(dist::Communicator& comm, c10::Device device, int64_t m, bool exact) {
  const int n = comm.size(), r = comm.rank();
  const double spread = static_cast<double>(n - 1) / n;
  const int64_t b = m * 4;
  std::vector<Collective> out;
  {
    std::vector<at::Tensor> all;
    for (int q = 0; q < n; ++q) all.push_back(chunk(q, 0, 1, m));
    const at::Tensor input = chunk(r, 0, 1, m).to(device);
    out.push_back({"all_gather", spread, n * b, true,
                   [&comm, input, n, m] {
                     at::Tensor output = at::empty({n * m}, input.options());
                     comm.all_gather(input, output);
                     return output;
                   },
                   at::cat(all)});
  }
  const auto summed = [&](int salt, int to, bool average) {
    std::vector<at::Tensor> leaves;
    for (int q = 0; q < n; ++q) leaves.push_back(chunk(q, to, salt, m));
    at::Tensor sum = at::empty({m}, at::kFloat);
    dist::tree_sum_of_chunks(at::stack(leaves), sum, average);
    return sum;
  };
  for (const bool fast : {false, true}) {
    const int salt = fast ? 3 : 2;
    const at::Tensor input = rank_input(r, n, salt, m).to(device);
    out.push_back({fast ? "reduce_scatter (fast)" : "reduce_scatter (deterministic)", spread, n * b, exact,
                   [&comm, input, m] {
                     at::Tensor output = at::empty({m}, input.options());
                     comm.reduce_scatter(input, output, dist::ReduceOp::Avg);
                     return output;
                   },
                   summed(salt, r, true)});
  }
  {
    std::vector<at::Tensor> from;
    for (int q = 0; q < n; ++q) from.push_back(chunk(q, r, 4, m));
    const at::Tensor input = rank_input(r, n, 4, m).to(device);
    out.push_back({"all_to_all", spread, n * b, true,
                   [&comm, input] {
                     at::Tensor output = at::empty_like(input);
                     comm.all_to_all(input, output);
                     return output;
                   },
                   at::cat(from)});
  }
  {
    // Every rank's whole tensor is the same draw's chunk 0 of its own (salt 5).
    const at::Tensor input = chunk(r, 0, 5, m).to(device);
    out.push_back({"all_reduce", 2 * spread, b, exact,
                   [&comm, input] {
                     at::Tensor tensor = input.clone();
                     comm.all_reduce(tensor, dist::ReduceOp::Sum);
                     return tensor;
                   },
                   summed(5, 0, false)});
  }
  return out;
}

// Link speeds ditrl knows (one direction, per GPU): the figure bus bandwidth
// approaches on one node over NCCL. Anything else is "not known".
std::optional<double> expected_bus_gbps(const dist::Runtime& runtime) {
  if (!runtime.device().is_cuda() || runtime.data_backend() != dist::DataBackend::Nccl) return std::nullopt;
  const std::string device = dist::device_identity(runtime.device(), runtime.options().device);
  // NVLink 4 (H100/H200 SXM): 18 links of 25 GB/s each way.
  if (device.find("H100") != std::string::npos || device.find("H200") != std::string::npos) return 450.0;
  // NVLink 3 (A100 SXM): 12 links of 25 GB/s.
  if (device.find("A100") != std::string::npos) return 300.0;
  return std::nullopt;
}

}  // namespace

void check_collectives(Report& report, dist::Runtime& runtime, dist::Communicator* fast_comm, int64_t m,
                       int iterations) {
  const int rank = runtime.world().rank;
  const MPI_Comm comm = runtime.io_comm();
  const std::optional<double> expected = expected_bus_gbps(runtime);
  const bool nccl = runtime.data_backend() == dist::DataBackend::Nccl;
  std::vector<Collective> list =
      collectives(runtime.data(), runtime.device(), m, !nccl || runtime.options().deterministic);
  // The MPI path has one mode, the canonical tree: its "fast" reduce-scatter
  // is the deterministic one again. NCCL's fast one is its own ring.
  if (fast_comm) list[2] = std::move(collectives(*fast_comm, runtime.device(), m, false)[2]);
  for (Collective& c : list) {
    at::Tensor got = c.run();
    inject_fault(got, rank);
    const Local correct = compare(got.cpu(), c.reference, c.exact);
    const bool sum = c.name.find("reduce") != std::string::npos;
    const std::string checked = !c.exact ? "within a bound of the canonical tree sum"
                                : sum    ? "bitwise vs the canonical tree sum"
                                         : "bitwise vs every rank's redrawn input";
    report.add(c.name, correct,
               fmt::format("{} at {} fp32 element(s) per rank{}", checked, m,
                           c.name == "reduce_scatter (fast)" && !fast_comm ? " (MPI has one mode: this one)" : ""));
    MPI_Barrier(comm);
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) c.run();
    wait_for_device(runtime.device());
    const double seconds = max_over_ranks(seconds_since(start), comm) / iterations;
    const double bus = static_cast<double>(c.bytes) / seconds * c.bus_factor / 1e9;
    Local speed;
    std::string against = "expected: not known";
    if (expected) {
      speed.passed = bus >= 0.25 * *expected;
      against = fmt::format("expected {:g} GB/s (NVLink), pass at >= 25%", *expected);
    }
    speed.text = fmt::format("{:.3f} GB/s", bus);
    report.add(c.name + " bandwidth", speed,
               fmt::format("bus {:.3f} GB/s ({:.3f} ms per call, {} bytes, {} calls); {}", bus, seconds * 1e3, c.bytes,
                           iterations, against));
  }
}

}  // namespace ditrl::app::preflight
