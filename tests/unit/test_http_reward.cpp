// The http reward kind against tests/fixtures/reward_server/faulty_server.py:
// a correct server's scores equal the same function computed here, whether
// asked at once or started per micro-group while "sampling" goes on; every
// broken answer is a named error or a retried request (never a hang, a
// silent zero or a lost sample); the start-up health check refuses an
// unreachable server, another protocol and a mismatched input by the
// reward's name and URL.

#include <ditrl/error.hpp>
#include <ditrl/rollout/http_reward.hpp>
#include <ditrl/rollout/reward_set.hpp>

#include <ATen/ATen.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <fstream>
#include <thread>

#include "process.hpp"
#include "reward_server.hpp"

using Catch::Matchers::Contains;
using namespace ditrl;
using namespace ditrl::rollout;

namespace {

// One server per test process (CTest runs each case as its own process);
// each case uses its own URL path, so the server's per-path counters start fresh.
test::RewardServer& server() {
  static test::RewardServer s(test::faulty_reward_server_script(), {"--slow-s", "3", "--lifetime", "120"});
  return s;
}

RewardOptions http_options(const std::string& path) {
  RewardOptions o;
  o.name = "judge";
  o.kind = RewardKind::Http;
  o.url = server().url(path);
  o.timeout_s = 10;
  o.retries = 2;
  o.backoff_s = 0.05;
  o.family = "sd3";
  return o;
}

struct Samples {
  at::Tensor latents;       // [8, 4, 2, 2]
  at::Tensor prompt_index;  // [8]
  std::vector<std::string> texts;
};

Samples samples() {
  at::manual_seed(5);
  Samples s{at::randn({8, 4, 2, 2}), at::tensor(std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3}, at::kLong), {}};
  for (int i = 0; i < 8; ++i) s.texts.push_back(i % 3 ? "a \"quoted\" prompt" : "prompt ünïcode");
  return s;
}

// What faulty_server.py's correct modes compute: sum of each sample's
// latents + 1000 x its prompt index, in float64, then rounded to fp32.
at::Tensor expected_latent_scores(const Samples& s) {
  return (s.latents.to(at::kDouble).flatten(1).sum(1) + 1000.0 * s.prompt_index.to(at::kDouble)).to(at::kFloat);
}

std::string error_of(const RewardOptions& o) {
  const Samples s = samples();
  try {
    make_reward(o)->score(s.latents, s.prompt_index, s.texts);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("http reward: a correct server's scores equal the in-process computation", "[reward][http]") {
  const Samples s = samples();
  for (int64_t batch_size : {0, 3}) {
    INFO("batch_size = " << batch_size);
    RewardOptions o = http_options("/ok/batch" + std::to_string(batch_size));
    o.batch_size = batch_size;
    const at::Tensor scores = make_reward(o)->score(s.latents, s.prompt_index, s.texts);
    // The server sums in float64 and rounds once, as expected_latent_scores does.
    CHECK(at::equal(scores, expected_latent_scores(s)));
  }
}

TEST_CASE("http reward: requests started per micro-group join in order to the scores of one request",
          "[reward][http]") {
  const Samples s = samples();
  std::vector<WeightedReward> one;
  one.push_back({"judge", 1.0, make_reward(http_options("/ok/overlap"))});
  RewardSet rewards(std::move(one), true, RewardCombine::WeightedSum);
  REQUIRE(rewards.overlaps_sampling());
  rewards.begin_rollout(3);
  for (int64_t first = 0; first < 8; first += 2)
    rewards.start(s.latents.narrow(0, first, 2), s.prompt_index.narrow(0, first, 2),
                  {s.texts.begin() + first, s.texts.begin() + first + 2});
  const at::Tensor values = rewards.finish(s.latents, s.prompt_index, s.texts);
  REQUIRE(values.sizes() == at::IntArrayRef{8, 1});
  CHECK(at::equal(values.select(1, 0), expected_latent_scores(s)));
  // Negative control: the order matters, so a join out of order would show.
  CHECK_FALSE(at::equal(values.select(1, 0).flip(0), expected_latent_scores(s)));
}

TEST_CASE("http reward: a micro-group's request is in flight while the next one samples", "[reward][http]") {
  // Four micro-groups, each "sampled" in 0.3 s, each scored by a server that takes 0.3 s.
  const Samples s = samples();
  auto run = [&](bool overlapped) {
    std::vector<WeightedReward> one;
    one.push_back({"judge", 1.0, make_reward(http_options(overlapped ? "/delay/overlapped" : "/delay/serial"))});
    RewardSet rewards(std::move(one), true, RewardCombine::WeightedSum);
    rewards.begin_rollout(0);
    std::vector<at::Tensor> serial;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t first = 0; first < 8; first += 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const at::Tensor latents = s.latents.narrow(0, first, 2), index = s.prompt_index.narrow(0, first, 2);
      const std::vector<std::string> texts(s.texts.begin() + first, s.texts.begin() + first + 2);
      if (overlapped)
        rewards.start(latents, index, texts);
      else
        serial.push_back(rewards.finish(latents, index, texts));
    }
    const at::Tensor values = overlapped ? rewards.finish(s.latents, s.prompt_index, s.texts) : at::cat(serial);
    CHECK(at::equal(values.select(1, 0), expected_latent_scores(s)));
    return seconds_since(start);
  };
  const double overlapped = run(true), serial = run(false);
  INFO("overlapped " << overlapped << " s, serial " << serial << " s");
  // Overlapped: 4 x 0.3 s of sampling + the last 0.3 s request = 1.5 s; serial: 2.4 s (negative control).
  CHECK(overlapped < 2.0);
  CHECK(serial >= 2.4);
}

TEST_CASE("http reward: images decoded by the deck's decoder module are what the server scores", "[reward][http]") {
  const std::string dir = test::fresh_output_dir("http-reward-decoder");
  const std::string decoder = dir + "/decoder.pt";
  // A scripted decoder: the first 3 channels, clamped, as uint8 RGB [B, H, W, 3].
  std::ofstream(dir + "/make.py") << R"(
import sys, torch
class Decoder(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[:, :3].permute(0, 2, 3, 1).clamp(-1, 1) * 100 + 128).to(torch.uint8)
torch.jit.save(torch.jit.script(Decoder()), sys.argv[1])
)";
  const test::ProcessResult made = test::run_process(fmt::format("{} {}/make.py {}", DITRL_PYTHON, dir, decoder));
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  RewardOptions o = http_options("/images/decoded");
  o.input = RewardInput::Images;
  o.decoder = decoder;
  const Samples s = samples();
  const at::Tensor scores = make_reward(o)->score(s.latents, s.prompt_index, s.texts);
  const at::Tensor pixels =
      (s.latents.narrow(1, 0, 3).permute({0, 2, 3, 1}).clamp(-1, 1) * 100 + 128).to(at::kByte).to(at::kDouble);
  const at::Tensor expected = (pixels.flatten(1).mean(1) + 1000.0 * s.prompt_index.to(at::kDouble)).to(at::kFloat);
  CHECK(at::equal(scores, expected));

  RewardOptions missing = o;
  missing.decoder = dir + "/absent.pt";
  CHECK_THAT(error_of(missing), Contains("reward judge: decoder module " + missing.decoder + ": no such file"));
}

TEST_CASE("http reward: a wrong answer is a named error naming the reward and the URL", "[reward][http]") {
  const std::string score = "reward judge: " + server().url();
  CHECK_THAT(error_of(http_options("/count/a")), Contains("/count/a/score answered 9 scores for 8 samples"));
  CHECK_THAT(error_of(http_options("/nan/a")), Contains("answered non-finite scores (NaN or Infinity)"));
  CHECK_THAT(error_of(http_options("/string/a")),
             Contains("/string/a/score answered a score that is not a number at index 0: \"0.5\""));
  CHECK_THAT(error_of(http_options("/missing/a")), Contains("/missing/a/score answered no \"scores\""));
  CHECK_THAT(error_of(http_options("/not_json/a")), Contains("/not_json/a/score answered a body that is not JSON"));
  CHECK_THAT(error_of(http_options("/count/a")), Contains(score));
}

TEST_CASE("http reward: HTTP 4xx fails at once with the server's reason", "[reward][http]") {
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(error_of(http_options("/status_400/a")),
             Contains("reward judge: " + server().url("/status_400/a/score") +
                      " answered HTTP 400: latents have the wrong shape for this scorer"));
  CHECK(seconds_since(start) < 5);  // not retried: retries would take 3 x the deadline at most, this is one exchange
}

TEST_CASE("http reward: 5xx and 429 are retried then fail the run with the status and reason", "[reward][http]") {
  const Samples s = samples();
  for (const char* path : {"/status_503_once/a", "/status_429_once/a"}) {
    INFO(path);
    CHECK(at::equal(make_reward(http_options(path))->score(s.latents, s.prompt_index, s.texts),
                    expected_latent_scores(s)));
  }
  CHECK_THAT(error_of(http_options("/status_503/a")),
             Contains("/status_503/a/score failed after 3 attempt(s) (deadline 10 s each): HTTP 503: scorer busy"));
}

TEST_CASE("http reward: a server that drops the connection mid-batch is retried", "[reward][http]") {
  const Samples s = samples();
  CHECK(at::equal(make_reward(http_options("/reset_once/a"))->score(s.latents, s.prompt_index, s.texts),
                  expected_latent_scores(s)));
  RewardOptions no_retry = http_options("/reset_once/b");
  no_retry.retries = 0;
  CHECK_THAT(error_of(no_retry), Contains("/reset_once/b/score failed after 1 attempt(s)"));
}

TEST_CASE("http reward: a slow server meets the deadline: retried then a named error", "[reward][http]") {
  const Samples s = samples();
  RewardOptions once = http_options("/slow_once/a");
  once.timeout_s = 1;
  CHECK(at::equal(make_reward(once)->score(s.latents, s.prompt_index, s.texts), expected_latent_scores(s)));
  RewardOptions slow = http_options("/slow/a");
  slow.timeout_s = 0.5;
  slow.retries = 1;
  const auto start = std::chrono::steady_clock::now();
  CHECK_THAT(error_of(slow), Contains("/slow/a/score failed after 2 attempt(s) (deadline 0.5 s each)"));
  // Two deadlines and one back-off, not the server's 3 s: the deadline held.
  CHECK(seconds_since(start) < 2.5);
}

TEST_CASE("http reward: the health check refuses a server by the reward's name and URL", "[reward][http]") {
  // A port nothing listens on: bound, then closed.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  close(fd);
  RewardOptions unreachable = http_options("");
  unreachable.url = fmt::format("http://127.0.0.1:{}", ntohs(address.sin_port));
  unreachable.retries = 1;
  CHECK_THAT(error_of(unreachable),
             Contains(fmt::format("reward judge: {}/health failed after 2 attempt(s)", unreachable.url)));

  CHECK_THAT(error_of(http_options("/health_protocol/a")),
             Contains("reward judge: " + server().url("/health_protocol/a/health") +
                      " speaks protocol 2, ditrl speaks protocol 1"));
  CHECK_THAT(error_of(http_options("/health_images/a")),
             Contains("/health_images/a/health scores input \"images\" but the deck's reward judge sends input = "
                      "\"latents\""));
  CHECK_THAT(error_of(http_options("/health_status/a")), Contains("is not ready: status \"loading\""));
  CHECK_THAT(error_of(http_options("/health_500/a")),
             Contains("/health_500/a/health failed after 3 attempt(s) (deadline 10 s each): HTTP 500: scorer failed "
                      "to load"));
  // The check itself names the scorer a correct server serves.
  CHECK(check_reward_server(http_options("/ok/health")) == "faulty-ok");
}
