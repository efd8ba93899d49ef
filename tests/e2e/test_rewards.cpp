// Several rewards and reward servers in whole runs (docs/rewards.md): a deck
// of three weighted [[reward]] entries, sampled by `ditrl rollout` on 2
// ranks, writes each reward's values, their weighted sum and the advantages,
// which equal a hand computation from those values in both combine modes;
// `ditrl train` writes each reward's metric series; an http reward scores a
// rollout through tests/fixtures/reward_server/faulty_server.py as computed
// here from the file's final latents, and `ditrl check` / `ditrl train`
// refuse an unreachable server or a mismatched input at start-up; the
// reference server (tools/reward_server.py) scores a user's function on the
// latents and on images decoded by tools/export_decoder.py's module.

#include <ditrl/io/h5.hpp>

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/script.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "e2e.hpp"
#include "reward_server.hpp"

using namespace ditrl;
using Catch::Matchers::Contains;

namespace {

constexpr double kWeights[] = {0.5, 2.0, -0.25};

// tiny_grpo.toml (8 samples: 2 prompts x 4) with `rewards` appended.
std::string deck_with(const std::string& dir, const std::string& rewards, const std::string& name = "deck.toml") {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << test::read_file(test::e2e_deck("tiny_grpo.toml")) << "\n" << rewards;
  return path;
}

std::string three_rewards() {
  return fmt::format(R"(
[[reward]]
name = "pattern"
analytic = "target_pattern"
weight = {}

[[reward]]
name = "bright"
analytic = "brightness"
weight = {}

[[reward]]
name = "smooth"
analytic = "smoothness"
weight = {}
)",
                     kWeights[0], kWeights[1], kWeights[2]);
}

test::ProcessResult rollout(const std::string& deck, const std::string& dir, int ranks, const std::string& args = "") {
  std::filesystem::create_directories(dir);
  return test::run_process(
      fmt::format("timeout 300 {} -np {} {} rollout {} --out {}/rollout.h5 --set run.out_dir={} {}", DITRL_MPIEXEC,
                  ranks, DITRL_BINARY, deck, dir, dir, args));
}

std::vector<double> doubles(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kDouble).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

at::Tensor dataset(const std::string& file, const std::string& name) {
  return io::h5::File::open(file).open_dataset(name).read();
}

// Per prompt group of G contiguous samples, (x - mean) / (population std + 1e-4): the deck's advantages, by hand.
std::vector<double> group_normalised(const std::vector<double>& r, size_t g) {
  std::vector<double> out;
  for (size_t first = 0; first < r.size(); first += g) {
    double mean = 0, var = 0;
    for (size_t i = first; i < first + g; ++i) mean += r[i] / static_cast<double>(g);
    for (size_t i = first; i < first + g; ++i) var += (r[i] - mean) * (r[i] - mean) / static_cast<double>(g);
    for (size_t i = first; i < first + g; ++i) out.push_back((r[i] - mean) / (std::sqrt(var) + 1e-4));
  }
  return out;
}

struct HandAdvantages {
  std::vector<double> weighted_sum, of_weighted_sum, normalized_sum;
};

HandAdvantages by_hand(const at::Tensor& values) {
  HandAdvantages h;
  const int64_t n = values.size(0);
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int64_t k = 0; k < 3; ++k) sum += kWeights[k] * values[i][k].item<double>();
    h.weighted_sum.push_back(sum);
  }
  h.of_weighted_sum = group_normalised(h.weighted_sum, 4);
  h.normalized_sum.assign(static_cast<size_t>(n), 0.0);
  for (int64_t k = 0; k < 3; ++k) {
    const std::vector<double> a = group_normalised(doubles(values.select(1, k)), 4);
    for (size_t i = 0; i < a.size(); ++i) h.normalized_sum[i] += kWeights[k] * a[i];
  }
  return h;
}

double max_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  bind(fd, reinterpret_cast<sockaddr*>(&address), length);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

}  // namespace

TEST_CASE("rewards: a multi-reward rollout's advantages equal a hand computation from its per-reward values",
          "[e2e][reward]") {
  for (const std::string combine : {"weighted_sum", "normalized_sum"}) {
    INFO("train.reward_combine = " << combine);
    const std::string dir = test::fresh_output_dir("rewards-multi-" + combine);
    const test::ProcessResult r =
        rollout(deck_with(dir, three_rewards()), dir, 2, "--set train.reward_combine=" + combine);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    const std::string file = dir + "/rollout.h5";
    CHECK(io::h5::File::open(file).string_attr("reward_names") == "pattern,bright,smooth");
    const at::Tensor values = dataset(file, "reward_values");
    REQUIRE(values.sizes() == at::IntArrayRef{8, 3});
    // The "bright" column is what it names: each sample's mean final latent.
    const at::Tensor final_latents = dataset(file, "final_latents");
    CHECK(at::allclose(values.select(1, 1), final_latents.flatten(1).mean(1), 1e-6, 1e-7));

    const HandAdvantages hand = by_hand(values);
    const std::vector<double> rewards = doubles(dataset(file, "rewards"));
    const std::vector<double> advantages = doubles(dataset(file, "advantages"));
    // fp32 rewards of magnitude ~1 and advantages of magnitude ~1: 1e-5 is ~10x their rounding.
    CHECK(max_difference(rewards, hand.weighted_sum) < 1e-5);
    const std::vector<double>& expected = combine == "weighted_sum" ? hand.of_weighted_sum : hand.normalized_sum;
    const std::vector<double>& other = combine == "weighted_sum" ? hand.normalized_sum : hand.of_weighted_sum;
    CHECK(max_difference(advantages, expected) < 1e-4);
    // Negative control: the other mode's hand computation does not match.
    CHECK(max_difference(advantages, other) > 1e-2);
  }
}

TEST_CASE("rewards: a multi-reward run writes each reward's series beside the weighted sum's", "[e2e][reward]") {
  const std::string dir = test::fresh_output_dir("rewards-train");
  const std::string deck = deck_with(dir, three_rewards());
  const test::ProcessResult r = test::train(deck, dir + "/run", 2, "--set train.num_rollouts=1");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const test::ProcessResult sampled = rollout(deck, dir + "/rollout", 2);
  INFO(sampled.output);
  REQUIRE(sampled.exit_code == 0);
  const at::Tensor values = dataset(dir + "/rollout/rollout.h5", "reward_values");
  const io::MetricsTable m = test::metrics_of(dir + "/run");
  const char* names[] = {"pattern", "bright", "smooth"};
  for (int64_t k = 0; k < 3; ++k) {
    INFO(names[k]);
    const auto series = m.series.find(fmt::format("rollout/reward/{}/raw_mean", names[k]));
    REQUIRE(series != m.series.end());
    // The run's rollout 0 is the standalone rollout 0 (same deck, seed and ranks).
    CHECK(series->second.front() == Approx(values.select(1, k).mean().item<double>()).epsilon(1e-5));
  }
  // The main series is the weighted sum's.
  CHECK(m.series.at("rollout/reward/raw_mean").front() ==
        Approx(dataset(dir + "/rollout/rollout.h5", "rewards").mean().item<double>()).epsilon(1e-5));
}

TEST_CASE("rewards: an http reward scores a rollout through a server and start-up refuses a bad one",
          "[e2e][reward][http]") {
  test::RewardServer server(test::faulty_reward_server_script(), {"--lifetime", "120"});
  const std::string dir = test::fresh_output_dir("rewards-http");
  const std::string judge = R"(
[[reward]]
name = "bright"
analytic = "brightness"

[[reward]]
name = "judge"
kind = "http"
batch_size = 3
timeout_s = 20
retries = 1
backoff_s = 0.1
url = ")";
  const test::ProcessResult r = rollout(deck_with(dir, judge + server.url("/reset_once/e2e") + "\"\n"), dir, 2);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // The server's function, computed here: sum of the final latents + 1000 x prompt index
  // (reset_once: the first request was dropped and retried).
  const std::string file = dir + "/rollout.h5";
  const at::Tensor expected = (dataset(file, "final_latents").to(at::kDouble).flatten(1).sum(1) +
                               1000.0 * dataset(file, "prompt_index").to(at::kDouble))
                                  .to(at::kFloat);
  CHECK(at::equal(dataset(file, "reward_values").select(1, 1).contiguous(), expected));

  const std::string unreachable = fmt::format("http://127.0.0.1:{}", free_port());
  const std::string bad_deck = deck_with(dir, judge + unreachable + "\"\n", "unreachable.toml");
  const test::ProcessResult check = test::ditrl(fmt::format("check {} --set run.out_dir={}/check", bad_deck, dir));
  CHECK(check.exit_code != 0);
  CHECK_THAT(check.output, Contains("reward judge: " + unreachable + "/health failed after 2 attempt(s)"));
  const std::string images_deck = deck_with(dir, judge + server.url("/health_images/e2e") + "\"\n", "images.toml");
  const test::ProcessResult train = test::train(images_deck, dir + "/run", 2, "--set train.num_rollouts=1");
  CHECK(train.exit_code != 0);
  CHECK_THAT(train.output, Contains("reward judge: " + server.url("/health_images/e2e/health") +
                                    " scores input \"images\" but the deck's reward judge sends input = \"latents\""));
  // Negative control: the same deck against a correct server passes the check.
  const std::string ok_deck = deck_with(dir, judge + server.url("/ok/e2e") + "\"\n", "ok.toml");
  const test::ProcessResult ok = test::ditrl(fmt::format("check {} --set run.out_dir={}/check", ok_deck, dir));
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK_THAT(ok.output, Contains("serves scorer faulty-ok"));
}

TEST_CASE("rewards: the reference server scores a user's function on latents and on images decoded by an exported VAE",
          "[e2e][reward][http]") {
  const std::string dir = test::fresh_output_dir("rewards-reference-server");
  // The user's function: each sample's sum (latents) or mean (images) + 1000 x the index its prompt text
  // ("synthetic prompt N") names, so the prompts must arrive in the samples' order.
  std::ofstream(dir + "/user_reward.py") << R"(
def score(data, prompts):
    per_sample = data.double().flatten(1)
    values = per_sample.sum(1) if data.is_floating_point() else per_sample.mean(1)
    return [float(v) + 1000.0 * int(p.split()[-1]) for v, p in zip(values, prompts)]
)";
  const std::string server_script = std::string(DITRL_SOURCE_DIR) + "/tools/reward_server.py";
  const std::string http = R"(
[[reward]]
name = "user"
kind = "http"
timeout_s = 20
retries = 1
backoff_s = 0.1
)";
  const std::string file = dir + "/latents/rollout.h5";
  {
    test::RewardServer server(server_script,
                              {"--function", dir + "/user_reward.py:score", "--input", "latents", "--port", "0"});
    const std::string deck = deck_with(dir, http + "url = \"" + server.url() + "\"\n", "latents.toml");
    const test::ProcessResult r = rollout(deck, dir + "/latents", 2);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  const at::Tensor index = dataset(file, "prompt_index").to(at::kDouble);
  const at::Tensor finals = dataset(file, "final_latents");
  CHECK(
      at::equal(dataset(file, "rewards"), (finals.to(at::kDouble).flatten(1).sum(1) + 1000.0 * index).to(at::kFloat)));

  // Images: tools/export_decoder.py's seeded tiny SD3 VAE decoder, run by ditrl, scored by the server.
  const std::string decoder = dir + "/decoder_sd3.pt";
  const test::ProcessResult exported = test::run_process(fmt::format(
      "{} {}/tools/export_decoder.py --family sd3 --tiny --out {}", DITRL_PYTHON, DITRL_SOURCE_DIR, decoder));
  INFO(exported.output);
  REQUIRE(exported.exit_code == 0);
  {
    test::RewardServer server(server_script,
                              {"--function", dir + "/user_reward.py:score", "--input", "images", "--port", "0"});
    const std::string deck =
        deck_with(dir, http + "input = \"images\"\ndecoder = \"" + decoder + "\"\nurl = \"" + server.url() + "\"\n",
                  "images.toml");
    const test::ProcessResult r = rollout(deck, dir + "/images", 2);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  const std::string images_file = dir + "/images/rollout.h5";
  // The same deck and seeds: the same samples; their pixels decoded here by the same module.
  REQUIRE(at::equal(dataset(images_file, "final_latents"), finals));
  torch::jit::Module module = torch::jit::load(decoder);
  const at::Tensor pixels = module.forward({finals.to(at::kFloat)}).toTensor();
  REQUIRE(pixels.scalar_type() == at::kByte);
  const at::Tensor expected = (pixels.to(at::kDouble).flatten(1).mean(1) + 1000.0 * index).to(at::kFloat);
  const at::Tensor got = dataset(images_file, "rewards");
  CHECK(at::equal(got, expected));
  // Negative control: the latents' scores are not the images'.
  CHECK_FALSE(at::equal(got, dataset(file, "rewards")));
}
