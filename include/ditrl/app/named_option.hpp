#pragma once

// A command-line option whose value is a name from an enum's name table
// (ditrl/name_table.hpp, the one the deck reads the same key with), parsed
// once into the enum: `ditrl forward --attention flash`, `--dtype bf16`.
// CLI11 checks the name against the values the command offers, and its
// help and its error list them.

#include <ditrl/config/schema.hpp>
#include <ditrl/name_table.hpp>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace ditrl::app {

template <class E, std::size_t N>
CLI::Option* add_named_option(CLI::App& app, const std::string& flag, E& value, const NameTable<E, N>& names,
                              const std::vector<E>& offered, const std::string& help) {
  std::vector<std::string> choices;
  for (const E e : offered) choices.emplace_back(name_of(names, e));
  const auto parse = [flag, &value, &names, choices](const std::string& text) {
    // The check below has already refused a name that is not offered.
    const std::optional<E> parsed = config::parse_name(names, text);
    if (!parsed) throw CLI::ValidationError(flag, config::not_a_choice(flag, text, choices));
    value = *parsed;
  };
  return app.add_option_function<std::string>(flag, parse, help)->check(CLI::IsMember(choices));
}

// Every value of the table offered.
template <class E, std::size_t N>
CLI::Option* add_named_option(CLI::App& app, const std::string& flag, E& value, const NameTable<E, N>& names,
                              const std::string& help) {
  std::vector<E> all;
  for (const Named<E>& n : names) all.push_back(n.value);
  return add_named_option(app, flag, value, names, all, help);
}

}  // namespace ditrl::app
