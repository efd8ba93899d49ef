// `ditrl train` at 1, 2 and 4 ranks on one GPU, parameters and gradients
// over the MPI data backend ([parallel] data_backend = "mpi": every rank
// binds the only visible GPU, collectives go through pinned host buffers;
// docs/gpus-and-clusters.md). Deterministic mode's rank invariance
// (rl/loss_window.hpp) on the GPU: the 2- and 4-rank runs write the 1-rank
// run's metrics and checkpoints bit for bit, with the sharded step's gathers,
// prefetch and overlapped reduce-scatters in play; and a run stopped at 4
// ranks resumes at 2 and continues the 1-rank run bitwise. Tagged [mpi_data]:
// the check kit runs them in their own step (tests/gpu/run_mpi_data_tests.sh).
// Each case SKIPs where no GPU is visible (gpu_main.cpp).
#include <catch2/catch.hpp>

#include "e2e.hpp"

using namespace ditrl;
using Catch::Matchers::Contains;
using test::read_file;

namespace {

const std::string kDeck = test::e2e_deck("tiny_grpo.toml");
const std::string kOneGpu = "--set run.device=cuda --set parallel.data_backend=mpi --set train.num_rollouts=2";

// Metrics bitwise (perf/* aside) and the last checkpoint's /model and /optimizer bitwise.
void check_same_run(const std::string& reference, const std::string& other) {
  INFO(other << " against " << reference);
  const std::string differ = test::differing_metrics(reference, other);
  INFO(differ);
  CHECK(differ.empty());
  const auto equal = test::h5_equal(reference + "/checkpoints/step-2.h5", other + "/checkpoints/step-2.h5");
  INFO(equal.output);
  CHECK(equal.exit_code == 0);
}

}  // namespace

TEST_CASE("gpu: 1 2 and 4 ranks sharing one GPU over the MPI data backend train bit for bit alike",
          "[gpu][mpi_data][ranks]") {
  std::string reference;
  for (const int ranks : {1, 2, 4}) {
    INFO(ranks << " rank(s)");
    const std::string out = test::fresh_output_dir("gpu_mpi_data_ranks_" + std::to_string(ranks));
    const auto run = test::train(kDeck, out, ranks, kOneGpu);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK_THAT(read_file(out + "/logs/rank-0.log"), Contains("device cuda:0 data mpi"));
    if (ranks == 1)
      reference = out;
    else
      check_same_run(reference, out);
  }
}

TEST_CASE("gpu: a run stopped at 4 ranks on one GPU resumes at 2 and continues the 1-rank run bit for bit",
          "[gpu][mpi_data][resume]") {
  const std::string whole = test::fresh_output_dir("gpu_mpi_data_resume_whole");
  const std::string split = test::fresh_output_dir("gpu_mpi_data_resume_split");
  const auto first = test::train(kDeck, whole, 1, kOneGpu);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(test::train(kDeck, split, 4, kOneGpu + " --max-rollouts 1").exit_code == 0);
  CHECK(read_file(split + "/status") == "preempted\n");
  const auto resumed = test::train(kDeck, split, 2, kOneGpu + " --resume latest");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + split + "/checkpoints/step-1.h5"));
  check_same_run(whole, split);
}

// The host-staged backend waits for the GPU at each collective; the debug
// switch that forbids such waits is refused at start-up, on every rank.
TEST_CASE("gpu: debug.forbid_host_sync is refused with the MPI data backend on the GPU", "[gpu][mpi_data][deck]") {
  const std::string out = test::fresh_output_dir("gpu_mpi_data_forbid_sync");
  const auto run = test::train(kDeck, out, 2, kOneGpu + " --set debug.forbid_host_sync=true");
  INFO(run.output);
  CHECK(run.exit_code != 0);
  CHECK_THAT(run.output, Contains("forbid_host_sync") && Contains("data_backend"));
}
