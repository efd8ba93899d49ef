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
#include <ditrl/app/preflight/checks.hpp>
#include <ditrl/app/preflight/report.hpp>
#include <ditrl/app/run.hpp>
#include <ditrl/clock.hpp>
#include <ditrl/cuda_build.hpp>
#include <ditrl/error.hpp>
#include <ditrl/shard/layout.hpp>

#ifdef DITRL_CUDA
#include <ditrl/dist/nccl_communicator.hpp>
#endif

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>

namespace ditrl::app {

namespace {

using preflight::check_collectives;
using preflight::check_memory;
using preflight::check_step;
using preflight::disk_speed;
using preflight::Local;
using preflight::max_over_ranks;
using preflight::placement;
using preflight::Report;

struct PreflightCli {
  std::string deck;
  std::vector<std::string> overrides;
  std::string json;
  std::string out_dir;
  int64_t max_elements = int64_t{1} << 22;
  int64_t disk_mib = 256;
  int iterations = 5;
};

// The deck's largest all-gather: one flat group's shard per rank (what
// `ditrl plan` shards), capped for CPU runs.
int64_t message_elements(const shard::Layout& layout, int64_t cap) {
  int64_t largest = 1;
  for (const shard::UnitLayout& unit : layout.units)
    for (const shard::FlatGroup& group : unit.groups) largest = std::max(largest, group.shard);
  return std::min(largest, cap);
}

int run_preflight(const PreflightCli& cli) {
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
  sub->callback([cli, &selected] { selected = [cli] { return run_preflight(*cli); }; });
}

}  // namespace ditrl::app
