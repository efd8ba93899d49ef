// `ditrl train` on a GPU (run.device = "cuda", one rank): no host sync in a
// micro-batch, two runs of a deterministic deck bitwise equal, a resumed run
// equal to the uninterrupted one, a `ditrl rollout` file trained on like the
// sampled rollout, and the quickstart (step-0 parity: test_gpu_attention.cpp).
// Each case SKIPs where no GPU is visible (gpu_main.cpp).
#include <ditrl/io/standard.hpp>

#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <cmath>
#include <fstream>
#include <numeric>

#include "measured.hpp"

using namespace ditrl;
using Catch::Matchers::Contains;
using test::read_file;

namespace {

const std::string kDeck = test::e2e_deck("tiny_grpo.toml");
const std::string kOnGpu = "--set run.device=cuda";

// Bitwise comparison of two checkpoints' parameters and AdamW moments.
void check_checkpoints_equal(const std::string& a, const std::string& b) {
  const auto r = test::h5_equal(a, b);
  INFO(r.output);
  CHECK(r.exit_code == 0);
}

double mean(const std::vector<double>& v, size_t from, size_t count) {
  return std::accumulate(v.begin() + from, v.begin() + from + count, 0.0) / count;
}

}  // namespace

// Issue #17 point 4: every micro-batch's forward and backward runs under
// LibTorch's sync debug mode set to error, so an .item() or a blocking copy
// anywhere in them (model, loss, metrics, gathers, reduce-scatters) fails the run.
TEST_CASE("gpu: no training micro-batch makes the host wait for the GPU in its forward or backward", "[gpu][sync]") {
  for (const std::string attention : {"math", "flash"}) {
    INFO("precision.attention = " << attention);
    const std::string out = test::fresh_output_dir("gpu_no_sync_" + attention);
    const auto r = test::train(kDeck, out, 1,
                               kOnGpu + " --set debug.forbid_host_sync=true --set train.num_rollouts=2" +
                                   " --set precision.forward=bf16 --set precision.attention=" + attention);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, !Contains("synchronizing"));
  }
}

TEST_CASE("gpu: two runs of a deterministic deck write the same metrics and checkpoints bit for bit",
          "[gpu][determinism]") {
  const std::string a = test::fresh_output_dir("gpu_twice_a"), b = test::fresh_output_dir("gpu_twice_b");
  const auto first = test::train(kDeck, a, 1, kOnGpu);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const auto second = test::train(kDeck, b, 1, kOnGpu);
  INFO(second.output);
  REQUIRE(second.exit_code == 0);
  CHECK(io::check_standard(io::make_standard(test::metrics_of(a), ""), test::metrics_of(b)).empty());
  check_checkpoints_equal(a + "/checkpoints/step-4.h5", b + "/checkpoints/step-4.h5");
}

TEST_CASE("gpu: stopping after rollout 2 of 4 and resuming on the GPU gives the uninterrupted run bit for bit",
          "[gpu][resume]") {
  const std::string a = test::fresh_output_dir("gpu_resume_a"), b = test::fresh_output_dir("gpu_resume_b");
  REQUIRE(test::train(kDeck, a, 1, kOnGpu).exit_code == 0);
  REQUIRE(test::train(kDeck, b, 1, kOnGpu + " --max-rollouts 2").exit_code == 0);
  CHECK(read_file(b + "/status") == "preempted\n");
  const auto resumed = test::train(kDeck, b, 1, kOnGpu + " --resume latest");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + b + "/checkpoints/step-2.h5"));
  CHECK(io::check_standard(io::make_standard(test::metrics_of(a), ""), test::metrics_of(b)).empty());
  check_checkpoints_equal(a + "/checkpoints/step-4.h5", b + "/checkpoints/step-4.h5");
}

// The file's latents and velocities are read onto the host; training meets
// them on the GPU (the model-output difference subtracts the rollout's).
TEST_CASE("gpu: a rollout written by ditrl rollout on the GPU trains with --trajectories like the sampled one",
          "[gpu][trajectories]") {
  const std::string dir = test::fresh_output_dir("gpu_trajectories");
  const std::string traj = dir + "/rollout-0.h5";
  const auto written =
      test::run_process(fmt::format("timeout 600 {} -np 1 {} rollout {} --out {} --set run.out_dir={} {}",
                                    DITRL_MPIEXEC, DITRL_BINARY, kDeck, traj, dir, kOnGpu));
  INFO(written.output);
  REQUIRE(written.exit_code == 0);
  const std::string one = kOnGpu + " --set train.num_rollouts=1";
  const auto from_file = test::train(kDeck, dir + "/file", 1, one + " --trajectories " + dir + "/rollout-{rollout}.h5");
  INFO(from_file.output);
  REQUIRE(from_file.exit_code == 0);
  const auto sampled = test::train(kDeck, dir + "/sampled", 1, one);
  INFO(sampled.output);
  REQUIRE(sampled.exit_code == 0);
  const io::MetricsTable a = test::metrics_of(dir + "/file"), b = test::metrics_of(dir + "/sampled");
  REQUIRE(a.series.count("train/model_output_mean_abs_diff"));
  CHECK(a.series.at("train/model_output_mean_abs_diff")[0] == 0.0);
  CHECK(io::check_standard(io::make_standard(b, ""), a).empty());
}

TEST_CASE("gpu: the quickstart trains on the GPU and its reward rises", "[gpu][quickstart]") {
  const std::string out = test::fresh_output_dir("gpu_quickstart");
  const auto r = test::train(std::string(DITRL_SOURCE_DIR) + "/inputs/quickstart.toml", out, 1, kOnGpu);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(read_file(out + "/status") == "complete\n");
  CHECK_THAT(read_file(out + "/logs/rank-0.log"), Contains("device cuda"));
  const io::MetricsTable m = test::metrics_of(out);
  REQUIRE(m.steps.size() == 150);
  const std::vector<double>& reward = m.series.at("rollout/reward/raw_mean");
  // On 2 CPU ranks the mean of the last 10 rollouts is 0.72 above the first
  // 10 (benchmarks/results/quickstart.md); on the GPU the bf16 kernels differ, the learning must not.
  const double gain = mean(reward, 140, 10) - mean(reward, 0, 10);
  INFO("reward gain, last 10 - first 10 rollouts: " << gain);
  // Measured: printed ("measured:"), not yet recorded from a GPU run; 0.72 on 2 CPU ranks.
  ditrl::test::print_measured("quickstart reward gain on the GPU (a floor, not an error)", gain, "> 0.3");
  CHECK(gain > 0.3);
  CHECK(m.series.at("train/log_prob_mean_abs_diff")[0] == 0.0);
  // The sharded state lives on the GPU: the allocator's peak holds at least it.
  const double peak = m.series.at("perf/peak_device_bytes").back(), state = m.series.at("perf/state_bytes").back();
  INFO("perf/peak_device_bytes " << peak << ", perf/state_bytes " << state);
  CHECK(peak >= state);
}
