// The enum-valued deck keys (the loss, the SDE kind, the step strategy, the
// dtypes, the attention backend): every name reads as its value and writes
// back as itself through the one table both directions use, a name the
// table lacks is refused naming the key, and a command-line option parses
// through the same table.

#include <ditrl/app/named_option.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>

#include <catch2/catch.hpp>

#include <set>

using Catch::Matchers::Contains;
using namespace ditrl;

namespace {

// Section S read from `text` with the deck's Reader (no section rules).
template <class S>
S read_section(const std::string& text) {
  const toml::table table = toml::parse(text);
  config::Diagnostics diag;
  config::SourceMap sources;
  config::Reader reader(table, "section", diag, sources);
  S section;
  section.fields(reader);
  reader.finish();
  diag.throw_if_any("section");
  return section;
}

// The value `key` gets when the deck's Writer writes `section`.
template <class S>
std::optional<std::string> written(S section, const std::string& key) {
  toml::table out;
  config::Writer writer(out);
  section.fields(writer);
  return out[key].value<std::string>();
}

// Each name of `names` given to `key` of section S (after `rest`, the
// section's required keys) reads as its value and writes back as itself.
template <class S, class E, std::size_t N>
void round_trips(const std::string& key, E S::*member, const NameTable<E, N>& names, const std::string& rest = "") {
  std::set<std::string_view> seen;
  for (const Named<E>& n : names) {
    INFO(key << " = \"" << n.name << "\"");
    CHECK(seen.insert(n.name).second);  // no name twice
    CHECK(config::parse_name(names, n.name) == n.value);
    CHECK(name_of(names, n.value) == n.name);
    const S section = read_section<S>(rest + key + " = \"" + std::string(n.name) + "\"\n");
    CHECK(section.*member == n.value);
    CHECK(written(section, key) == std::string(n.name));
  }
}

// Every value of an enum whose values are 0 .. N-1 has a name.
template <class E, std::size_t N>
void names_every_value(const NameTable<E, N>& names) {
  for (std::size_t i = 0; i < N; ++i) CHECK_FALSE(name_of(names, static_cast<E>(i)).empty());
}

std::string deck_error(const std::string& assignment) {
  try {
    config::parse_deck("[model]\nfamily = \"sd3\"\n", "deck.toml", {assignment});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("deck names: every enum value round-trips name -> enum -> name through the deck's table", "[config]") {
  using config::InputPolicySection;
  using config::OverrideRule;
  using config::PrecisionSection;
  using config::RolloutSection;
  using config::TrainSection;
  round_trips("loss", &TrainSection::loss, rl::kLossNames);
  round_trips("sde", &RolloutSection::sde, diffusion::kSdeNames);
  round_trips("strategy", &RolloutSection::strategy, rl::kStepStrategyNames);
  round_trips("attention", &PrecisionSection::attention, models::kAttentionNames);
  round_trips("master", &PrecisionSection::master, precision::kDtypeNames);
  round_trips("reduce", &PrecisionSection::reduce, precision::kDtypeNames);
  round_trips("forward", &PrecisionSection::forward, precision::kDtypeNames);
  round_trips("dtype", &OverrideRule::dtype, precision::kDtypeNames, "pattern = \"*\"\n");
  round_trips("latents", &InputPolicySection::latents, precision::kInputDtypeNames);
  round_trips("cond", &InputPolicySection::cond, precision::kInputDtypeNames);
  round_trips("timestep", &InputPolicySection::timestep, precision::kInputDtypeNames);
  round_trips("kind", &config::RewardSection::kind, rollout::kRewardKindNames);
  round_trips("analytic", &config::RewardSection::analytic, rollout::kAnalyticNames);
  round_trips("input", &config::RewardSection::input, rollout::kRewardInputNames);
  round_trips("reward_combine", &TrainSection::reward_combine, rollout::kRewardCombineNames);
  names_every_value(rl::kLossNames);
  names_every_value(diffusion::kSdeNames);
  names_every_value(rl::kStepStrategyNames);
  names_every_value(models::kAttentionNames);
  names_every_value(precision::kInputDtypeNames);
  names_every_value(rollout::kRewardKindNames);
  names_every_value(rollout::kAnalyticNames);
  names_every_value(rollout::kRewardInputNames);
  names_every_value(rollout::kRewardCombineNames);
}

TEST_CASE("deck names: an unknown name is refused naming the key / its choices and the closest", "[config]") {
  CHECK_THAT(deck_error("train.loss=nfy"),
             Contains("(--set train.loss=nfy): 'train.loss' = \"nfy\" is out of range: expected one of \"grpo\", "
                      "\"nft\", \"sft\" (did you mean \"nft\"?)"));
  CHECK_THAT(deck_error("rollout.sde=ddim"),
             Contains("'rollout.sde' = \"ddim\" is out of range: expected one of \"sde\", \"cps\", \"ode\""));
  CHECK_THAT(deck_error("rollout.strategy=sde_windows"),
             Contains("'rollout.strategy' = \"sde_windows\" is out of range: expected one of \"sde_window\", "
                      "\"epoch_global_random_choice\", \"ode_and_return_last\" (did you mean \"sde_window\"?)"));
  CHECK_THAT(deck_error("precision.attention=sdpa"),
             Contains("'precision.attention' = \"sdpa\" is out of range: expected one of \"math\", \"flash\", "
                      "\"efficient\", \"cudnn\""));
  CHECK_THAT(deck_error("precision.inputs.cond=int8"),
             Contains("'precision.inputs.cond' = \"int8\" is out of range: expected one of \"default\", \"fp32\", "
                      "\"bf16\", \"fp16\", \"passthrough\""));
  CHECK_THAT(deck_error("precision.reduce=fp64"), Contains("'precision.reduce' = \"fp64\" is out of range"));
  CHECK_THAT(deck_error("train.loss=3"), Contains("'train.loss' must be a string, got a integer"));
  // A name differs from the table's by its case too.
  CHECK_THAT(deck_error("train.loss=GRPO"), Contains("'train.loss' = \"GRPO\" is out of range"));
}

TEST_CASE("deck names: the effective deck writes each name as the deck gave it", "[config]") {
  const config::Config c = config::parse_deck("[model]\nfamily = \"sd3\"\n", "deck.toml",
                                              {"train.loss=sft", "rollout.sde=cps", "precision.forward=fp16",
                                               "precision.master=fp16", "precision.attention=flash"});
  CHECK(c.train.loss == rl::Loss::Sft);
  CHECK(c.rollout.sde == diffusion::SdeType::Cps);
  CHECK(c.precision.forward == c10::ScalarType::Half);
  const std::string text = config::to_toml(c);
  // toml++ writes strings in single quotes.
  for (const char* line : {"loss = 'sft'", "sde = 'cps'", "forward = 'fp16'", "master = 'fp16'", "attention = 'flash'",
                           "strategy = 'sde_window'", "timestep = 'passthrough'"})
    CHECK_THAT(text, Contains(line));
}

TEST_CASE("deck names: a command-line option parses its name through the same table", "[config][cli]") {
  models::AttentionBackend attention = models::AttentionBackend::Math;
  CLI::App cli;
  app::add_named_option(cli, "--attention", attention, models::kAttentionNames,
                        {models::AttentionBackend::Math, models::AttentionBackend::Flash}, "math | flash");
  cli.parse("--attention flash", false);
  CHECK(attention == models::AttentionBackend::Flash);
  // Offered: only the two host kernels; unknown: refused the same way.
  for (const char* refused : {"--attention cudnn", "--attention sdpa"}) {
    INFO(refused);
    CLI::App again;
    app::add_named_option(again, "--attention", attention, models::kAttentionNames,
                          {models::AttentionBackend::Math, models::AttentionBackend::Flash}, "math | flash");
    CHECK_THROWS_AS(again.parse(refused, false), CLI::ValidationError);
  }
  c10::ScalarType dtype = c10::ScalarType::Float;
  CLI::App all;
  app::add_named_option(all, "--dtype", dtype, precision::kDtypeNames, "dtype");
  all.parse("--dtype bf16", false);
  CHECK(dtype == c10::ScalarType::BFloat16);
}
