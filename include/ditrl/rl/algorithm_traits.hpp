#pragma once

// The training objectives (docs/algorithms.md) and what the rest of a run
// must know of one before it exists. Header-only: the deck reader
// (config/) parses train.loss into Loss and checks its rules with these
// traits; rl/algorithm.hpp builds the algorithm itself.

#include <ditrl/name_table.hpp>

namespace ditrl::rl {

enum class Loss { Grpo, Nft, Sft };

inline constexpr NameTable<Loss, 3> kLossNames{{{"grpo", Loss::Grpo}, {"nft", Loss::Nft}, {"sft", Loss::Sft}}};

struct AlgorithmTraits {
  bool sde_rollout = true;         // rollouts take SDE steps (else they sample with the ODE alone)
  bool microgroup_batches = true;  // micro-batches are rollout micro-groups: the training forward
                                   // repeats a rollout forward (and parity dumps have a train side)
  bool kl_term = false;            // a KL term to the reference model, weighted by train.kl_beta
  bool ema_old_policy = false;     // keeps an EMA copy of the trainable masters as its old policy
};

// make_algorithm (rl/algorithm.hpp) and this are the only places that look at the loss.
constexpr AlgorithmTraits algorithm_traits(Loss loss) {
  switch (loss) {
    case Loss::Grpo:
      return {/*sde_rollout=*/true, /*microgroup_batches=*/true, /*kl_term=*/true, /*ema_old_policy=*/false};
    case Loss::Nft:
      return {/*sde_rollout=*/false, /*microgroup_batches=*/false, /*kl_term=*/false, /*ema_old_policy=*/true};
    case Loss::Sft:
      return {/*sde_rollout=*/false, /*microgroup_batches=*/false, /*kl_term=*/false, /*ema_old_policy=*/false};
  }
  return {};
}

// Whether the algorithm holds a copy of the trainable masters: an EMA old
// policy, or the KL reference of a full fine-tune (a LoRA run's reference is
// the base with the adapters off, which costs nothing).
constexpr bool copies_masters(Loss loss, double kl_beta, bool lora) {
  const AlgorithmTraits t = algorithm_traits(loss);
  return t.ema_old_policy || (t.kl_term && kl_beta > 0 && !lora);
}

}  // namespace ditrl::rl
