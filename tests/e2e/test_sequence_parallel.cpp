// Sequence parallelism ([parallel] sequence_parallel) as users run it: a
// 4-rank job in two groups of 2 ranks against the 2-rank job without it, and
// the decks it cannot run.
#include <ditrl/io/metrics.hpp>

#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

const std::string kDeck = test::e2e_deck("wan_sequence_parallel.toml");

// The largest |a - b| / max(|a|, |b|) over a metric's steps from `first`
// on (0 where equal); differences below 1e-7 count as equal: metrics that are
// zero by construction (the mean of normalised advantages, the GRPO loss at
// ratio 1) are sums that cancel to ~1e-8 in either run.
double relative_difference(const std::vector<double>& a, const std::vector<double>& b, size_t first) {
  double worst = 0;
  for (size_t i = first; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(a[i] - b[i]);
    if (d > 1e-7) worst = std::max(worst, d / std::max(std::abs(a[i]), std::abs(b[i])));
  }
  return worst;
}

}  // namespace

TEST_CASE("sequence parallel: wan at sequence_parallel = 2 on 4 ranks tracks the 2-rank run", "[e2e][sequence]") {
  const std::string a = test::fresh_output_dir("e2e_sp1"), b = test::fresh_output_dir("e2e_sp2");
  const auto plain = test::train(kDeck, a, 2);
  INFO(plain.output);
  REQUIRE(plain.exit_code == 0);
  const auto split = test::train(kDeck, b, 4, "--set parallel.sequence_parallel=2");
  INFO(split.output);
  REQUIRE(split.exit_code == 0);

  const io::MetricsTable ma = test::metrics_of(a), mb = test::metrics_of(b);
  REQUIRE(ma.steps == mb.steps);
  // The rollout and the training forward of one run still agree bit for bit
  // at every rollout's first optimizer step.
  for (size_t row = 0; row < mb.steps.size(); ++row) {
    CHECK(mb.series.at("train/log_prob_mean_abs_diff")[row] == 0.0);
    CHECK(mb.series.at("train/model_output_max_abs_diff")[row] == 0.0);
  }
  // Rollout 0 and the first optimizer step's forward run on the initial
  // weights: every metric is bitwise the unsplit run's, except the gradient
  // norm (the split adds the gradient's sums over tokens in another order).
  for (const auto& [name, values] : ma.series) {
    if (name.rfind("perf/", 0) == 0) continue;
    INFO("metric " << name);
    REQUIRE(mb.series.count(name) == 1);
    if (name != "train/grad_norm") CHECK(values[0] == mb.series.at(name)[0]);
  }
  CHECK(relative_difference(ma.series.at("train/grad_norm"), mb.series.at("train/grad_norm"), 0) < 1e-6);
  // After the first update the weights differ by that rounding: every metric
  // stays within this of the unsplit run's (the normalised advantages, divided
  // by a group std of ~0.05, move the most).
  const double tolerance = 1e-4;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, values] : ma.series) {
    if (name.rfind("perf/", 0) == 0) continue;
    INFO("metric " << name);
    const double d = relative_difference(values, mb.series.at(name), 1);
    CHECK(d <= tolerance);
    if (d > worst) worst = d, worst_name = name;
  }
  std::printf("sequence parallel e2e: worst relative metric difference %.3g (%s)\n", worst, worst_name.c_str());
}

TEST_CASE("sequence parallel: decks it cannot run are refused by check and by train on every rank",
          "[e2e][sequence][deck]") {
  const auto world = test::ditrl("check " + kDeck + " --ranks 4 --set parallel.sequence_parallel=3");
  CHECK(world.exit_code != 0);
  CHECK_THAT(world.output, Contains("parallel.sequence_parallel = 3 does not divide the world size 4"));
  const auto heads = test::ditrl("check " + kDeck + " --ranks 4 --set parallel.sequence_parallel=4");
  CHECK(heads.exit_code != 0);
  CHECK_THAT(heads.output, Contains("parallel.sequence_parallel = 4 does not divide wan's 2 attention heads"));
  const auto tokens = test::ditrl("check " + kDeck +
                                  " --ranks 4 --set parallel.sequence_parallel=2 --set rollout.height=14 --set "
                                  "rollout.width=30");  // 7 x 15 patches
  CHECK(tokens.exit_code != 0);
  CHECK_THAT(tokens.output, Contains("does not divide wan's 105 tokens per sample"));
  const auto family =
      test::ditrl("check " + test::e2e_deck("tiny_grpo.toml") + " --ranks 2 --set parallel.sequence_parallel=2");
  CHECK(family.exit_code != 0);
  CHECK_THAT(family.output, Contains("family 'sd3' has no sequence-parallel forward"));
  CHECK(test::ditrl("check " + kDeck + " --ranks 4 --set parallel.sequence_parallel=2").exit_code == 0);

  const std::string out = test::fresh_output_dir("e2e_sp_bad");
  const auto train = test::train(kDeck, out, 4, "--set parallel.sequence_parallel=3");
  CHECK(train.exit_code != 0);
  CHECK_THAT(train.output, Contains("parallel.sequence_parallel = 3 does not divide the world size 4"));
}
