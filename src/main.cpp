// ditrl: reinforcement-learning post-training of flow-matching diffusion
// transformers on MPI clusters. This file is the CLI: one CLI11 subcommand per
// task, and the single place where errors are caught and turned into an exit
// code (or MPI_Abort, so that no rank is left waiting).

#include <ditrl/app/commands.hpp>
#include <ditrl/app/stop_signal.hpp>
#include <ditrl/dist/runtime.hpp>

#include <iostream>

namespace {

// Preemption handlers before anything else runs (app/stop_signal.hpp): the
// dynamic linker calls the executable's .preinit_array entries before the
// static initializers of the libraries it loaded, and LibTorch's take most
// of a rank's first second. Only the mapping of those libraries comes first.
void install_before_static_initializers(int, char**, char**) {
  ditrl::app::install_stop_handlers();
}
using Preinit = void (*)(int, char**, char**);
__attribute__((section(".preinit_array"), used)) Preinit preinit_stop_handlers = install_before_static_initializers;

}  // namespace

int main(int argc, char** argv) {
  CLI::App cli{"ditrl: RL post-training of flow-matching diffusion transformers (Flow-GRPO, DiffusionNFT, SFT)"};
  cli.require_subcommand(0, 1);
  bool show_version = false;
  cli.add_flag("--version", show_version, "Print ditrl's version and the versions of its dependencies");

  ditrl::app::Command selected;
  ditrl::app::add_check_command(cli, selected);
  ditrl::app::add_standard_command(cli, selected);
  ditrl::app::add_inspect_command(cli, selected);
  ditrl::app::add_forward_command(cli, selected);
  ditrl::app::add_plan_command(cli, selected);
  ditrl::app::add_train_command(cli, selected);
  ditrl::app::add_rollout_command(cli, selected);
  ditrl::app::add_export_command(cli, selected);
  ditrl::app::add_encode_prompts_command(cli, selected);
  ditrl::app::add_align_command(cli, selected);
  ditrl::app::add_deck_reference_command(cli, selected);
  ditrl::app::add_status_command(cli, selected);
  ditrl::app::add_preflight_command(cli, selected);

  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    ditrl::app::restore_default_stop_actions();
    return cli.exit(e);
  }
  // Only `train` checkpoints on a stop signal; everything else ends on it as before.
  if (!cli.got_subcommand("train")) ditrl::app::restore_default_stop_actions();
  if (show_version) {
    std::cout << ditrl::app::version_text();
    return 0;
  }
  if (!selected) {
    std::cout << cli.help();
    return 0;
  }
  try {
    return selected();
  } catch (const std::exception& e) {
    return ditrl::dist::report_fatal(e);
  }
}
