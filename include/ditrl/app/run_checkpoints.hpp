#pragma once

// A training run's checkpoints: resuming from one (`--resume` latest, auto
// or a path; any rank count) and saving the run's state with its position
// (optimizer step, next rollout, prompts consumed) under OUT/checkpoints.

#include <ditrl/app/run.hpp>
#include <ditrl/io/checkpoint.hpp>

#include <cstdint>
#include <string>

namespace ditrl::app {

class RunCheckpoints {
 public:
  // allow_changed_deck: resume even when the deck changes trajectory keys
  // (batching, seeds, model, latent grid, prompts) against the checkpoint's.
  explicit RunCheckpoints(Run& run, bool allow_changed_deck = false)
      : run_(run), allow_changed_deck_(allow_changed_deck) {}

  // which: "" (start from rollout 0; an error when OUT already holds
  // checkpoints), "none" (start from rollout 0 regardless), "latest" or
  // "auto" (the newest checkpoint that verifies, `latest`'s first; auto
  // starts when there is none) or a checkpoint path. Collective. Returns the
  // first rollout to run.
  int64_t resume(const std::string& which);
  bool resumed() const { return resumed_; }
  int64_t resumed_step() const { return step_; }

  // Collective; returns its wall seconds.
  double save(int64_t global_step, int64_t next_rollout);

 private:
  int64_t load(const std::string& path);
  // The run continues from a loaded checkpoint.
  int64_t adopt(const std::string& path, const io::CheckpointMeta& meta);
  // Deck keys that change what the resumed run computes must equal the
  // checkpoint's (unless the run allows it): an error listing those that
  // differ, raised before the checkpoint is loaded (a changed model would
  // fail the load and hide them).
  void check_same_trajectory(const std::string& stored_deck, const std::string& path) const;

  Run& run_;
  bool allow_changed_deck_ = false;
  bool resumed_ = false;
  int64_t step_ = 0;
};

}  // namespace ditrl::app
