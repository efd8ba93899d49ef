#pragma once

// The names a deck gives a reward's kind, its analytic function, what a
// reward server reads, and how several rewards become one advantage
// (docs/rewards.md). Parsed once, when the deck is read (config/schema.hpp).

#include <ditrl/name_table.hpp>

namespace ditrl::rollout {

enum class RewardKind { Analytic, TorchScript, Command, Http };

inline constexpr NameTable<RewardKind, 4> kRewardKindNames{{{"analytic", RewardKind::Analytic},
                                                            {"torchscript", RewardKind::TorchScript},
                                                            {"command", RewardKind::Command},
                                                            {"http", RewardKind::Http}}};

enum class AnalyticFunction { TargetPattern, Brightness, Smoothness };

inline constexpr NameTable<AnalyticFunction, 3> kAnalyticNames{{{"target_pattern", AnalyticFunction::TargetPattern},
                                                                {"brightness", AnalyticFunction::Brightness},
                                                                {"smoothness", AnalyticFunction::Smoothness}}};

// What an http reward sends a server: the final latents, or the RGB the
// deck's decoder module makes of them on the run's device.
enum class RewardInput { Latents, Images };

inline constexpr NameTable<RewardInput, 2> kRewardInputNames{
    {{"latents", RewardInput::Latents}, {"images", RewardInput::Images}}};

// Several rewards: the advantage of their weighted sum, or the weighted sum
// of each reward's own group advantage (every reward normalised within its
// prompt group first, so a reward with a wide range does not drown the rest).
enum class RewardCombine { WeightedSum, NormalizedSum };

inline constexpr NameTable<RewardCombine, 2> kRewardCombineNames{
    {{"weighted_sum", RewardCombine::WeightedSum}, {"normalized_sum", RewardCombine::NormalizedSum}}};

}  // namespace ditrl::rollout
