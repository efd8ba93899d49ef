#pragma once

// `ditrl status RUN_DIR`: a run at a glance from its files alone, safe beside
// the job that writes them (a login node while the job trains): metrics.h5 is
// read from an in-memory copy (io::read_metrics_while_written), checkpoints
// are finished files the job never reopens, logs and status are text. Nothing
// in the run folder is locked, created or changed.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ditrl::app {

struct CheckpointStatus {
  std::string path;          // "" when the run has none
  int64_t next_rollout = 0;  // the rollout a resume starts at
  int64_t step = 0;
  std::optional<bool> verifies;  // absent: not checked (--no-verify)
  std::string problem;           // why it does not verify
};

struct RunStatus {
  std::string out_dir;
  std::string name;             // run.name of the stored deck
  std::string status;           // OUT/status ("complete", "preempted"), "" when absent
  std::string state;            // complete | preempted | running | stopped | not started (see docs/user-guide.md)
  std::string lock_holder;      // OUT/.lock: the newest job's host, PID and start time
  std::string metrics_problem;  // why metrics.h5 could not be read ("" when it was)
  int64_t num_rollouts = 0;     // train.num_rollouts of the stored deck; 0 when unknown
  int64_t rollouts_done = 0;    // rollouts with a metrics row
  int64_t last_step = -1;       // the last optimizer step with a row
  int64_t trend_rollouts = 0;   // rollouts in each of the two trend means (at most 10)
  std::optional<double> reward_first, reward_last;  // mean rollout/reward/raw_mean of the first / last rollouts
  std::optional<double> rollouts_per_hour;          // from the rank-0 log's progress lines
  std::optional<double> eta_hours;                  // to num_rollouts at that rate
  int64_t skipped_steps = 0;                        // rows whose gradient norm was not finite
  CheckpointStatus checkpoint;
  std::vector<std::string> log_problems;  // the newest warning / error lines of OUT/logs
  int64_t log_problem_count = 0;
};

// Reads a run folder; raises naming the folder when it is not a ditrl run.
// verify: check the newest checkpoint's SHA-256 manifest (reads all of it).
RunStatus read_run_status(const std::string& out_dir, bool verify = true);

std::string status_text(const RunStatus& status);
std::string status_json(const RunStatus& status);

}  // namespace ditrl::app
