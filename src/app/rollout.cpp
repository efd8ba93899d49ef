// `ditrl rollout DECK --out traj.h5`: one rollout of the deck's model (its
// weights, seeded init, or a training checkpoint), scored by the deck's
// reward, written as a trajectory file that `ditrl train --trajectories`
// (or any reader of the documented layout) consumes.

#include <ditrl/app/commands.hpp>
#include <ditrl/app/run.hpp>
#include <ditrl/dist/watchdog.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>

#include <filesystem>

namespace ditrl::app {

namespace {

struct RolloutCli {
  std::string deck;
  std::vector<std::string> overrides;
  std::string out;
  std::string checkpoint;
  std::string dump_dir;  // [debug] dump files; default <out stem>-debug/ beside --out
  int64_t rollout_id = 0;
};

// A standalone rollout's dumps go to their own folder, never over the
// training run's OUT/debug/dump-rank<r>.h5.
std::string dump_folder(const RolloutCli& cli) {
  if (!cli.dump_dir.empty()) return cli.dump_dir;
  const std::filesystem::path out(cli.out);
  return (out.parent_path() / (out.stem().string() + "-debug")).string();
}

int rollout_command(const RolloutCli& cli) {
  const config::Config config = config::load_deck(cli.deck, cli.overrides);
  // Before any work: the collector cannot write a sequence-parallel rollout.
  if (config.parallel.sequence_parallel > 1)
    fail("{}: ditrl rollout writes trajectories, which parallel.sequence_parallel = {} does not support; set it to 1",
         config.source, config.parallel.sequence_parallel);
  const std::unique_ptr<dist::Runtime> runtime = start_runtime(config, "").runtime;
  Run run = open_run(config, *runtime, dump_folder(cli));
  if (!cli.checkpoint.empty()) {
    const io::CheckpointMeta meta = io::load_checkpoint(io::resolve_checkpoint(config.run.out_dir, cli.checkpoint),
                                                        training_state(run, /*with_extra=*/false), runtime->io_comm());
    run.params->refresh_compute();
    run.params->set_step_count(meta.adam_step);
  }
  dist::Watchdog::mark_started();
  const rollout::RolloutBatch batch = run.collector->collect(cli.rollout_id);
  run.collector->save(batch, cli.out,
                      {{"family", config.model.family},
                       {"sde", std::string(name_of(diffusion::kSdeNames, config.rollout.sde))},
                       {"deck", run.deck_text}},
                      {{"noise_level", config.rollout.noise_level},
                       {"guidance_scale", config.rollout.guidance_scale},
                       {"rollout_id", static_cast<double>(batch.rollout_id)}});
  if (runtime->world().rank == 0)
    spdlog::info("rollout {}: {} samples, reward mean {:.6g}, written to {}", cli.rollout_id,
                 run.collector->samples_per_rollout(), batch.all_rewards.mean().item<double>(), cli.out);
  return 0;
}

}  // namespace

void add_rollout_command(CLI::App& app, Command& selected) {
  auto cli = std::make_shared<RolloutCli>();
  CLI::App* sub = app.add_subcommand("rollout", "Sample and score one rollout and write its trajectories (HDF5)");
  sub->add_option("deck", cli->deck, "TOML deck")->required();
  sub->add_option("--out", cli->out, "Trajectory file to write")->required();
  sub->add_option("--set", cli->overrides, "Override a deck key: section.key=value (repeatable)");
  sub->add_option("--checkpoint", cli->checkpoint, "Sample with a training checkpoint's weights (path or `latest`)");
  sub->add_option("--dump-dir", cli->dump_dir,
                  "[debug] dump = true: folder of the dump-rank<r>.h5 files (default: <out stem>-debug/ beside --out)");
  sub->add_option("--rollout-id", cli->rollout_id, "Which rollout (selects prompts, noise and SDE steps)")
      ->check(CLI::NonNegativeNumber);
  sub->callback([cli, &selected] { selected = [cli] { return rollout_command(*cli); }; });
}

}  // namespace ditrl::app
