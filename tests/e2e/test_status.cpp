// `ditrl status RUN_DIR` on real runs of the quickstart deck: what it reports
// after a run stopped by --max-rollouts, a damaged checkpoint, a missing
// metrics file, a folder that is not a run, and a job that trains while it
// is read (the job must neither fail nor change a bit).
#include <ditrl/io/standard.hpp>

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include "corrupt.hpp"
#include "e2e.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

const std::string kQuickstart = std::string(DITRL_SOURCE_DIR) + "/inputs/quickstart.toml";

boost::json::object status_json(const std::string& out) {
  const auto r = test::ditrl("status --json " + out);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return boost::json::parse(r.output).as_object();
}

// The quickstart stopped after `rollouts` rollouts (a checkpoint at the stop).
std::string stopped_quickstart(const std::string& name, int rollouts) {
  const std::string out = test::fresh_output_dir(name);
  const auto r = test::train(kQuickstart, out, 2, fmt::format("--max-rollouts {}", rollouts));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return out;
}

}  // namespace

TEST_CASE("status: a stopped quickstart run shows its progress / reward trend / verified checkpoint and state",
          "[e2e][status]") {
  const std::string out = stopped_quickstart("e2e_status_stopped", 3);
  const auto text = test::ditrl("status " + out);
  INFO(text.output);
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.output, Contains("state        preempted (status file: preempted)"));
  CHECK_THAT(text.output, Contains("rollout 3/150 done, optimizer step 2"));
  CHECK_THAT(text.output, Contains("(the last 3)"));
  CHECK_THAT(text.output, Contains("step-3.h5 (step 3): verifies (resumes at rollout 3)"));
  CHECK_THAT(text.output, Contains("skipped      0 optimizer step(s)"));
  CHECK_THAT(text.output, Contains("rollouts/h, ETA"));

  const boost::json::object s = status_json(out);
  CHECK(s.at("name").as_string() == "quickstart");
  CHECK(s.at("state").as_string() == "preempted");
  CHECK(s.at("preempted").as_bool());
  CHECK(s.at("num_rollouts").as_int64() == 150);
  CHECK(s.at("rollouts_done").as_int64() == 3);
  CHECK(s.at("last_step").as_int64() == 2);
  CHECK(s.at("skipped_steps").as_int64() == 0);
  CHECK(s.at("checkpoint").at("verifies").as_bool());
  CHECK(s.at("checkpoint").at("next_rollout").as_int64() == 3);
  CHECK(s.at("rollouts_per_hour").as_double() > 0);
  CHECK(s.at("eta_hours").as_double() > 0);
  // The trend over 3 rollouts is the metrics' own reward means.
  const io::MetricsTable m = test::metrics_of(out);
  const std::vector<double>& reward = m.series.at("rollout/reward/raw_mean");
  const double mean = (reward[0] + reward[1] + reward[2]) / 3;
  CHECK(s.at("reward_first").as_double() == Approx(mean).epsilon(1e-12));
  CHECK(s.at("reward_last").as_double() == Approx(mean).epsilon(1e-12));

  // Resumed to the end: complete, nothing left to wait for.
  const auto rest = test::train(kQuickstart, out, 2, "--resume latest --set train.num_rollouts=5");
  REQUIRE(rest.exit_code == 0);
  const boost::json::object done = status_json(out);
  CHECK(done.at("state").as_string() == "complete");
  CHECK_FALSE(done.at("preempted").as_bool());
  CHECK(done.at("num_rollouts").as_int64() == 5);
  CHECK(done.at("rollouts_done").as_int64() == 5);
  CHECK(done.at("eta_hours").is_null());
}

TEST_CASE("status: a damaged checkpoint is reported as not verifying / a missing metrics file as absent",
          "[e2e][status]") {
  const std::string out = stopped_quickstart("e2e_status_damaged", 2);
  const std::string checkpoint = out + "/checkpoints/step-2.h5";
  const std::string dataset = "/model/transformer_blocks.0.attn.to_q.weight";
  test::flip_byte(checkpoint, test::data_offset(checkpoint, dataset));
  const auto text = test::ditrl("status " + out);
  INFO(text.output);
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.output, Contains("step-2.h5 (step 2): DOES NOT VERIFY"));
  CHECK_THAT(text.output, Contains(dataset));
  const boost::json::object damaged = status_json(out);
  CHECK_FALSE(damaged.at("checkpoint").at("verifies").as_bool());
  CHECK_THAT(std::string(damaged.at("checkpoint").at("problem").as_string()), Contains("do not match their SHA-256"));
  // --no-verify does not read it.
  const auto unchecked = test::ditrl("status --no-verify " + out);
  CHECK_THAT(unchecked.output, Contains("not verified (--no-verify)"));

  std::filesystem::remove(out + "/metrics.h5");
  const auto no_metrics = test::ditrl("status " + out);
  INFO(no_metrics.output);
  REQUIRE(no_metrics.exit_code == 0);
  CHECK_THAT(no_metrics.output, Contains("metrics.h5   absent"));
  const boost::json::object s = status_json(out);
  CHECK(s.at("metrics_problem").as_string() == "absent");
  CHECK(s.at("rollouts_done").as_int64() == 0);
  CHECK(s.at("name").as_string() == "quickstart");  // from the checkpoint's deck
}

TEST_CASE("status: a folder that is not a run / or no folder is refused naming it", "[e2e][status]") {
  const std::string empty = test::fresh_output_dir("e2e_status_not_a_run");
  const auto r = test::ditrl("status " + empty);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Contains(empty + ": not a ditrl run folder"));
  const auto missing = test::ditrl("status " + empty + "/nothing");
  CHECK(missing.exit_code == 1);
  CHECK_THAT(missing.output, Contains(empty + "/nothing: no such folder"));
  const auto file = test::ditrl("status " + kQuickstart);
  CHECK(file.exit_code == 1);
  CHECK_THAT(file.output, Contains("not a folder"));
}

TEST_CASE("status: read again and again while the job trains / it sees the job running and changes none of its bits",
          "[e2e][status]") {
  const std::string reference = test::fresh_output_dir("e2e_status_reference");
  const std::string watched = test::fresh_output_dir("e2e_status_watched");
  const std::string args = "--set checkpoint.every=3 --max-rollouts 12";
  REQUIRE(test::train(kQuickstart, reference, 1, args).exit_code == 0);

  std::atomic<bool> done{false};
  test::ProcessResult job;
  std::thread trainer([&] {
    job = test::train(kQuickstart, watched, 1, args);
    done = true;
  });
  int reads = 0, running = 0, failed = 0;
  std::string failure;
  while (!done) {
    if (std::filesystem::exists(watched + "/metrics.h5")) {
      const auto r = test::ditrl("status --json " + watched);
      ++reads;
      if (r.exit_code != 0) {
        ++failed;
        failure = r.output;
      } else if (boost::json::parse(r.output).at("state").as_string() == "running") {
        ++running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  trainer.join();
  INFO(job.output);
  INFO(failure);
  REQUIRE(job.exit_code == 0);
  CHECK(failed == 0);
  CHECK(reads >= 5);
  CHECK(running >= 5);
  const io::Standard undisturbed = io::make_standard(test::metrics_of(reference), "");
  CHECK(io::check_standard(undisturbed, test::metrics_of(watched)).empty());
  const auto diff = test::run_process("h5diff " + reference + "/checkpoints/step-12.h5 " + watched +
                                      "/checkpoints/step-12.h5 /model");
  CHECK(diff.exit_code == 0);
}

TEST_CASE("status: a job killed mid-run is reported as stopped / not as preempted", "[e2e][status]") {
  const std::string out = test::fresh_output_dir("e2e_status_killed");
  std::atomic<bool> done{false};
  test::ProcessResult job;
  std::thread trainer([&] {
    job = test::train(kQuickstart, out, 1, "--max-rollouts 40");
    done = true;
  });
  // Rank 0 names itself in OUT/.lock; once it has written a row, SIGKILL it (no checkpoint, no status).
  int64_t pid = 0;
  while (!done && pid == 0) {
    const std::string lock = test::read_file(out + "/.lock");
    const size_t at = lock.find("PID ");
    if (at != std::string::npos && std::filesystem::exists(out + "/metrics.h5")) pid = std::stoll(lock.substr(at + 4));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  REQUIRE(pid > 0);
  REQUIRE(::kill(static_cast<pid_t>(pid), SIGKILL) == 0);
  trainer.join();
  CHECK(job.exit_code != 0);
  const boost::json::object s = status_json(out);
  CHECK(s.at("state").as_string() == "stopped");
  CHECK_FALSE(s.at("preempted").as_bool());
  CHECK(s.at("status_file").as_string() == "");
}
