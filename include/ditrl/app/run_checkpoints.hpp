#pragma once

// A training run's checkpoints: resuming from one (`--resume` latest, auto
// or a path; any rank count) and saving the run's state with its position
// (optimizer step, next rollout, prompts consumed) under OUT/checkpoints.

#include <ditrl/app/run.hpp>

#include <cstdint>
#include <string>

namespace ditrl::app {

class RunCheckpoints {
 public:
  explicit RunCheckpoints(Run& run) : run_(run) {}

  // which: "" (start from rollout 0), "latest", "auto" (latest when there is
  // one) or a checkpoint path. Collective. Returns the first rollout to run.
  int64_t resume(const std::string& which);
  bool resumed() const { return resumed_; }
  int64_t resumed_step() const { return step_; }

  // Collective; returns its wall seconds.
  double save(int64_t global_step, int64_t next_rollout);

 private:
  Run& run_;
  bool resumed_ = false;
  int64_t step_ = 0;
};

}  // namespace ditrl::app
