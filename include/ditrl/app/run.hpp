#pragma once

// What `ditrl train` and `ditrl rollout` build from a deck on every rank.
// open_run() checks everything a run can get wrong up front (batch knobs
// against the world size, weights file, prompt data against the family)
// before any rank does heavy work, then builds the model on the runtime's
// device, shards it, and wires the rollout collector and the algorithm to it.

#include <ditrl/config/deck.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/io/checkpoint.hpp>
#include <ditrl/io/out_dir_lock.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/ulysses.hpp>
#include <ditrl/rl/algorithm.hpp>
#include <ditrl/rl/parity_dump.hpp>
#include <ditrl/rl/policy.hpp>
#include <ditrl/rollout/collect.hpp>
#include <ditrl/rollout/prompts.hpp>
#include <ditrl/rollout/reward_set.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace ditrl::app {

struct Run {
  config::Config config;
  std::string deck_text;  // the effective deck, stored in checkpoints and metrics
  dist::Runtime* runtime = nullptr;
  rl::AlgorithmTraits traits;
  std::shared_ptr<models::Family> family;
  std::unique_ptr<models::Ulysses> ulysses;  // parallel.sequence_parallel > 1: this rank's group
  std::unique_ptr<shard::ShardedParams> params;
  std::unique_ptr<rollout::PromptSource> prompts;
  std::unique_ptr<rollout::RewardSet> rewards;
  std::unique_ptr<rl::ParityDump> dump;  // [debug] dump = true: OUT/debug/dump-rank<r>.h5
  std::unique_ptr<rollout::Collector> collector;
  rl::Policy policy;
  std::unique_ptr<rl::Algorithm> algorithm;
};

// A started job: its runtime and, for a job that owns a run folder, the lock
// that keeps other jobs out of it for the job's life.
struct StartedJob {
  std::unique_ptr<dist::Runtime> runtime;
  std::unique_ptr<io::OutDirLock> out_dir_lock;
};

// Pins the CPU kernels in deterministic mode (app/determinism.hpp), starts
// MPI and the device, locks out_dir (io/out_dir_lock.hpp; rank 0 creates
// it) and starts the logs in it (empty: no lock, console only), sets the
// intra-op threads.
StartedJob start_runtime(const config::Config& config, const std::string& out_dir);

// `dump_dir`: where [debug] dump files go ("" = OUT/debug, the training run's).
Run open_run(const config::Config& config, dist::Runtime& runtime, const std::string& dump_dir = "");

// What open_run rejects before building anything, for `ditrl check` too:
// parallel.sequence_parallel and the batch knobs against `world` ranks (the
// data split is over world / sequence_parallel groups) and (files) the
// deck's input files.
void check_run_inputs(const config::Config& config, int world, bool files = true);
// What `train` refuses and `rollout` takes: GRPO on rollouts with no SDE step.
void check_trainable(const config::Config& config);
// The family's geometry rules on the deck's latent grid (patch multiples,
// position tables), the error naming the rollout keys.
void check_latent_grid(const config::Config& config, const models::Family& family);
// The family's own limits on parallel.sequence_parallel (heads, tokens).
void check_sequence_parallel(const config::Config& config, const models::Family& family);

// The run's training rollout as the algorithm reads it.
rl::TrainingRollout training_rollout(const rollout::RolloutBatch& batch);

// The checkpointed state: the sharded masters and moments, and (with_extra)
// the algorithm's extra per-parameter state.
io::TrainingState training_state(Run& run, bool with_extra = true);

}  // namespace ditrl::app
