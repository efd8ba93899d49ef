#pragma once

// Group-relative advantages from raw rewards (docs/algorithms.md §3.1).
//   A = R - mean;  A /= std + epsilon  (if std normalisation)
// mean/std per prompt group (G contiguous samples) or over the whole batch.
//
// Std convention: std_ddof = 0 is the population std (divide by N), which is
// what flow_grpo's PerPromptStatTracker computes with numpy and the default
// here ([train] std_ddof = 0); std_ddof = 1 is torch.std's unbiased N-1 that
// miles uses. Statistics are computed in float64 and the advantages returned
// in fp32. The clamp to adv_clip_max happens in the losses.

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ditrl::rl {

struct AdvantageOptions {
  int64_t group_size = 1;         // G = samples per prompt; rewards grouped contiguously
  bool std_normalization = true;  // forced off when G == 1 (a one-sample group has no spread)
  bool global_mean = false;       // subtract the batch mean instead of the group mean
  bool global_std = false;        // divide by the std of all raw rewards instead of the group's
  int64_t std_ddof = 0;           // 0 = population (flow_grpo), 1 = unbiased (torch.std)
  double epsilon = 1e-4;
};

// rewards: (P * G,) floating. Returns (P * G,) fp32 advantages.
at::Tensor group_advantages(const at::Tensor& rewards, const AdvantageOptions& options);

// clamp(A, -adv_clip_max, +adv_clip_max), as the losses apply it.
at::Tensor clamp_advantages(const at::Tensor& advantages, double adv_clip_max);

}  // namespace ditrl::rl
