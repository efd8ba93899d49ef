// `ditrl preflight [DECK]`: what a new allocation must get right before a long
// job, checked on every rank in a minute or two. Placement, the
// communicators' start-up, every collective ditrl trains with at the deck's
// message size (bitwise against the canonical sum, and timed as bus
// bandwidth), one stand-in training step compared bitwise between two data
// backends, memory against `ditrl plan`'s prediction and the write speed of
// out_dir. Rank 0 prints one report (and --json FILE); every failure names
// its rank and host; the exit status is 1 when any check failed.

#include <ditrl/app/commands.hpp>
#include <ditrl/app/memory_plan.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/app/run.hpp>
#include <ditrl/clock.hpp>
#include <ditrl/cuda_build.hpp>
#include <ditrl/dist/device.hpp>
#include <ditrl/dist/reduction.hpp>
#include <ditrl/error.hpp>
#include <ditrl/fault_injection.hpp>
#include <ditrl/shard/layout.hpp>

#ifdef DITRL_CUDA
#include <ditrl/dist/nccl_communicator.hpp>
#endif

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>
#include <boost/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

namespace ditrl::app {

namespace {

struct PreflightCli {
  std::string deck;
  std::vector<std::string> overrides;
  std::string json;
  std::string out_dir;
  int64_t max_elements = int64_t{1} << 22;
  int64_t disk_mib = 256;
  int iterations = 5;
};

// One check as rank 0 reports it: PASS, FAIL or SKIPPED, a line of what was
// measured, and every rank's own line (a failing rank's names it).
struct Check {
  std::string name;
  std::string status;
  std::string summary;
  std::vector<std::string> failures;  // "rank R (HOST): why"
  std::vector<std::string> ranks;     // "rank R (HOST): what it saw"
};

// This rank's part of a check.
struct Local {
  bool passed = true;
  std::string text;
};

void wait_for_device(c10::Device device) {
  if (device.is_cuda()) c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
}

// Every rank's string on rank 0 (empty elsewhere).
std::vector<std::string> gather_text(const std::string& mine, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  const int length = static_cast<int>(mine.size());
  std::vector<int> lengths(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm);
  int total = 0;
  for (int r = 0; r < size; ++r) offsets[static_cast<size_t>(r)] = std::exchange(total, total + lengths[r]);
  std::string all(static_cast<size_t>(rank == 0 ? total : 0), '\0');
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, comm);
  std::vector<std::string> out;
  if (rank == 0)
    for (int r = 0; r < size; ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]), lengths[r]));
  return out;
}

double max_over_ranks(double value, MPI_Comm comm) {
  double out = value;
  MPI_Allreduce(&value, &out, 1, MPI_DOUBLE, MPI_MAX, comm);
  return out;
}

class Report {
 public:
  Report(const dist::WorldInfo& world, MPI_Comm comm) : world_(world), comm_(comm) {
    hosts_ = gather_text(world.host, comm);
  }

  // Collective: this rank's outcome joins the others' under `name`.
  void add(const std::string& name, const Local& mine, const std::string& summary) {
    const std::vector<std::string> all = gather_text((mine.passed ? "P" : "F") + mine.text, comm_);
    if (world_.rank != 0) return;
    Check check{name, "PASS", summary, {}, {}};
    for (size_t r = 0; r < all.size(); ++r) {
      const std::string line = fmt::format("rank {} ({}): {}", r, hosts_[r], all[r].substr(1));
      if (all[r][0] == 'F') check.failures.push_back(line);
      check.ranks.push_back(line);
    }
    if (!check.failures.empty()) check.status = "FAIL";
    checks_.push_back(std::move(check));
  }
  // A check that does not run here, and why (rank 0 decides for all).
  void skip(const std::string& name, const std::string& reason) {
    if (world_.rank == 0) checks_.push_back(Check{name, "SKIPPED", reason, {}, {}});
  }

  bool failed() const {
    int mine = std::any_of(checks_.begin(), checks_.end(), [](const Check& c) { return c.status == "FAIL"; });
    int any = mine;
    MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, comm_);
    return any != 0;
  }

  std::string text() const {
    std::string out = fmt::format("# ditrl preflight: {} rank(s)\n", world_.size);
    for (const Check& c : checks_) {
      out += fmt::format("{:<8} {:<32} {}\n", c.status, c.name, c.summary);
      for (const std::string& f : c.failures) out += "         FAILED on " + f + "\n";
      // Where each rank runs, its memory and its disk: the lines a user compares across ranks.
      if (c.failures.empty() &&
          (c.name == "placement" || c.name.rfind("disk", 0) == 0 || c.name.rfind("memory", 0) == 0))
        for (const std::string& r : c.ranks) out += "         " + r + "\n";
    }
    int failed = 0;
    for (const Check& c : checks_) failed += c.status == "FAIL";
    out += failed ? fmt::format("preflight: {} check(s) FAILED\n", failed) : "preflight: every check passed\n";
    return out;
  }

  std::string json() const {
    boost::json::array checks;
    bool passed = true;
    for (const Check& c : checks_) {
      boost::json::array failures(c.failures.begin(), c.failures.end()), ranks(c.ranks.begin(), c.ranks.end());
      checks.push_back(boost::json::object{
          {"name", c.name}, {"status", c.status}, {"summary", c.summary}, {"failures", failures}, {"ranks", ranks}});
      passed = passed && c.status != "FAIL";
    }
    boost::json::array hosts(hosts_.begin(), hosts_.end());
    return boost::json::serialize(
               boost::json::object{{"ranks", world_.size}, {"hosts", hosts}, {"passed", passed}, {"checks", checks}}) +
           "\n";
  }

 private:
  const dist::WorldInfo& world_;
  MPI_Comm comm_;
  std::vector<std::string> hosts_;
  std::vector<Check> checks_;
};

// ---- placement ----------------------------------------------------------------

std::set<int> cpu_list(const std::string& text) {  // "0-3,8,10-11"
  std::set<int> cpus;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    int first = 0, last = 0;
    const int n = std::sscanf(part.c_str(), "%d-%d", &first, &last);
    if (n < 1) continue;
    for (int c = first; c <= (n == 2 ? last : first); ++c) cpus.insert(c);
  }
  return cpus;
}

std::string ranges(const std::set<int>& values) {
  std::string out;
  for (auto it = values.begin(); it != values.end();) {
    const int first = *it;
    int last = first;
    while (++it != values.end() && *it == last + 1) ++last;
    out += fmt::format("{}{}", out.empty() ? "" : ",",
                       first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last));
  }
  return out;
}

std::set<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::set<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.insert(c);
  return cpus;
}

// The NUMA nodes whose CPUs this rank may run on (/sys/devices/system/node).
std::string numa_nodes(const std::set<int>& cpus) {
  std::set<int> nodes;
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/sys/devices/system/node", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || !std::isdigit(static_cast<unsigned char>(name[4]))) continue;
    std::ifstream list(it->path() / "cpulist");
    std::string text;
    std::getline(list, text);
    for (const int c : cpu_list(text))
      if (cpus.count(c)) nodes.insert(std::stoi(name.substr(4)));
  }
  return nodes.empty() ? "unknown (no /sys/devices/system/node)" : ranges(nodes);
}

Local placement(const dist::Runtime& runtime) {
  const dist::WorldInfo& w = runtime.world();
  const std::set<int> cpus = allowed_cpus();
  Local out;
  out.text = fmt::format("local rank {}/{}, device {}, data {}, NUMA node(s) {}, CPUs {} ({})", w.local_rank,
                         w.local_size, dist::device_identity(runtime.device(), runtime.options().device),
                         dist::to_string(runtime.data_backend()), numa_nodes(cpus), ranges(cpus), cpus.size());
  if (const dist::LocalRankCheck check = dist::check_local_rank(w.local_rank); !check.warning.empty()) {
    out.passed = false;
    out.text += "; " + check.warning;
  }
  return out;
}

// ---- collectives ----------------------------------------------------------------

// The chunk rank `from` contributes to rank `to` in collective `salt`: fp32
// normals every rank can draw again, so each checks its result on its own.
at::Tensor chunk(int from, int to, int salt, int64_t elements) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(
      static_cast<uint64_t>(salt) * 1000003u + static_cast<uint64_t>(from) * 1009u + static_cast<uint64_t>(to));
  return at::randn({elements}, generator, at::kFloat);
}

at::Tensor rank_input(int rank, int ranks, int salt, int64_t elements) {
  std::vector<at::Tensor> chunks;
  for (int to = 0; to < ranks; ++to) chunks.push_back(chunk(rank, to, salt, elements));
  return at::cat(chunks);
}

// DITRL_TEST_PREFLIGHT_FAULT=R (test-only): rank R's collectives deliver one
// flipped bit, the fault the bitwise checks must name.
void inject_fault(at::Tensor& received, int rank) {
  if (!fault_requested("DITRL_TEST_PREFLIGHT_FAULT", rank)) return;
  at::Tensor first = received.view(-1).slice(0, 0, 1).cpu();
  *reinterpret_cast<int32_t*>(first.data_ptr()) ^= 1;
  received.view(-1).slice(0, 0, 1).copy_(first);
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

// What a fast sum may differ by: fp32 rounding of n terms of unit normals,
// at most about n * 2^-24 * sum |x| per element (|x| < 6 here, so < 1e-4 at
// 64 ranks); 1e-3 absolute leaves a 10x margin.
constexpr double kFastSumBound = 1e-3;

Local compare(const at::Tensor& got, const at::Tensor& want, bool exact) {
  Local out;
  if (exact) {
    const int64_t differ = at::ne(got.view(at::kInt), want.view(at::kInt)).sum().item<int64_t>();
    out.passed = differ == 0;
    out.text = differ ? fmt::format("{} of {} element(s) differ bitwise from the expected result", differ, want.numel())
                      : "bitwise equal";
  } else {
    const double error = (got - want).abs().max().item<double>();
    out.passed = error <= kFastSumBound;
    out.text = fmt::format("max |error| {:.3g} (bound {:g})", error, kFastSumBound);
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

// ---- one training step on two data backends --------------------------------------

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

// ---- memory --------------------------------------------------------------------

int64_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

void check_memory(Report& report, const dist::Runtime& runtime, const std::optional<MemoryPlan>& plan) {
  if (!plan) {
    report.skip("memory vs plan", "no deck: nothing to predict");
    return;
  }
  const dist::WorldInfo& w = runtime.world();
  Local mine;
  int64_t predicted = 0, available = 0;
  if (runtime.device().is_cuda()) {
    const int sharing = std::max(1, w.local_size / std::max(1, dist::visible_gpus()));
    predicted = plan->device_peak();
    available = dist::free_device_bytes(runtime.device()) / sharing;
    mine.text = fmt::format("{} GPU: predicted peak {:.3f} GB, free {:.3f} GB (shared by {} rank(s))",
                            runtime.device().str(), predicted / 1e9, available * sharing / 1e9, sharing);
  } else {
    predicted = plan->peak();
    available = meminfo_bytes("MemAvailable") / std::max(1, w.local_size);
    mine.text = fmt::format("host: predicted peak {:.3f} GB, available {:.3f} GB per rank (MemAvailable / {})",
                            predicted / 1e9, available / 1e9, w.local_size);
  }
  mine.passed = available >= predicted;
  report.add("memory vs plan", mine,
             fmt::format("ditrl plan's peak per rank {:.3f} GB against what each rank has", predicted / 1e9));
}

// ---- disk -----------------------------------------------------------------------

Local disk_speed(const std::string& out_dir, int rank, int64_t mib) {
  Local out;
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  const std::string path = fmt::format("{}/.preflight-rank-{}-{}.tmp", out_dir, rank, getpid());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    out.passed = false;
    out.text = fmt::format("cannot create {}: {}", path, std::strerror(errno));
    return out;
  }
  std::vector<char> block(size_t{1} << 20, '\x5a');
  const auto start = Clock::now();
  std::string error;
  for (int64_t i = 0; i < mib && error.empty(); ++i)
    if (::write(fd, block.data(), block.size()) != static_cast<ssize_t>(block.size()))
      error = fmt::format("write to {}: {}", path, std::strerror(errno));
  if (error.empty() && ::fsync(fd) != 0) error = fmt::format("fsync of {}: {}", path, std::strerror(errno));
  const double seconds = seconds_since(start);
  ::close(fd);
  std::filesystem::remove(path, ec);
  out.passed = error.empty();
  out.text = error.empty() ? fmt::format("{:.1f} MB/s ({} MiB written and fsynced in {:.3f} s)",
                                         static_cast<double>(mib) * 1.048576 / seconds, mib, seconds)
                           : error;
  return out;
}

// ---- the command -------------------------------------------------------------------

// The deck's largest all-gather: one flat group's shard per rank (what
// `ditrl plan` shards), capped for CPU runs.
int64_t message_elements(const shard::Layout& layout, int64_t cap) {
  int64_t largest = 1;
  for (const shard::UnitLayout& unit : layout.units)
    for (const shard::FlatGroup& group : unit.groups) largest = std::max(largest, group.shard);
  return std::min(largest, cap);
}

int preflight(const PreflightCli& cli) {
  config::Config config = cli.deck.empty() ? config::Config{} : config::load_deck(cli.deck, cli.overrides);
  if (!cli.out_dir.empty()) config.run.out_dir = cli.out_dir;
  const auto start = Clock::now();
  const StartedJob job = start_runtime(config, "");
  dist::Runtime& runtime = *job.runtime;
  const double startup = seconds_since(start);
  const dist::WorldInfo& world = runtime.world();
  const MPI_Comm comm = runtime.io_comm();
  Report report(world, comm);

  report.add("placement", placement(runtime),
             fmt::format("{} rank(s) on {} build", world.size, kCudaBuild ? "a CUDA" : "a CPU-only"));
  Local started{true, fmt::format("{:.3f} s", startup)};
  report.add("communicator start-up", started,
             fmt::format("MPI + data backend {} up in {:.3f} s (slowest rank)", dist::to_string(runtime.data_backend()),
                         max_over_ranks(startup, comm)));

  std::optional<MemoryPlan> plan;
  int64_t m = cli.max_elements;  // without a deck, the message size itself
  if (!cli.deck.empty()) {
    const std::shared_ptr<models::Family> family = plan_family(config);
    const precision::CompiledPlan compiled = compiled_plan(config, *family);
    const shard::Layout layout = shard::build_layout(*family, family->wrap_units(), compiled, world.size);
    plan = memory_plan(config, *family, layout);
    m = message_elements(layout, cli.max_elements);
  }
  std::unique_ptr<dist::Communicator> fast;
#ifdef DITRL_CUDA
  if (runtime.data_backend() == dist::DataBackend::Nccl) {
    dist::NcclOptions nccl;
    nccl.device = runtime.device().index();
    nccl.deterministic = false;
    fast = dist::make_nccl_communicator(comm, nccl);
  }
#endif
  check_collectives(report, runtime, fast.get(), m, cli.iterations);
  check_step(report, runtime, m);
  check_memory(report, runtime, plan);
  report.add("disk write " + config.run.out_dir, disk_speed(config.run.out_dir, world.rank, cli.disk_mib),
             fmt::format("{} MiB per rank, written and fsynced at once by every rank", cli.disk_mib));

  const bool failed = report.failed();
  if (world.rank == 0) {
    std::cout << report.text() << std::flush;
    if (!cli.json.empty()) {
      std::ofstream out(cli.json);
      out << report.json();
      if (!out) fail("preflight: cannot write the JSON report {}", cli.json);
    }
  }
  return failed ? 1 : 0;
}

}  // namespace

void add_preflight_command(CLI::App& app, Command& selected) {
  auto cli = std::make_shared<PreflightCli>();
  CLI::App* sub = app.add_subcommand(
      "preflight",
      "Check a new allocation before a long job, on every rank: placement, communicators, every collective "
      "(bitwise, bus bandwidth), a training step on two data backends, memory against the plan, out_dir's disk");
  sub->add_option("deck", cli->deck, "TOML deck (without one: message size from --max-elements, no memory check)");
  sub->add_option("--set", cli->overrides, "Override a deck key: section.key=value (repeatable)");
  sub->add_option("--json", cli->json, "Also write the report as JSON to this file (rank 0)");
  sub->add_option("--out-dir", cli->out_dir, "Folder whose disk is measured (default: the deck's run.out_dir)");
  sub->add_option(
         "--max-elements", cli->max_elements,
         "fp32 elements per rank of each collective: a cap on the deck's shard size, or the size without a deck")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32));
  sub->add_option("--disk-mib", cli->disk_mib, "MiB each rank writes and fsyncs into out_dir")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->add_option("--iterations", cli->iterations, "Timed calls of each collective")->check(CLI::Range(1, 1000));
  sub->callback([cli, &selected] { selected = [cli] { return preflight(*cli); }; });
}

}  // namespace ditrl::app
