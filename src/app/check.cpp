#include <ditrl/app/commands.hpp>
#include <ditrl/config/deck.hpp>

#include <iostream>

namespace ditrl::app {

void add_check_command(CLI::App& app, Command& selected) {
  struct Options {
    std::string deck;
    std::vector<std::string> overrides;
  };
  auto options = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("check", "Load and validate a deck and print the effective configuration");
  sub->add_option("deck", options->deck, "TOML deck")->required();
  sub->add_option("--set", options->overrides, "Override a deck key: section.key=value (repeatable)");
  sub->callback([options, &selected] {
    selected = [options] {
      const config::Config config = config::load_deck(options->deck, options->overrides);
      std::cout << "# effective configuration of " << options->deck << "\n" << config::to_toml(config);
      return 0;
    };
  });
}

}  // namespace ditrl::app
