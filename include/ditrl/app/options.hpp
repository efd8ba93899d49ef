#pragma once

// The deck -> each subsystem's options. The subsystems below app/ never read
// the deck (docs/design.md §2); the commands build what they run from these, so
// `train`, `rollout`, `plan` and `export` build the same model the same way.

#include <ditrl/config/deck.hpp>
#include <ditrl/dist/runtime.hpp>
#include <ditrl/models/family.hpp>
#include <ditrl/models/parameter_source.hpp>
#include <ditrl/precision/plan.hpp>
#include <ditrl/rl/advantages.hpp>
#include <ditrl/rl/algorithm.hpp>
#include <ditrl/rl/lr_schedule.hpp>
#include <ditrl/rl/step_strategy.hpp>
#include <ditrl/rollout/collect.hpp>
#include <ditrl/rollout/reward.hpp>
#include <ditrl/shard/sharded_params.hpp>

#include <c10/core/Device.h>

namespace ditrl::app {

dist::RuntimeOptions runtime_options(const config::Config& c);
// [parallel] data_backend's name as the enum ("auto" | "nccl" | "mpi").
dist::DataBackend data_backend(const std::string& name);
// The model as [model] and [precision] describe it, built on `device`
// (c10::kMeta for shapes only).
models::FamilyOptions family_options(const config::Config& c, c10::Device device);
// The deck's model as a run starts from it on `device`, whole on this rank:
// the family, its base weights or seeded init, its LoRA adapters,
// model.lora.weights loaded. Commands that need the whole model (forward,
// export from a checkpoint) build this.
std::shared_ptr<models::Family> deck_model(const config::Config& c, c10::Device device);

// The same model for a sharded run, of which no rank holds the whole: the
// family built sliced (base parameters on the meta device, buffers and LoRA
// adapters materialised on `device`, model.lora.weights loaded) and the
// source of its base values, the deck's weights (validated here, before any
// work) or the seeded init, that shard::ShardedParams reads slice by slice.
struct SlicedModel {
  std::shared_ptr<models::Family> family;
  std::unique_ptr<models::ParameterSource> source;
};
// Tables indexed by the latent grid (SD3's pos_embed): whole (export writes
// them), or only the crop the deck's rollout grid reads (training: SD3.5's
// whole table would be 0.9 GB on every rank).
enum class GridTables { Whole, DeckCrop };
SlicedModel sliced_deck_model(const config::Config& c, c10::Device device, GridTables tables = GridTables::Whole);
// [precision] with `family_rules` (a family's default fp32-kept parameters)
// first when precision.family_overrides is on.
precision::PrecisionPlan precision_plan(const config::Config& c, const std::vector<precision::DtypeRule>& family_rules);
// That plan, with the family's rules, compiled against its parameter names.
precision::CompiledPlan compiled_plan(const config::Config& c, models::Family& family);
shard::ShardOptions shard_options(const config::Config& c, c10::Device device);
// Each reward of the deck ([[reward]] entries, or the one [reward] table).
std::vector<rollout::RewardOptions> reward_options(const config::Config& c, c10::Device device);
rollout::SamplerOptions sampler_options(const config::Config& c);
// Pairs per training forward: GRPO trains each rollout micro-group as one
// micro-batch (rollout.microgroup, else train.micro_batch); NFT and SFT
// take train.micro_batch.
int64_t training_micro_batch(const config::Config& c);
rl::StepStrategyOptions strategy_options(const config::Config& c);
rl::AdvantageOptions advantage_options(const config::Config& c);
rl::AlgorithmOptions algorithm_options(const config::Config& c);
rl::LrSchedule lr_schedule(const config::Config& c);
models::LatentGrid latent_grid(const config::Config& c);

}  // namespace ditrl::app
