// Resuming a training run from a checkpoint and saving its state.

#include <ditrl/app/run_checkpoints.hpp>
#include <ditrl/clock.hpp>
#include <ditrl/config/deck.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/error.hpp>
#include <ditrl/io/checkpoint.hpp>

#include <fmt/format.h>

#include <spdlog/spdlog.h>

#include <filesystem>
#include <optional>

namespace ditrl::app {

namespace {

// The deck keys whose values decide the sequence of samples and updates a
// run computes (its batching, seeds, model, latent grid and prompt set), as
// text, for comparison with a checkpoint's stored deck.
std::vector<std::pair<std::string, std::string>> trajectory_keys(const config::Config& c) {
  auto text = [](const auto& value) { return fmt::format("{}", value); };
  return {
      {"model.family", c.model.family},
      {"model.preset", c.model.preset},
      {"model.config", c.model.config},
      {"model.init_seed", text(c.model.init_seed)},
      {"model.lora.enabled", text(c.model.lora.enabled)},
      {"model.lora.rank", text(c.model.lora.rank)},
      {"model.lora.targets", fmt::format("[{}]", fmt::join(c.model.lora.targets, ", "))},
      {"run.seed", text(c.run.seed)},
      {"rollout.batch", text(c.rollout.batch)},
      {"rollout.samples_per_prompt", text(c.rollout.samples_per_prompt)},
      {"rollout.steps", text(c.rollout.steps)},
      {"rollout.height", text(c.rollout.height)},
      {"rollout.width", text(c.rollout.width)},
      {"rollout.frames", text(c.rollout.frames)},
      {"train.loss", std::string(name_of(rl::kLossNames, c.train.loss))},
      {"data.prompts", c.data.prompts},
      {"data.synthetic_prompts", text(c.data.synthetic_prompts)},
      {"data.seed", text(c.data.seed)},
  };
}

}  // namespace

int64_t RunCheckpoints::resume(const std::string& which) {
  const config::Config& c = run_.config;
  if (which == "none") return 0;
  const io::ResumeCandidates found = io::resume_candidates(c.run.out_dir);
  if (which.empty()) {
    // Starting over would overwrite the step files one by one.
    if (!found.paths.empty())
      fail(
          "{} already holds checkpoints (newest: {}); pass --resume auto or latest to continue from them, "
          "--resume none to start over from rollout 0 (overwriting them), or another run.out_dir",
          c.run.out_dir, found.paths.front());
    return 0;
  }
  if (which != "auto" && which != "latest") return load(which);
  for (const std::string& note : found.notes) spdlog::warn("--resume {}: {}; trying the step files", which, note);
  if (found.paths.empty()) {
    if (which == "latest" || !found.notes.empty())
      fail("--resume {}: no checkpoint in {}/checkpoints{}", which, c.run.out_dir,
           found.notes.empty() ? "" : " (" + found.notes.front() + ")");
    return 0;
  }
  std::string skipped;
  for (const std::string& path : found.paths) {
    // Before loading: a changed model or loss makes the load itself fail, which
    // would hide the keys that changed behind "does not verify".
    check_same_trajectory(io::checkpoint_deck(path), path);
    std::optional<io::CheckpointMeta> meta;
    try {
      meta = io::load_checkpoint(path, training_state(run_), run_.runtime->io_comm());
    } catch (const dist::AgreedError& e) {
      spdlog::warn("--resume {}: skipping {}: {}", which, path, e.what());
      skipped += fmt::format("\n  {}: {}", path, e.what());
      continue;
    }
    return adopt(path, *meta);
  }
  fail(
      "--resume {}: none of the {} checkpoint(s) in {}/checkpoints verifies; they are left as they are (a new run "
      "needs another run.out_dir):{}",
      which, found.paths.size(), c.run.out_dir, skipped);
}

int64_t RunCheckpoints::load(const std::string& path) {
  if (!std::filesystem::exists(path)) fail("checkpoint {}: no such file", path);
  check_same_trajectory(io::checkpoint_deck(path), path);
  return adopt(path, io::load_checkpoint(path, training_state(run_), run_.runtime->io_comm()));
}

int64_t RunCheckpoints::adopt(const std::string& path, const io::CheckpointMeta& meta) {
  run_.params->refresh_compute();
  run_.params->set_step_count(meta.adam_step);
  run_.algorithm->resumed(meta.rollout_id);
  resumed_ = true;
  step_ = meta.step;
  spdlog::info("resumed from {} (written by {} rank(s)): rollout {}, optimizer step {}", path, meta.world_size,
               meta.rollout_id, meta.step);
  return meta.rollout_id;
}

void RunCheckpoints::check_same_trajectory(const std::string& stored_deck, const std::string& path) const {
  if (stored_deck.empty()) return;
  config::Config stored;
  try {
    stored = config::parse_deck(stored_deck, path + " (its stored deck)");
  } catch (const Error& e) {
    spdlog::warn("checkpoint {}: its stored deck no longer parses, so the deck is not compared with it: {}", path,
                 e.what());
    return;
  }
  const auto now = trajectory_keys(run_.config), then = trajectory_keys(stored);
  std::string changed;
  for (size_t i = 0; i < now.size(); ++i)
    if (now[i].second != then[i].second)
      changed += fmt::format("\n  {}: checkpoint {}, deck {}", now[i].first, then[i].second, now[i].second);
  if (changed.empty()) return;
  if (allow_changed_deck_) {
    spdlog::warn("resuming {} with a deck that changes the run (--allow-changed-deck):{}", path, changed);
    return;
  }
  // Every rank compares the same two decks: they all raise it.
  throw dist::AgreedError(fmt::format(
      "resuming {}: the deck changes keys that decide the run's trajectory (pass --allow-changed-deck to resume "
      "anyway, or use another run.out_dir):{}",
      path, changed));
}

double RunCheckpoints::save(int64_t global_step, int64_t next_rollout) {
  const auto start = Clock::now();
  const config::Config& c = run_.config;
  const io::CheckpointMeta meta{global_step,
                                next_rollout,
                                run_.runtime->world().size,
                                run_.params->step_count(),
                                next_rollout * c.rollout.batch,
                                run_.deck_text};
  const std::string path =
      io::save_checkpoint(c.run.out_dir, training_state(run_), meta, c.checkpoint.keep, run_.runtime->io_comm());
  const double seconds = seconds_since(start);
  spdlog::info("checkpoint {} ({:.2f} s)", path, seconds);
  return seconds;
}

}  // namespace ditrl::app
