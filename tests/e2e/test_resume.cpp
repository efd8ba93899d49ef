// What a run promises about its checkpoints and metrics beyond the plain
// resume: the rows after the last checkpoint are dropped and recomputed,
// checkpoint.keep prunes, a reshard to another rank count moves parameters
// and AdamW moments bit for bit and trains on bit for bit, corruption anywhere in a checkpoint is
// named, non-finite steps are skipped or stop the run on every rank, and
// deterministic mode pins the CPU kernels' environment.
#include <ditrl/io/standard.hpp>

#include <catch2/catch.hpp>

#include "corrupt.hpp"
#include "e2e.hpp"

#include <cmath>
#include <fstream>

using namespace ditrl;
using Catch::Matchers::Contains;
using test::data_offset;
using test::flip_byte;
using test::read_file;

namespace {

const std::string kDeck = test::e2e_deck("tiny_grpo.toml");

std::vector<std::string> checkpoint_files(const std::string& out) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(out + "/checkpoints"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// h5diff of one group of two checkpoints: 0 when every dataset is bitwise equal.
int h5diff(const std::string& a, const std::string& b, const std::string& group) {
  const auto r = test::run_process("h5diff " + a + " " + b + " " + group);
  INFO(r.output);
  return r.exit_code;
}

}  // namespace

TEST_CASE("resume: rows after the last checkpoint are dropped and recomputed / checkpoint.keep prunes",
          "[e2e][resume][checkpoint]") {
  // Checkpoints after rollouts 3 and 6 only, one kept.
  const std::string deck_args = "--set train.num_rollouts=6 --set checkpoint.every=3 --set checkpoint.keep=1";
  const std::string a = test::fresh_output_dir("e2e_drop_a"), b = test::fresh_output_dir("e2e_drop_b");
  REQUIRE(test::train(kDeck, a, 2, deck_args).exit_code == 0);
  CHECK(checkpoint_files(a) == std::vector<std::string>{"latest", "step-6.h5"});

  // Killed while writing its last checkpoint: rows 0-4 are on disk, `latest`
  // is step 3, so rows 3 and 4 belong to the interrupted run.
  const auto killed = test::train(kDeck, b, 2, deck_args, "DITRL_TEST_KILL_IN_CHECKPOINT=1:6");
  CHECK(killed.exit_code != 0);
  CHECK(read_file(b + "/checkpoints/latest") == "step-3.h5\n");
  CHECK(test::metrics_of(b).steps == std::vector<int64_t>{0, 1, 2, 3, 4});
  const auto resumed = test::train(kDeck, b, 2, deck_args + " --resume latest");
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from " + b + "/checkpoints/step-3.h5"));

  // Every recorded series equals the uninterrupted run's bit for bit, and so
  // do the final parameters and moments; step-3 was pruned after step-6.
  const std::vector<std::string> problems =
      io::check_standard(io::make_standard(test::metrics_of(a), ""), test::metrics_of(b));
  for (const std::string& p : problems) INFO(p);
  CHECK(problems.empty());
  CHECK(h5diff(a + "/checkpoints/step-6.h5", b + "/checkpoints/step-6.h5", "/model") == 0);
  CHECK(h5diff(a + "/checkpoints/step-6.h5", b + "/checkpoints/step-6.h5", "/optimizer") == 0);
  CHECK(h5diff(a + "/checkpoints/step-6.h5", b + "/checkpoints/step-6.h5", "/rng") == 0);
  CHECK(checkpoint_files(b) == std::vector<std::string>{"latest", "step-6.h5"});
}

TEST_CASE("resume: a 2-rank checkpoint resharded to 1 and 4 ranks keeps /model and /optimizer bitwise",
          "[e2e][resume]") {
  const std::string a = test::fresh_output_dir("e2e_reshard_ref");
  REQUIRE(test::train(kDeck, a, 2).exit_code == 0);
  const io::MetricsTable reference = test::metrics_of(a);
  for (int ranks : {1, 4}) {
    INFO(ranks << " ranks");
    const std::string b = test::fresh_output_dir("e2e_reshard_to_" + std::to_string(ranks));
    REQUIRE(test::train(kDeck, b, 2, "--max-rollouts 2").exit_code == 0);
    const std::string step2 = b + "/checkpoints/step-2.h5";

    // Loaded by `ranks` ranks and written back by them after a rollout whose
    // optimizer step is skipped: what they hold is what 2 ranks wrote.
    const auto held =
        test::train(kDeck, b, ranks, "--set train.num_rollouts=3 --set debug.skip_optimizer_step=true --resume latest");
    INFO(held.output);
    REQUIRE(held.exit_code == 0);
    CHECK_THAT(held.output, Contains("written by 2 rank(s)"));
    CHECK(h5diff(step2, b + "/checkpoints/step-3.h5", "/model") == 0);
    CHECK(h5diff(step2, b + "/checkpoints/step-3.h5", "/optimizer") == 0);

    // Trained on from step 2 at `ranks` ranks: the step's sums are the same
    // tree at every power-of-two rank count (rl/loss_window.hpp) and the
    // gradient norm is exact, so the resumed run continues the uninterrupted
    // one bit for bit, rows and checkpoints.
    const auto trained = test::train(kDeck, b, ranks, "--resume " + step2);
    INFO(trained.output);
    REQUIRE(trained.exit_code == 0);
    const io::MetricsTable m = test::metrics_of(b);
    REQUIRE(m.steps == reference.steps);
    CHECK(io::check_standard(io::make_standard(reference, ""), m).empty());
    CHECK(m.series.at("train/log_prob_mean_abs_diff")[3] == 0.0);
    CHECK(h5diff(a + "/checkpoints/step-4.h5", b + "/checkpoints/step-4.h5", "/model") == 0);
    CHECK(h5diff(a + "/checkpoints/step-4.h5", b + "/checkpoints/step-4.h5", "/optimizer") == 0);
  }
}

TEST_CASE("resume: a flipped byte in /optimizer or /rng is named on load", "[e2e][checkpoint]") {
  const std::string out = test::fresh_output_dir("e2e_corrupt_state");
  REQUIRE(test::train(kDeck, out, 2, "--set train.num_rollouts=2").exit_code == 0);
  const std::string step2 = out + "/checkpoints/step-2.h5", step1 = out + "/checkpoints/step-1.h5";
  for (const std::string dataset : {"/optimizer/transformer_blocks.0.attn.to_q.weight/exp_avg_sq", "/rng/torch_cpu"}) {
    INFO(dataset);
    const std::string copy = out + "/checkpoints/step-2-copy.h5";
    std::filesystem::copy_file(step2, copy, std::filesystem::copy_options::overwrite_existing);
    flip_byte(copy, data_offset(copy, dataset));
    const auto r = test::train(kDeck, out, 2, "--set train.num_rollouts=3 --resume " + copy);
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.output, Contains("is corrupted: reading " + dataset));
    std::filesystem::remove(copy);
  }
  // The undamaged checkpoint still loads.
  const auto ok = test::train(kDeck, out, 2, "--set train.num_rollouts=3 --resume " + step1);
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("train: a non-finite loss on one rank skips the step on every rank / or stops the run", "[e2e][train]") {
  // Rank 1's loss is NaN at optimizer step 0: the gradient norm (reduced over
  // ranks) is NaN everywhere, so no rank updates. Rollout 1 then samples
  // with the initial weights, like a run whose optimizer never steps.
  const std::string out = test::fresh_output_dir("e2e_nonfinite_skip");
  const auto skipped = test::train(kDeck, out, 2, "--set train.num_rollouts=2", "DITRL_TEST_NONFINITE_LOSS=1:0");
  INFO(skipped.output);
  REQUIRE(skipped.exit_code == 0);
  CHECK_THAT(skipped.output, Contains("rollout 0: non-finite gradient norm nan; optimizer step skipped (1 so far)"));
  const io::MetricsTable m = test::metrics_of(out);
  CHECK(std::isnan(m.series.at("train/grad_norm")[0]));
  CHECK(std::isfinite(m.series.at("train/grad_norm")[1]));
  CHECK(m.series.at("train/skipped_steps") == std::vector<double>{1.0, 1.0});

  const std::string frozen = test::fresh_output_dir("e2e_nonfinite_frozen");
  REQUIRE(test::train(kDeck, frozen, 2, "--set train.num_rollouts=2 --set debug.skip_optimizer_step=true").exit_code ==
          0);
  const io::MetricsTable f = test::metrics_of(frozen);
  CHECK(m.series.at("rollout/reward/raw_mean")[1] == f.series.at("rollout/reward/raw_mean")[1]);

  const std::string stop = test::fresh_output_dir("e2e_nonfinite_stop");
  const auto stopped = test::train(kDeck, stop, 2, "--set train.num_rollouts=2 --set train.on_nonfinite=stop",
                                   "DITRL_TEST_NONFINITE_LOSS=1:1");
  INFO(stopped.output);
  CHECK(stopped.exit_code != 0);
  CHECK_THAT(stopped.output, Contains("rollout 1: the gradient norm is nan") &&
                                 Contains("stopping as train.on_nonfinite = \"stop\" asks"));
  CHECK(read_file(stop + "/status") != "complete\n");
}

TEST_CASE("train: deterministic mode re-executes with the CPU kernels pinned / keeps what the user set",
          "[e2e][determinism]") {
  const std::string args = "--set train.num_rollouts=1 --set checkpoint.every=0";
  const std::string pinned =
      "deterministic: ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT OMP_NUM_THREADS=1 "
      "MKL_NUM_THREADS=1 CUBLAS_WORKSPACE_CONFIG=:4096:8";
  const std::string a = test::fresh_output_dir("e2e_pins_default");
  const auto plain = test::train(kDeck, a, 2, args, "env -u ATEN_CPU_CAPABILITY -u OMP_NUM_THREADS -u MKL_CBWR");
  INFO(plain.output);
  REQUIRE(plain.exit_code == 0);
  // Read back by the re-executed process, and in effect in LibTorch (its
  // thread pool and kernel dispatch read them at load).
  CHECK_THAT(plain.output, Contains("1 intra-op thread(s), " + pinned));
  CHECK_THAT(plain.output, Contains("ATen CPU capability AVX2"));
  CHECK_THAT(plain.output, !Contains("without STRICT"));

  const std::string b = test::fresh_output_dir("e2e_pins_user");
  const auto user =
      test::train(kDeck, b, 2, args + " --set run.threads=2", "ATEN_CPU_CAPABILITY=default MKL_CBWR=AVX2");
  INFO(user.output);
  REQUIRE(user.exit_code == 0);
  CHECK_THAT(user.output, Contains("2 intra-op thread(s), deterministic: ATEN_CPU_CAPABILITY=default MKL_CBWR=AVX2 "
                                   "OMP_NUM_THREADS=2"));
  CHECK_THAT(user.output, Contains("ATen CPU capability DEFAULT"));
  // A non-strict MKL mode is the user's to keep, but not silently.
  CHECK_THAT(user.output, Contains("MKL_CBWR=AVX2 from the environment is kept, but without STRICT"));

  const std::string c = test::fresh_output_dir("e2e_pins_off");
  const auto off = test::train(kDeck, c, 2, args + " --set run.deterministic=false");
  INFO(off.output);
  REQUIRE(off.exit_code == 0);
  CHECK_THAT(off.output, !Contains("deterministic:"));
}
