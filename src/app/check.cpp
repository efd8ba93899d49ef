// `ditrl check DECK`: everything `ditrl train` would reject in its first
// seconds, found before a job waits in a queue for hours: the deck's keys
// and rules, the model (family, preset or config.json, precision plan) built
// on the meta device, the batch knobs against `--ranks`, the input files and
// a writable run.out_dir.

#include <ditrl/app/commands.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/app/out_dir.hpp>
#include <ditrl/app/run.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/error.hpp>
#include <ditrl/rollout/http_reward.hpp>

#include <iostream>

namespace ditrl::app {

namespace {

// Each reward server answers its health check as `train` will ask it.
void check_reward_servers(const config::Config& config) {
  for (const rollout::RewardOptions& r : reward_options(config, c10::kCPU))
    if (r.kind == rollout::RewardKind::Http) {
      const std::string scorer = rollout::check_reward_server(r);
      std::cout << "# reward " << r.name << ": " << r.url << " serves scorer " << scorer << " (input = \""
                << name_of(rollout::kRewardInputNames, r.input) << "\")\n";
    }
}

int check(const std::string& deck, const std::vector<std::string>& overrides, int ranks, bool files) {
  const config::Config config = config::load_deck(deck, overrides);
  check_run_inputs(config, ranks, files);
  check_trainable(config);
  const std::shared_ptr<models::Family> family = models::create_family(family_options(config, c10::kMeta));
  compiled_plan(config, *family);
  check_latent_grid(config, *family);
  check_sequence_parallel(config, *family);
  check_out_dir(config);
  if (files) check_reward_servers(config);
  std::cout << "# effective configuration of " << deck << " (checked for " << ranks << " rank(s))\n"
            << config::to_toml(config);
  return 0;
}

}  // namespace

void add_check_command(CLI::App& app, Command& selected) {
  struct Options {
    std::string deck;
    std::vector<std::string> overrides;
    int ranks = 1;
    bool without_files = false;
  };
  auto options = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "check",
      "Validate a deck as `train` would at start-up (model, batching for --ranks, files, out_dir) and print "
      "the effective configuration");
  sub->add_option("deck", options->deck, "TOML deck")->required();
  sub->add_option("--set", options->overrides, "Override a deck key: section.key=value (repeatable)");
  sub->add_option("--ranks", options->ranks, "World size the job will run with (batch splits are checked for it)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_flag("--without-files", options->without_files,
                "Do not require the weights and prompt files to exist yet (a deck checked before they are staged)");
  sub->callback([options, &selected] {
    selected = [options] { return check(options->deck, options->overrides, options->ranks, !options->without_files); };
  });
}

}  // namespace ditrl::app
