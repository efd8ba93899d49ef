// Trajectory files for every kernel and loss (`ditrl rollout`, then `ditrl
// train --trajectories`): pure ODE (NFT, sde = "ode"), Flow-SDE, CPS; the
// initial noise is always in the file, empty datasets keep their zero
// extent, a failed write leaves nothing under the final name. Also where a
// standalone rollout puts its parity dumps, and the progress line's
// first-step log-prob figure.
#include <ditrl/io/h5.hpp>
#include <ditrl/io/standard.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <filesystem>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

const std::string kDeck = test::e2e_deck("tiny_grpo.toml");
const std::string kNftDeck = std::string(DITRL_SOURCE_DIR) + "/tests/standards/proxy_sd3_nft.toml";

test::ProcessResult rollout(const std::string& deck, const std::string& out_dir, const std::string& traj, int ranks,
                            const std::string& args = "") {
  return test::run_process(fmt::format("timeout 600 {} -np {} {} rollout {} --out {} --set run.out_dir={} {}",
                                       DITRL_MPIEXEC, ranks, DITRL_BINARY, deck, traj, out_dir, args));
}

std::vector<hsize_t> shape_of(const std::string& path, const std::string& dataset) {
  return io::h5::File::open(path).open_dataset(dataset).shape();
}

std::vector<int64_t> longs(const std::string& path, const std::string& dataset) {
  const at::Tensor t = io::h5::File::open(path).open_dataset(dataset).read().to(at::kLong).contiguous();
  return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
}

// A rollout written by `ditrl rollout` and trained on equals the run that
// sampled it itself, metric for metric, bit for bit.
void check_replay(const std::string& deck, const std::string& dir, const std::string& sets) {
  const std::string traj = dir + "/rollout-0.h5";
  const auto written = rollout(deck, dir, traj, 2, sets);
  INFO(written.output);
  REQUIRE(written.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(traj + ".tmp"));
  CHECK(longs(traj, "latent_steps").front() == 0);  // x_0, the initial noise
  const auto from_file = test::train(
      deck, dir + "/file", 2, sets + " --set train.num_rollouts=1 --trajectories " + dir + "/rollout-{rollout}.h5");
  INFO(from_file.output);
  REQUIRE(from_file.exit_code == 0);
  const auto sampled = test::train(deck, dir + "/sampled", 2, sets + " --set train.num_rollouts=1");
  REQUIRE(sampled.exit_code == 0);
  const io::MetricsTable a = test::metrics_of(dir + "/file"), b = test::metrics_of(dir + "/sampled");
  REQUIRE(a.steps == b.steps);
  CHECK(io::check_standard(io::make_standard(b, ""), a).empty());
}

}  // namespace

TEST_CASE("trajectories: the NFT proxy's pure-ODE rollout is written whole and trains like a sampled one",
          "[e2e][trajectories]") {
  const std::string dir = test::fresh_output_dir("e2e_traj_nft");
  check_replay(kNftDeck, dir, "");
  const std::string traj = dir + "/rollout-0.h5";
  CHECK(shape_of(traj, "sde_steps") == std::vector<hsize_t>{0});
  CHECK(shape_of(traj, "log_probs") == std::vector<hsize_t>{8, 0});
  CHECK(longs(traj, "latent_steps") == std::vector<int64_t>{0, 6});
  // x_0 is the sample's initial noise: standard normal draws.
  const at::Tensor x0 = io::h5::File::open(traj).open_dataset("latents").read().select(1, 0);
  CHECK(std::abs(x0.std().item<double>() - 1.0) < 0.1);
}

TEST_CASE("trajectories: GRPO with sde = ode writes an empty SDE set - CPS rollouts replay exactly",
          "[e2e][trajectories]") {
  const std::string dir = test::fresh_output_dir("e2e_traj_kernels");
  const std::string ode = dir + "/ode.h5";
  const auto written = rollout(kDeck, dir, ode, 2, "--set rollout.sde=ode --set rollout.sde_steps=0");
  INFO(written.output);
  REQUIRE(written.exit_code == 0);
  CHECK(shape_of(ode, "sde_steps") == std::vector<hsize_t>{0});
  CHECK(longs(ode, "latent_steps") == std::vector<int64_t>{0, 6});
  check_replay(kDeck, dir + "/cps", "--set rollout.sde=cps --set rollout.noise_level=0.7");
}

TEST_CASE("trajectories: a write that fails leaves no file under the final name", "[e2e][trajectories]") {
  const std::string dir = test::fresh_output_dir("e2e_traj_fail");
  const std::string traj = dir + "/rollout.h5";
  // The file-size limit (RLIMIT_FSIZE) stops the writer part-way: a real
  // failed write, as a full disk gives.
  const auto r =
      test::run_process(fmt::format("bash -c 'ulimit -f 64; timeout 300 {} rollout {} --out {} --set "
                                    "run.out_dir={}'",
                                    DITRL_BINARY, kDeck, traj, dir));
  CHECK(r.exit_code != 0);
  CHECK_FALSE(std::filesystem::exists(traj));
}

TEST_CASE("rollout: a standalone rollout's parity dumps go to its own folder", "[e2e][trajectories][dump]") {
  const std::string dir = test::fresh_output_dir("e2e_traj_dump");
  const std::string traj = dir + "/traj.h5";
  const auto r = rollout(kDeck, dir, traj, 2, "--set debug.dump=true");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(std::filesystem::exists(dir + "/traj-debug/dump-rank0.h5"));
  CHECK(std::filesystem::exists(dir + "/traj-debug/dump-rank1.h5"));
  CHECK_FALSE(std::filesystem::exists(dir + "/debug"));  // the training run's folder is left alone
  const auto chosen = rollout(kDeck, dir, dir + "/b.h5", 2, "--set debug.dump=true --dump-dir " + dir + "/mine");
  REQUIRE(chosen.exit_code == 0);
  CHECK(std::filesystem::exists(dir + "/mine/dump-rank1.h5"));
}

TEST_CASE("train: the progress line shows the first optimizer step's log-prob difference / labelled", "[e2e][train]") {
  const std::string dir = test::fresh_output_dir("e2e_progress");
  const auto r = test::train(kDeck, dir, 2,
                             "--set train.num_rollouts=1 --set train.global_batch=4 --set train.steps_per_rollout=2");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Two optimizer steps: the first is the parity figure (0: rollout and
  // training forwards agree), the second includes the first update.
  CHECK_THAT(r.output, Contains("lp_diff@step0 0 (last "));
  const io::MetricsTable m = test::metrics_of(dir);
  REQUIRE(m.steps.size() == 2);
  CHECK(m.series.at("train/log_prob_mean_abs_diff")[0] == 0.0);
  CHECK(m.series.at("train/log_prob_mean_abs_diff")[1] > 0.0);
}
