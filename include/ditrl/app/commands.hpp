#pragma once

// Subcommands of the `ditrl` executable. Each add_*_command registers its
// options on the CLI11 app and, when chosen, stores the work to run in
// `selected`; main() runs it once inside the single error handler.

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace ditrl::app {

using Command = std::function<int()>;

// Multi-line version report: ditrl and every dependency it was built with.
std::string version_text();

void add_check_command(CLI::App& app, Command& selected);
void add_standard_command(CLI::App& app, Command& selected);
void add_inspect_command(CLI::App& app, Command& selected);
void add_forward_command(CLI::App& app, Command& selected);
void add_plan_command(CLI::App& app, Command& selected);
void add_train_command(CLI::App& app, Command& selected);
void add_rollout_command(CLI::App& app, Command& selected);
void add_export_command(CLI::App& app, Command& selected);
void add_encode_prompts_command(CLI::App& app, Command& selected);
void add_align_command(CLI::App& app, Command& selected);
void add_deck_reference_command(CLI::App& app, Command& selected);
void add_status_command(CLI::App& app, Command& selected);
void add_preflight_command(CLI::App& app, Command& selected);

}  // namespace ditrl::app
