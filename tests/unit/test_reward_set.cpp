// Several rewards in one deck: [[reward]] entries parse (and refuse what they
// must, by name), and a RewardSet's weighted sum and advantages equal a hand
// computation in both combine modes, the single [reward] unchanged.

#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rollout/reward_set.hpp>

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cmath>

using Catch::Matchers::Contains;
using namespace ditrl;
using namespace ditrl::rollout;

namespace {

constexpr const char* kModel = "[model]\nfamily = \"sd3\"\n";

const char* kThree = R"(
[[reward]]
name = "pattern"
kind = "analytic"
analytic = "target_pattern"
weight = 0.5

[[reward]]
name = "bright"
kind = "analytic"
analytic = "brightness"
weight = 2.0

[[reward]]
name = "judge"
kind = "http"
url = "http://127.0.0.1:8000"
input = "images"
decoder = "decoder.pt"
batch_size = 16
timeout_s = 20
weight = -1.0
)";

std::string deck_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    config::parse_deck(text, "deck.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A reward that returns fixed values, as a server or module would.
class Fixed final : public Reward {
 public:
  explicit Fixed(std::vector<float> values) : values_(std::move(values)) {}
  std::string name() const override { return "fixed"; }
  at::Tensor score(const at::Tensor&, const at::Tensor&, const std::vector<std::string>&) override {
    return at::tensor(values_, at::kFloat);
  }

 private:
  std::vector<float> values_;
};

// Population mean and std of one group, by hand.
std::pair<double, double> mean_std(const std::vector<double>& v) {
  double mean = 0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double var = 0;
  for (double x : v) var += (x - mean) * (x - mean);
  return {mean, std::sqrt(var / static_cast<double>(v.size()))};
}

// Per-group (G contiguous) (x - mean) / (std + 1e-4): the deck's default advantages, by hand.
std::vector<double> by_hand(const std::vector<double>& r, size_t group) {
  std::vector<double> out;
  for (size_t g = 0; g < r.size(); g += group) {
    const std::vector<double> members(r.begin() + static_cast<long>(g), r.begin() + static_cast<long>(g + group));
    const auto [mean, spread] = mean_std(members);
    for (double x : members) out.push_back((x - mean) / (spread + 1e-4));
  }
  return out;
}

}  // namespace

TEST_CASE("reward deck: [[reward]] entries read with names weights kinds and their own options", "[config][reward]") {
  const config::Config c = config::parse_deck(std::string(kModel) + kThree, "deck.toml");
  REQUIRE(c.rewards.size() == 3);
  CHECK(c.rewards[0].name == "pattern");
  CHECK(c.rewards[0].analytic == AnalyticFunction::TargetPattern);
  CHECK(c.rewards[1].analytic == AnalyticFunction::Brightness);
  CHECK(c.rewards[1].weight == 2.0);
  CHECK(c.rewards[2].kind == RewardKind::Http);
  CHECK(c.rewards[2].input == RewardInput::Images);
  CHECK(c.rewards[2].batch_size == 16);
  CHECK(c.train.reward_combine == RewardCombine::WeightedSum);
  CHECK(config::reward_list(c).size() == 3);
  // The effective deck writes them back as [[reward]] entries that read the same.
  const config::Config again = config::parse_deck(config::to_toml(c), "effective.toml");
  REQUIRE(again.rewards.size() == 3);
  CHECK(again.rewards[2].url == "http://127.0.0.1:8000");
  CHECK(again.rewards[0].weight == 0.5);
  // A single [reward] table is still the one reward, with its name defaulted.
  const config::Config single =
      config::parse_deck(std::string(kModel) + "[reward]\nanalytic = \"smoothness\"\n", "deck.toml");
  CHECK(single.rewards.empty());
  REQUIRE(config::reward_list(single).size() == 1);
  CHECK(config::reward_list(single)[0].analytic == AnalyticFunction::Smoothness);
  CHECK(config::to_toml(single).find("[[reward]]") == std::string::npos);
  CHECK(config::parse_deck(std::string(kModel) + kThree, "deck.toml", {"train.reward_combine=normalized_sum"})
            .train.reward_combine == RewardCombine::NormalizedSum);
}

TEST_CASE("reward deck: --set reaches [[reward]] entries by name or index", "[config][reward]") {
  const std::string deck = std::string(kModel) + kThree;
  const config::Config c = config::parse_deck(deck, "deck.toml", {"reward.bright.weight=3", "reward.2.timeout_s=15"});
  CHECK(c.rewards[1].weight == 3.0);
  CHECK(c.rewards[2].timeout_s == 15.0);
  CHECK(c.rewards[0].weight == 0.5);  // the other entries unchanged
  CHECK(c.rewards[2].weight == -1.0);
  // An assignment goes through the entry's checks, named by its place.
  CHECK_THAT(deck_error(deck, {"reward.judge.batch_size=-1"}), Contains("'reward[2].batch_size'"));
  CHECK_THAT(deck_error(deck, {"reward.nobody.weight=1"}),
             Contains("--set reward.nobody.weight=1: no [[reward]] entry is named 'nobody' and it is not an index "
                      "below 3"));
  CHECK_THAT(deck_error(deck, {"reward.3.weight=1"}), Contains("not an index below 3"));
  CHECK_THAT(deck_error(deck, {"reward.99999999999999999999.weight=1"}), Contains("not an index below 3"));
  CHECK_THAT(deck_error(deck, {"reward.weight=1"}), Contains("'reward' holds several entries: name one"));
}

TEST_CASE("reward deck: what [[reward]] entries refuse is named", "[config][reward]") {
  CHECK_THAT(deck_error(std::string(kModel) + "[reward]\nkind = \"analytic\"\n" + kThree),
             Contains("deck.toml: the deck has both a [reward] table and [[reward]] entries"));
  CHECK_THAT(deck_error(std::string(kModel) + "[[reward]]\nkind = \"analytic\"\n"),
             Contains("'reward[0].name' is required in a [[reward]] entry"));
  CHECK_THAT(deck_error(std::string(kModel) + "[[reward]]\nname = \"a\"\n[[reward]]\nname = \"a\"\n"),
             Contains("'reward[1].name' = \"a\" names an earlier [[reward]] entry too"));
  CHECK_THAT(deck_error(std::string(kModel) + "[[reward]]\nname = \"a/b\"\n"),
             Contains("'reward[0].name' = \"a/b\" may hold only letters, digits, _ and -"));
  CHECK_THAT(deck_error(std::string(kModel) + "[[reward]]\nname = \"a\"\nkind = \"grpc\"\n"),
             Contains("'reward[0].kind' = \"grpc\" is out of range: expected one of \"analytic\", \"torchscript\", "
                      "\"command\", \"http\""));
  CHECK_THAT(deck_error(std::string(kModel) + "[[reward]]\nname = \"a\"\nkind = \"http\"\n"),
             Contains("'reward[0].url' = \"\" must be an http:// URL"));
  CHECK_THAT(deck_error(std::string(kModel) +
                        "[[reward]]\nname = \"a\"\nkind = \"http\"\nurl = \"http://h:1\"\ninput = \"images\"\n"),
             Contains("'reward[0].decoder' is required when input = \"images\""));
  // The default 600 s deadline, tried 4 times, outlasts the 100 s collective watchdog.
  CHECK_THAT(deck_error(std::string(kModel) + "[[reward]]\nname = \"a\"\nkind = \"http\"\nurl = \"http://h:1\"\n"),
             Contains("'reward[0].timeout_s' x (retries + 1) plus the back-offs is 2407 s, not below "
                      "parallel.collective_timeout_s = 100 s"));
  CHECK(deck_error(std::string(kModel) +
                   "[[reward]]\nname = \"a\"\nkind = \"http\"\nurl = \"http://h:1\"\ntimeout_s = 20\n")
            .empty());
  CHECK_THAT(deck_error(std::string(kModel) + "[reward]\nweight = 2.0\n"),
             Contains("'reward.weight' applies to [[reward]] entries only"));
  CHECK_THAT(deck_error(std::string(kModel) + "[[reward]]\nname = \"a\"\nbogus = 1\n"), Contains("reward[0].bogus"));
  // Negative control: the same entry with its name is a valid deck.
  CHECK(deck_error(std::string(kModel) + "[[reward]]\nname = \"a\"\n").empty());
}

TEST_CASE("reward set: the weighted sum and both advantage modes equal a hand computation", "[reward]") {
  // Two prompt groups of 3; reward b has 100x the spread of reward a.
  const std::vector<float> a{0.1f, 0.4f, 0.2f, 0.9f, 0.5f, 0.6f};
  const std::vector<float> b{10.f, -30.f, 50.f, 0.f, 20.f, -5.f};
  const double wa = 2.0, wb = 0.25;
  auto make = [&](RewardCombine combine) {
    std::vector<WeightedReward> rewards;
    rewards.push_back({"a", wa, std::make_unique<Fixed>(a)});
    rewards.push_back({"b", wb, std::make_unique<Fixed>(b)});
    return RewardSet(std::move(rewards), true, combine);
  };
  rl::AdvantageOptions options;
  options.group_size = 3;
  RewardSet sum = make(RewardCombine::WeightedSum);
  const at::Tensor none = at::zeros({6, 1});
  const at::Tensor values = sum.finish(none, at::zeros({6}, at::kLong), std::vector<std::string>(6));
  REQUIRE(values.sizes() == at::IntArrayRef{6, 2});
  std::vector<double> weighted;
  for (size_t i = 0; i < 6; ++i) weighted.push_back(wa * a[i] + wb * b[i]);
  const at::Tensor total = sum.weighted_sum(values);
  const std::vector<double> of_sum = by_hand(weighted, 3);
  const at::Tensor adv_sum = sum.advantages(values, options);
  RewardSet normalized = make(RewardCombine::NormalizedSum);
  const at::Tensor adv_normalized = normalized.advantages(values, options);
  const std::vector<double> ha = by_hand({a.begin(), a.end()}, 3), hb = by_hand({b.begin(), b.end()}, 3);
  for (int64_t i = 0; i < 6; ++i) {
    const size_t k = static_cast<size_t>(i);
    INFO("sample " << i);
    // fp32 storage of values near 1..10: 1e-6 relative is ~10x the rounding.
    CHECK(total[i].item<double>() == Approx(weighted[k]).epsilon(1e-6));
    CHECK(adv_sum[i].item<double>() == Approx(of_sum[k]).margin(1e-5));
    CHECK(adv_normalized[i].item<double>() == Approx(wa * ha[k] + wb * hb[k]).margin(1e-5));
  }
  // Negative control: with b's wide range the modes differ, so each check above tells them apart.
  CHECK(at::max(at::abs(adv_sum - adv_normalized)).item<double>() > 0.1);
}

TEST_CASE("reward set: a single [reward] is its own values and their group advantages", "[reward]") {
  const std::vector<float> r{1.f, 3.f, 2.f, 7.f};
  std::vector<WeightedReward> one;
  one.push_back({"reward", 1.0, std::make_unique<Fixed>(r)});
  RewardSet single(std::move(one), false, RewardCombine::NormalizedSum);
  const at::Tensor values = single.finish(at::zeros({4, 1}), at::zeros({4}, at::kLong), std::vector<std::string>(4));
  CHECK(at::equal(single.weighted_sum(values), at::tensor(r, at::kFloat)));
  rl::AdvantageOptions options;
  options.group_size = 2;
  CHECK(at::equal(single.advantages(values, options), rl::group_advantages(at::tensor(r, at::kFloat), options)));
  // A reward's wrong count is refused by the reward's name, not trained on.
  std::vector<WeightedReward> short_one;
  short_one.push_back({"reward", 1.0, std::make_unique<Fixed>(std::vector<float>{1.f})});
  RewardSet wrong(std::move(short_one), false, RewardCombine::WeightedSum);
  CHECK_THROWS_WITH(wrong.finish(at::zeros({4, 1}), at::zeros({4}, at::kLong), std::vector<std::string>(4)),
                    Contains("reward fixed: expected a [4] tensor, got shape [1]"));
}
