#pragma once

// A deck is a TOML file of sections (docs/design.md §5). load_deck() parses it,
// applies `--set section.key=value` overrides, reads every section with type,
// range and unknown-key checks, runs each section's rules and the deck-wide
// invariants, and reports all problems at once.

#include <ditrl/config/sections.hpp>

#include <string>
#include <vector>

namespace ditrl::config {

struct Config {
  RunSection run;
  ModelSection model;
  PrecisionSection precision;
  ParallelSection parallel;
  RolloutSection rollout;
  RewardSection reward;                // a single [reward] table
  std::vector<RewardSection> rewards;  // or [[reward]] entries: several, weighted
  TrainSection train;
  DataSection data;
  CheckpointSection checkpoint;
  MetricsSection metrics;
  LogSection log;
  DebugSection debug;

  std::string source;  // the deck file (or a description of where the text came from)

  template <class V>
  void sections(V& v) {
    v.table("run", run, "The run: its output folder, seed, determinism, threads and device.");
    v.table("model", model, "The model: its family and architecture, weights and LoRA adapters.");
    v.table("precision", precision, "Dtypes of the weights, gradients and forward, and the kernels that compute them.");
    v.table("parallel", parallel, "Parameter sharding and gathers, the collective watchdog, sequence parallelism.");
    v.table("rollout", rollout, "Sampling: schedule, SDE kernel and steps, guidance, batch and latent grid.");
    v.table_or_tables("reward", reward, rewards,
                      "What scores the rollout's final latents: one [reward] table, or one [[reward]] entry per "
                      "reward of a weighted sum (docs/rewards.md).");
    v.table("train", train, "The loss, AdamW, batching, the learning-rate schedule and advantages.");
    v.table("data", data, "The prompts (and SFT targets) the rollouts draw from.");
    v.table("checkpoint", checkpoint, "When checkpoints are written and kept, and where a run resumes from.");
    v.table("metrics", metrics, "How often metrics.h5 gets a row.");
    v.table("log", log, "Preview samples written while the run trains (OUT/samples).");
    v.table("debug", debug, "Tensor dumps for `ditrl align` and checks for debugging.");
  }
};

// The run's rewards: the [[reward]] entries, or the single [reward] table.
std::vector<RewardSection> reward_list(const Config& config);

// Reads and validates a deck file; throws ditrl::Error listing every problem.
Config load_deck(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from TOML text; `source_name` is used in error locations.
Config parse_deck(const std::string& text, const std::string& source_name,
                  const std::vector<std::string>& overrides = {});
// The effective deck as TOML text (defaults included); parse_deck() of it
// gives back the same Config.
std::string to_toml(const Config& config);

}  // namespace ditrl::config
