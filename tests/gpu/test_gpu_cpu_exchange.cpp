// The GPU and the CPU run one deck interchangeably (issue #17 points 6 and 8):
// both draw the same initial and SDE noise, so `ditrl align` pairs a GPU run's
// tensors with a CPU run's within fp32 rounding, and a checkpoint written on
// one device resumes on the other. Each case SKIPs where no GPU is visible.
#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include "e2e.hpp"

#include <cmath>
#include <map>

#include "measured.hpp"

using namespace ditrl;
namespace json = boost::json;
using Catch::Matchers::Contains;
using test::read_file;

namespace {

const std::string kDeck = test::e2e_deck("tiny_grpo.toml");

std::string on(const std::string& device) {
  return "--set run.device=" + device;
}

}  // namespace

// Deterministic mode turns TF32 off on the GPU, so the two runs differ only by
// fp32 summation order (measured peaks are far below 1e-2); a different noise
// draw moves the first block's output by O(1).
TEST_CASE("gpu: a GPU run and a CPU run of one deck draw the same noise and align within fp32 rounding",
          "[gpu][noise][align]") {
  std::map<std::string, std::string> dumps;
  for (const std::string device : {"cpu", "cuda"}) {
    const std::string out = test::fresh_output_dir("gpu_align_" + device);
    const auto r = test::train(kDeck, out, 1,
                               on(device) + " --set train.num_rollouts=1 --set precision.attention=math" +
                                   " --set debug.dump=true --set 'debug.samples=[0,3]'");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(read_file(out + "/logs/rank-0.log"), Contains("device " + device));
    dumps[device] = out + "/debug/dump-rank0.h5";
  }
  const auto aligned = test::ditrl("align " + dumps["cuda"] + " " + dumps["cpu"] + " --sides rollout,rollout --json");
  INFO(aligned.output);
  REQUIRE(aligned.exit_code == 0);
  const json::object r = json::parse(aligned.output).as_object();
  CHECK(r.at("pairs").as_int64() > 0);
  CHECK(r.at("only_a").as_array().empty());
  CHECK(r.at("only_b").as_array().empty());
  REQUIRE(r.at("peak_rel").is_double());
  // Measured: printed ("measured:"), not yet recorded from a GPU run.
  ditrl::test::print_measured("align peak_rel, GPU run against CPU run", r.at("peak_rel").as_double(), "1e-2");
  CHECK(r.at("peak_rel").as_double() < 1e-2);
}

// Rollouts 3 and 4 after a cross-device resume see the same noise as the
// uninterrupted run on the first device (the CPU generators' states travel in
// the checkpoint) and weights equal to fp32 rounding, so their rewards agree
// to 1e-3; a lost generator state or a mis-restored shard moves them by
// percents.
TEST_CASE("gpu: a checkpoint written on the GPU resumes on the CPU and one written on the CPU resumes on the GPU",
          "[gpu][resume][checkpoint]") {
  for (const auto& [first, second] : {std::pair<std::string, std::string>{"cuda", "cpu"}, {"cpu", "cuda"}}) {
    INFO("written on " << first << ", resumed on " << second);
    const std::string whole = test::fresh_output_dir("gpu_cross_whole_" + first);
    const std::string split = test::fresh_output_dir("gpu_cross_split_" + first);
    REQUIRE(test::train(kDeck, whole, 1, on(first)).exit_code == 0);
    REQUIRE(test::train(kDeck, split, 1, on(first) + " --max-rollouts 2").exit_code == 0);
    const auto resumed = test::train(kDeck, split, 1, on(second) + " --resume latest");
    INFO(resumed.output);
    REQUIRE(resumed.exit_code == 0);
    CHECK_THAT(resumed.output, Contains("resumed from " + split + "/checkpoints/step-2.h5"));
    CHECK(read_file(split + "/status") == "complete\n");
    const io::MetricsTable a = test::metrics_of(whole), b = test::metrics_of(split);
    REQUIRE(a.steps == b.steps);
    const std::vector<double>&ra = a.series.at("rollout/reward/raw_mean"), &rb = b.series.at("rollout/reward/raw_mean");
    for (size_t row : {0, 1}) CHECK(rb[row] == ra[row]);  // written on the first device by both runs
    for (size_t row : {2, 3}) {
      INFO("rollout " << row << ": " << rb[row] << " resumed, " << ra[row] << " uninterrupted");
      // Measured: printed ("measured:"), not yet recorded from a GPU run.
      ditrl::test::print_measured(
          fmt::format("rollout {} reward after a resume written on {}, relative diff", row, first),
          std::abs(rb[row] - ra[row]) / std::abs(ra[row]), "1e-3");
      CHECK(std::abs(rb[row] - ra[row]) <= 1e-3 * std::abs(ra[row]));
    }
  }
}
