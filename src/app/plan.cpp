// `ditrl plan DECK`: the sharding and precision plan of the deck's model
// without loading weights (the family is built on the meta device).

#include <ditrl/app/commands.hpp>
#include <ditrl/app/options.hpp>
#include <ditrl/shard/plan_report.hpp>

#include <iostream>

namespace ditrl::app {

void add_plan_command(CLI::App& app, Command& selected) {
  struct Options {
    std::string deck;
    std::vector<std::string> overrides;
    int ranks = 1;
    int rank = 0;
  };
  auto options = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Print every parameter's unit, shard range, dtypes, precision rule and the bytes per rank");
  sub->add_option("deck", options->deck, "TOML deck")->required();
  sub->add_option("--set", options->overrides, "Override a deck key: section.key=value (repeatable)");
  sub->add_option("--ranks", options->ranks, "World size to shard over")->check(CLI::Range(1, 1 << 20));
  sub->add_option("--rank", options->rank, "Rank whose shard ranges are shown")->check(CLI::NonNegativeNumber);
  sub->callback([options, &selected] {
    selected = [options] {
      const config::Config config = config::load_deck(options->deck, options->overrides);
      const std::shared_ptr<models::Family> family = models::create_family(family_options(config, c10::kMeta));
      const precision::CompiledPlan plan = compiled_plan(config, *family);
      const shard::PlanReport report =
          shard::plan_report(*family, family->wrap_units(), plan, options->ranks, options->rank,
                             config.parallel.prefetch, config.parallel.reshard_after_forward);
      std::cout << "# plan of " << options->deck << " (" << family->family_name() << ", " << config.model.preset
                << ") over " << options->ranks << " ranks\n"
                << report.table();
      return 0;
    };
  });
}

}  // namespace ditrl::app
